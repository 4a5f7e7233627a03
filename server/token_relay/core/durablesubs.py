"""Durable Streams subscriptions: durable cursors over streams, woken by webhook or pull-wake.

Theory of operation
-------------------
A subscription links streams, by a glob ``pattern`` over their stream-root-relative paths
(``*`` one segment, ``**`` any number) and by explicit ``streams``. Each link has an acked
offset: the subscription has pending work when a linked stream's tail is past it. A link
made when the subscription is created (or a stream added to it) starts at the stream's tail;
a stream that first matches by an append is linked at its tail *before* that append.

Pending work starts a **wake** when the subscription is idle (no wake in flight): the
generation goes up by one, the wake gets a new id, and its snapshot of the linked streams
(acked and tail offsets) is delivered, by a webhook POST or as an event appended to the
pull-wake ``wake_stream``. A wake holds a lease of ``lease_ttl_ms``: a webhook's from the
moment it is issued, a pull-wake's from the moment a worker claims it. Valid callbacks and
acks extend it; ``done`` (or a webhook answering ``{"done": true}``, which acks the
snapshot's tails) ends the wake, and so does a release or the lease running out. A wake
that ends with work still pending starts the next one.

Every callback, ack and release must carry the wake's token and name its id and generation:
anything else is ``FENCED`` (409) and changes nothing. Tokens are HMAC-signed with a key of
the process (:class:`Subscriptions` takes it), and name the subscription, generation and
wake.

The configuration's rules are :mod:`token_relay.core.durablesubconfig`'s. Nothing here does
I/O or reads a clock: each entry point takes ``now`` (seconds), and what
must be delivered comes back as :class:`Wake` values for the edge to send.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .durable import offset_text, position_of
from .durablesubconfig import (
    MAX_EXPLICIT_CHARS,
    MAX_EXPLICIT_STREAMS,
    MAX_TEXT,
    SubscriptionConfig,
    explicit_chars,
    glob_match,
)
from .errors import StreamRefused, SubscriptionError

__all__ = ["Held", "Select", "Subscription", "Subscriptions", "TailOf", "Wake", "dump", "load"]

TailOf = Callable[[str], int | None]
"""A stream's tail position by its stream-root-relative path, or None if there is none."""


@dataclass(slots=True)
class _Link:
    acked: int
    glob: bool = False
    explicit: bool = False

    @property
    def kind(self) -> str:
        return "explicit" if self.explicit else "glob"


@dataclass(frozen=True, slots=True)
class Wake:
    """A wake to deliver: by webhook (``url``) or as an event on ``wake_stream``."""

    subscription_id: str
    wake_id: str
    generation: int
    streams: tuple[dict[str, object], ...]
    """The snapshot: each linked stream's path, link type, acked and tail offsets."""
    token: str
    url: str | None = None
    wake_stream: str | None = None
    pending: tuple[str, ...] = ()
    """The paths with pending work (a pull-wake writes one event for each)."""


@dataclass(slots=True)
class _Current:
    wake: Wake
    lease_until: float | None
    """None: a pull-wake not claimed yet."""
    holder: str | None = None


@dataclass(slots=True)
class Subscription:
    """One subscription's configuration and cursor."""

    id: str
    config: SubscriptionConfig
    digest: str
    created_at: float
    links: dict[str, _Link] = field(default_factory=dict)
    generation: int = 0
    current: _Current | None = None
    failed: bool = False
    """A webhook delivery failed and is to be retried."""
    attempts: int = 0
    retry_at: float | None = None

    def pending(self, tail_of: TailOf) -> list[str]:
        """The linked paths whose tail is past their acked offset."""
        found = []
        for path, link in self.links.items():
            tail = tail_of(path)
            if tail is not None and tail > link.acked:
                found.append(path)
        return found

    def snapshot(self, tail_of: TailOf) -> tuple[dict[str, object], ...]:
        """Each linked stream as the protocol describes it to a worker."""
        rows = []
        for path, link in sorted(self.links.items()):
            tail = tail_of(path)
            rows.append(
                {
                    "path": path,
                    "link_type": link.kind,
                    "acked_offset": offset_text(link.acked),
                    "tail_offset": offset_text(link.acked if tail is None else tail),
                    "has_pending": tail is not None and tail > link.acked,
                }
            )
        return tuple(rows)


class Subscriptions:
    """Every subscription of one store of streams."""

    def __init__(self, *, key: bytes, new_id: Callable[[], str], limit: int) -> None:
        self.key = key
        """Signs wake tokens."""
        self.new_id = new_id
        self.limit = limit
        self.subscriptions: dict[str, Subscription] = {}

    def __len__(self) -> int:
        return len(self.subscriptions)

    # ------------------------------------------------------------------ configuration

    def put(
        self,
        subscription_id: str,
        config: SubscriptionConfig,
        now: float,
        paths: list[str],
        tail_of: TailOf,
    ) -> tuple[Subscription, bool]:
        """Create a subscription (True), or re-confirm one with the same configuration
        (False); 409 ``CONFLICT`` for another. ``paths`` are the streams there are now: the
        pattern's matches are linked at their tails."""
        existing = self.subscriptions.get(subscription_id)
        digest = config.digest()
        if existing is not None:
            if existing.digest != digest:
                raise SubscriptionError(
                    409, "CONFLICT", "a subscription with another configuration has this id"
                )
            return existing, False
        if len(self.subscriptions) >= self.limit:
            raise SubscriptionError(507, "TOO_MANY_SUBSCRIPTIONS", "no room for one more")
        subscription = Subscription(subscription_id, config, digest, now)
        pattern = config.pattern
        for path in paths:
            if (
                pattern is not None
                and self._may_link(subscription, path)
                and glob_match(pattern, path)
            ):
                subscription.links[path] = _Link(tail_of(path) or 0, glob=True)
        for path in config.streams or ():
            self._link_explicit(subscription, path, tail_of)
        self.subscriptions[subscription_id] = subscription
        return subscription, True

    def get(self, subscription_id: str) -> Subscription:
        """The subscription, or 404 ``NOT_FOUND``."""
        subscription = self.subscriptions.get(subscription_id)
        if subscription is None:
            raise SubscriptionError(404, "NOT_FOUND", f"no subscription {subscription_id!r}")
        return subscription

    def delete(self, subscription_id: str) -> None:
        """Forget it: its wake's callbacks, acks and releases are fenced from now on."""
        self.get(subscription_id)
        del self.subscriptions[subscription_id]

    def add_streams(self, subscription_id: str, paths: list[str], tail_of: TailOf) -> None:
        """Link streams explicitly, at their tails (again: nothing changes); all of them or,
        past :data:`MAX_EXPLICIT_STREAMS` (or :data:`MAX_EXPLICIT_CHARS` of paths), none."""
        subscription = self.get(subscription_id)
        new = {path for path in paths if path not in subscription.links}
        explicit = [path for path, link in subscription.links.items() if link.explicit]
        if (
            len(explicit) + len(new) > MAX_EXPLICIT_STREAMS
            or any(len(p) > MAX_TEXT for p in paths)
            or explicit_chars([*explicit, *paths]) > MAX_EXPLICIT_CHARS
        ):
            raise SubscriptionError(
                400,
                "INVALID_REQUEST",
                f"at most {MAX_EXPLICIT_STREAMS} explicit streams of {MAX_TEXT} characters, "
                f"{MAX_EXPLICIT_CHARS} in all",
            )
        for path in paths:
            self._link_explicit(subscription, path, tail_of)

    def remove_stream(self, subscription_id: str, path: str) -> None:
        """Remove an explicit link; a glob link of the same stream stays."""
        subscription = self.get(subscription_id)
        link = subscription.links.get(path)
        if link is None or not link.explicit:
            return
        link.explicit = False
        if not link.glob:
            del subscription.links[path]

    def _link_explicit(self, subscription: Subscription, path: str, tail_of: TailOf) -> None:
        link = subscription.links.get(path)
        if link is not None:
            link.explicit = True
            return
        explicit = sum(1 for link in subscription.links.values() if link.explicit)
        if explicit >= MAX_EXPLICIT_STREAMS:
            raise SubscriptionError(
                400, "INVALID_REQUEST", f"at most {MAX_EXPLICIT_STREAMS} explicit streams"
            )
        subscription.links[path] = _Link(tail_of(path) or 0, explicit=True)

    @staticmethod
    def _may_link(subscription: Subscription, path: str) -> bool:
        """A pull-wake never links its own wake stream (each wake event would wake it)."""
        return path != subscription.config.wake_stream

    # ------------------------------------------------------------------ streams

    def appended(self, path: str, before: int, now: float, tail_of: TailOf) -> list[Wake]:
        """A stream got data (it was at ``before``): link it where a pattern matches, and
        wake every idle subscription with work pending."""
        wakes = []
        for subscription in self.subscriptions.values():
            pattern = subscription.config.pattern
            if (
                pattern is not None
                and self._may_link(subscription, path)
                and glob_match(pattern, path)
            ):
                link = subscription.links.get(path)
                if link is None:
                    self._forget_gone(subscription, tail_of)
                    subscription.links[path] = _Link(before, glob=True)
                else:
                    link.glob = True
            if path in subscription.links:
                wake = self._wake_if_pending(subscription, now, tail_of)
                if wake is not None:
                    wakes.append(wake)
        return wakes

    def deleted(self, path: str) -> None:
        """A stream is gone: its glob links go; an explicit one stays, at the start, for a
        stream made again at that path."""
        for subscription in self.subscriptions.values():
            _unlink(subscription, path)

    @staticmethod
    def _forget_gone(subscription: Subscription, tail_of: TailOf) -> None:
        """Unlink, as :meth:`deleted` does, every linked stream that is gone without it being
        called (one expired at a lookup, or forgotten by Redis). Done before each new glob
        link, so a subscription's glob links never outnumber the streams there are (plus
        those gone since its last new link): a pattern over stream after stream, each made
        and let expire, holds no more."""
        for path in [path for path in subscription.links if tail_of(path) is None]:
            _unlink(subscription, path)

    def wake(self, subscription_id: str, now: float, tail_of: TailOf) -> Wake | None:
        """The wake the subscription starts if it is idle with work pending (a shared store
        asks again after linking streams: an append made meanwhile, through another process,
        found no subscription yet)."""
        subscription = self.subscriptions.get(subscription_id)
        if subscription is None:
            return None
        return self._wake_if_pending(subscription, now, tail_of)

    def _wake_if_pending(
        self, subscription: Subscription, now: float, tail_of: TailOf
    ) -> Wake | None:
        if subscription.current is not None or subscription.retry_at is not None:
            return None
        pending = subscription.pending(tail_of)
        if not pending:
            return None
        subscription.generation += 1
        wake_id = "w_" + self.new_id()
        config = subscription.config
        wake = Wake(
            subscription_id=subscription.id,
            wake_id=wake_id,
            generation=subscription.generation,
            streams=subscription.snapshot(tail_of),
            token=self._token(subscription.id, subscription.generation, wake_id),
            url=config.webhook.url if config.webhook is not None else None,
            wake_stream=config.wake_stream,
            pending=tuple(pending),
        )
        lease = now + config.lease_ttl_ms / 1000 if config.type == "webhook" else None
        subscription.current = _Current(wake, lease)
        return wake

    # ------------------------------------------------------------------ tokens

    def _token(self, subscription_id: str, generation: int, wake_id: str) -> str:
        claims = json.dumps([subscription_id, generation, wake_id]).encode()
        mac = hmac.new(self.key, claims, hashlib.sha256).digest()
        return _b64(claims) + "." + _b64(mac)

    def _fence(
        self, subscription_id: str, token: str, wake_id: object, generation: object
    ) -> tuple[Subscription, _Current]:
        """The subscription and its current wake, if the token and the request name it;
        409 ``FENCED`` otherwise (401 ``UNAUTHORIZED`` for a token that is not one)."""
        claims_text, _, mac_text = token.partition(".")
        claims, mac = _unb64(claims_text), _unb64(mac_text)
        if claims is None or mac is None:
            raise SubscriptionError(401, "UNAUTHORIZED", "a wake's token is required")
        if not hmac.compare_digest(hmac.new(self.key, claims, hashlib.sha256).digest(), mac):
            raise SubscriptionError(401, "UNAUTHORIZED", "this is not a wake's token")
        named = json.loads(claims)
        subscription = self.subscriptions.get(subscription_id)
        current = subscription.current if subscription is not None else None
        if (
            subscription is None
            or current is None
            or named != [subscription_id, current.wake.generation, current.wake.wake_id]
            or generation != current.wake.generation
            or wake_id != current.wake.wake_id
        ):
            raise SubscriptionError(409, "FENCED", "this wake is over")
        return subscription, current

    # ------------------------------------------------------------------ workers

    def delivered(
        self, wake: Wake, done: bool, now: float, tail_of: TailOf, failed: bool = False
    ) -> Wake | None:
        """A webhook POST of ``wake`` was answered: ``done`` acks the snapshot and ends the
        wake; a failure schedules a retry (the caller says when, with :meth:`retry`)."""
        subscription = self.subscriptions.get(wake.subscription_id)
        if subscription is None or subscription.current is None:
            return None
        if subscription.current.wake.wake_id != wake.wake_id:
            return None
        if failed:
            subscription.failed = True
            subscription.attempts += 1
            return None
        subscription.failed = False
        subscription.attempts = 0
        if not done:
            return None
        for row in wake.streams:
            link = subscription.links.get(str(row["path"]))
            if link is not None:
                link.acked = max(link.acked, position_of(str(row["tail_offset"])))
        subscription.current = None
        return self._wake_if_pending(subscription, now, tail_of)

    def ack(
        self,
        subscription_id: str,
        token: str,
        request: dict[str, object],
        now: float,
        tail_of: TailOf,
    ) -> tuple[bool, Wake | None]:
        """A callback (webhook) or ack (pull-wake): apply its acks, extend the lease, and
        with ``done`` end the wake. Returns whether another wake was started, and it."""
        subscription, current = self._fence(
            subscription_id, token, request.get("wake_id"), request.get("generation")
        )
        acks = request.get("acks") or []
        if not isinstance(acks, list):
            raise SubscriptionError(400, "INVALID_REQUEST", "acks is a list")
        moves: list[tuple[_Link, int]] = []
        for ack in acks:
            if not isinstance(ack, dict):
                raise SubscriptionError(400, "INVALID_REQUEST", "an ack is an object")
            link = subscription.links.get(str(ack.get("stream")))
            if link is None:
                raise SubscriptionError(400, "INVALID_REQUEST", "an ack names a linked stream")
            try:
                position = position_of(str(ack.get("offset")))
            except StreamRefused:
                raise SubscriptionError(400, "INVALID_REQUEST", "an ack's offset") from None
            tail = tail_of(str(ack.get("stream")))
            moves.append((link, min(position, tail if tail is not None else position)))
        for link, position in moves:
            link.acked = max(link.acked, position)
        lease = subscription.config.lease_ttl_ms / 1000
        if request.get("done") is True:
            subscription.current = None
            wake = self._wake_if_pending(subscription, now, tail_of)
            return wake is not None, wake
        current.lease_until = now + lease
        return False, None

    def claim(self, subscription_id: str, worker: str, now: float, tail_of: TailOf) -> Wake:
        """A pull-wake worker claims the subscription's wake (starting one if work is
        pending): 409 ``ALREADY_CLAIMED`` while another holds it, 404 ``NO_PENDING_WORK``
        when there is nothing to do."""
        subscription = self.get(subscription_id)
        if subscription.config.type != "pull-wake":
            raise SubscriptionError(400, "INVALID_REQUEST", "only a pull-wake is claimed")
        current = subscription.current
        if current is not None and current.holder is not None:
            raise SubscriptionError(
                409,
                "ALREADY_CLAIMED",
                "another worker holds this subscription",
                current_holder=current.holder,
                generation=current.wake.generation,
            )
        if current is None:
            self._wake_if_pending(subscription, now, tail_of)
            current = subscription.current
        if current is None:
            raise SubscriptionError(404, "NO_PENDING_WORK", "nothing is pending")
        current.holder = worker
        current.lease_until = now + subscription.config.lease_ttl_ms / 1000
        return current.wake

    def release(
        self,
        subscription_id: str,
        token: str,
        request: dict[str, object],
        now: float,
        tail_of: TailOf,
    ) -> Wake | None:
        """A worker gives its wake up without acking; pending work starts the next one."""
        subscription, _ = self._fence(
            subscription_id, token, request.get("wake_id"), request.get("generation")
        )
        subscription.current = None
        return self._wake_if_pending(subscription, now, tail_of)

    # ------------------------------------------------------------------ time

    def retry(self, subscription_id: str, at: float) -> None:
        """The failed webhook of the subscription's wake is sent again at ``at``."""
        subscription = self.subscriptions.get(subscription_id)
        if subscription is not None and subscription.current is not None:
            subscription.retry_at = at

    def due(self, now: float, tail_of: TailOf) -> list[Wake]:
        """What is due at ``now``: webhook retries (the same wake), and, for every lease
        that ran out, the wake it ends (and the next, if work is pending)."""
        wakes = []
        for subscription in self.subscriptions.values():
            current = subscription.current
            if subscription.retry_at is not None and now >= subscription.retry_at:
                subscription.retry_at = None
                if current is not None:
                    current.lease_until = now + subscription.config.lease_ttl_ms / 1000
                    wakes.append(current.wake)
                    continue
            if (
                current is not None
                and subscription.retry_at is None
                and current.lease_until is not None
                and now >= current.lease_until
            ):
                subscription.current = None
                wake = self._wake_if_pending(subscription, now, tail_of)
                if wake is not None:
                    wakes.append(wake)
        return wakes


@dataclass(slots=True)
class Held:
    """The subscriptions as one operation sees and changes them."""

    core: Subscriptions
    bases: dict[str, str]
    """Each subscription's base URL (``http://HOST/v1/stream/``, ``https`` behind a trusted
    proxy that says so), from its ``PUT``."""
    tail_of: TailOf


Select = Callable[[Subscription], bool]
"""Which subscriptions an operation looks at the linked streams of."""


def _unlink(subscription: Subscription, path: str) -> None:
    """The stream at ``path`` is gone: a glob link goes; an explicit one stays, at the start."""
    link = subscription.links.get(path)
    if link is None:
        return
    if link.explicit:
        link.acked, link.glob = 0, False
    else:
        del subscription.links[path]


def dump(subscription: Subscription) -> dict[str, Any]:
    """A subscription as plain JSON values (:func:`load` makes it again): a store shared
    by processes keeps it so."""
    current = subscription.current
    return {
        "id": subscription.id,
        "config": subscription.config.model_dump(mode="json"),
        "created_at": subscription.created_at,
        "links": {
            path: [link.acked, link.glob, link.explicit]
            for path, link in subscription.links.items()
        },
        "generation": subscription.generation,
        "current": None
        if current is None
        else {
            "wake": {**asdict(current.wake), "streams": list(current.wake.streams)},
            "lease_until": current.lease_until,
            "holder": current.holder,
        },
        "failed": subscription.failed,
        "attempts": subscription.attempts,
        "retry_at": subscription.retry_at,
    }


def load(data: dict[str, Any]) -> Subscription:
    """The subscription :func:`dump` gave."""
    config = SubscriptionConfig.model_validate(data["config"], strict=False)
    subscription = Subscription(data["id"], config, config.digest(), data["created_at"])
    subscription.links = {
        path: _Link(int(acked), bool(glob), bool(explicit))
        for path, (acked, glob, explicit) in data["links"].items()
    }
    subscription.generation = int(data["generation"])
    current = data["current"]
    if current is not None:
        wake = dict(current["wake"])
        wake["streams"] = tuple(wake["streams"])
        wake["pending"] = tuple(wake["pending"])
        subscription.current = _Current(Wake(**wake), current["lease_until"], current["holder"])
    subscription.failed = bool(data["failed"])
    subscription.attempts = int(data["attempts"])
    subscription.retry_at = data["retry_at"]
    return subscription


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes | None:
    """base64url without padding, or None."""
    if not text or not re.fullmatch(r"[A-Za-z0-9_-]+", text) or len(text) % 4 == 1:
        return None
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
