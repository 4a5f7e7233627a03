"""Durable Streams subscriptions over HTTP (``/v1/stream/__ds/...``) and their delivery: webhook
POSTs signed with Ed25519 (keys published as a JWKS), and pull-wake events.

The rules are :mod:`token_relay.core.durablesubs`'; this module reads the requests, answers
them in the protocol's shapes, and delivers each :class:`~token_relay.core.durablesubs.Wake`:

* a **webhook** wake is POSTed as JSON, with ``Webhook-Signature:
  t=<unix seconds>,kid=<key id>,ed25519=<base64url signature of "t.body">``. An answer of
  ``{"done": true}`` acks the wake's snapshot. A POST that fails (no 2xx within
  ``--webhook-timeout``) is sent again after 1 s, doubling up to 60 s, with 20% jitter;
  meanwhile the subscription's status is ``failed``.
* a **pull-wake** wake appends one event per pending stream to its ``wake_stream`` (a JSON
  stream the application made; without it, nothing is written).

Where the subscriptions live is a :class:`SubscriptionState`'s: this process
(:class:`LocalSubscriptions`), or Redis, shared by every relay process
(:class:`~token_relay.brokers.redis.durablesubs.RedisSubscriptions`). Each operation holds
them (:meth:`SubscriptionState.hold`), applies the core's rules, and delivers what they say
once it lets them go. The signing key is the state's (made once; in Redis, by the first
process, for all): receivers pick the key by the ``kid`` of each signature, from
``GET /v1/stream/__ds/jwks.json``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import random
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol
from urllib.parse import unquote

from ..core.durablesubconfig import config_of, glob_match
from ..core.durablesubs import Held, Select, Subscription, Subscriptions, TailOf, Wake
from ..core.errors import StreamRefused, SubscriptionError
from .http import HttpRequest, Reply

__all__ = [
    "CONTROL_PREFIX",
    "MAX_SUBSCRIPTIONS",
    "HttpPoster",
    "LocalSubscriptions",
    "SigningKey",
    "SubscriptionEndpoints",
    "SubscriptionState",
]

log = logging.getLogger("token_relay")

CONTROL_PREFIX = "__ds/"
"""Where the protocol's control APIs are, under the streams' root (no stream is there)."""
MAX_SUBSCRIPTIONS = 1000
"""Subscriptions there may be (on every process that shares them); one more ``PUT`` gets 507
(``TOO_MANY_SUBSCRIPTIONS``)."""
RETRY_FIRST = 1.0
RETRY_MOST = 60.0
RETRY_JITTER = 0.2
JWKS_TYPE = "application/jwk-set+json"

_SUBSCRIPTION = re.compile(r"subscriptions/([^/]+)(?:/(streams|callback|claim|ack|release))?(/.*)?")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class SigningKey:
    """The webhook signing key, Ed25519 (``cryptography`` is imported when the first one is
    made): made from ``private`` (32 bytes), or new."""

    def __init__(self, private: bytes | None = None) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        self._private = (
            Ed25519PrivateKey.generate()
            if private is None
            else Ed25519PrivateKey.from_private_bytes(private)
        )
        public = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.x = _b64url(public)
        self.kid = "ds_" + _b64url(hashlib.sha256(public).digest()[:12])

    def jwks(self) -> dict[str, object]:
        """The public key as a JWK Set."""
        key = {"kty": "OKP", "crv": "Ed25519", "kid": self.kid, "use": "sig", "alg": "EdDSA"}
        return {"keys": [{**key, "x": self.x}]}

    def signature(self, body: bytes, now: int) -> str:
        """``Webhook-Signature`` for ``body`` sent at ``now`` (Unix seconds)."""
        signed = self._private.sign(f"{now}.".encode() + body)
        return f"t={now},kid={self.kid},ed25519={_b64url(signed)}"


def _all(subscription: Subscription) -> bool:
    return True


class SubscriptionState(Protocol):
    """Where the subscriptions live: in this process, or shared by every relay process
    (:class:`~token_relay.brokers.redis.durablesubs.RedisSubscriptions`)."""

    async def keys(self) -> tuple[bytes, bytes]:
        """The Ed25519 signing key's private bytes and the wake tokens' HMAC key."""
        ...

    async def any(self) -> bool:
        """Whether there may be a subscription (False: none to look at)."""
        ...

    def surely_none(self) -> bool:
        """Whether it is known, without asking anyone, that :meth:`any` would say False
        and do nothing else (each append asks this first)."""
        ...

    async def paths(self) -> list[str]:
        """The stream-root-relative paths of every live stream."""
        ...

    def hold(
        self, paths: Iterable[str] = (), select: Select = _all
    ) -> AbstractAsyncContextManager[Held]:
        """The subscriptions, for one operation: their changes are kept when it ends
        without an exception. The tails known are those of ``paths`` and of every stream
        linked to a subscription ``select`` takes."""
        ...


class LocalSubscriptions:
    """The subscriptions of this process."""

    def __init__(self, tail_of: TailOf, paths: Callable[[], list[str]]) -> None:
        self._keys = (secrets.token_bytes(32), secrets.token_bytes(32))
        self._tail_of = tail_of
        self._paths = paths
        self._held = Held(
            Subscriptions(
                key=self._keys[1],
                new_id=lambda: secrets.token_hex(8),
                limit=MAX_SUBSCRIPTIONS,
            ),
            {},
            tail_of,
        )

    async def keys(self) -> tuple[bytes, bytes]:
        return self._keys

    async def any(self) -> bool:
        return bool(self._held.core.subscriptions)

    def surely_none(self) -> bool:
        return not self._held.core.subscriptions

    async def paths(self) -> list[str]:
        return self._paths()

    @asynccontextmanager
    async def hold(self, paths: Iterable[str] = (), select: Select = _all) -> AsyncIterator[Held]:
        yield self._held


Post = Callable[[str, bytes, dict[str, str]], Awaitable[tuple[int, bytes]]]
"""POST a body with headers to a URL: its status and body (raises on a network failure)."""
MAX_ANSWER_BYTES = 64 * 1024
"""What is read of a webhook's answer (``{"done": true}`` is short)."""


class HttpPoster:
    """Webhook POSTs over one aiohttp session (made on first use), never following
    redirects (a redirect could lead past the URL's check), each within ``timeout``."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._session: Any = None

    async def __call__(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        async with self._session.post(
            url, data=body, headers=headers, allow_redirects=False
        ) as response:
            return response.status, await response.content.read(MAX_ANSWER_BYTES)

    async def close(self) -> None:
        """Close the session, if one was made."""
        if self._session is not None:
            await self._session.close()
            self._session = None


class SubscriptionEndpoints:
    """The subscriptions' control APIs, and their delivery."""

    def __init__(
        self,
        *,
        state: SubscriptionState,
        append_wake: Callable[[str, bytes], None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        post: Post,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.append_wake = append_wake
        """Append a JSON body to a wake stream (by its stream-root-relative path)."""
        self.spawn = spawn
        self.post = post
        self.clock = clock
        self._key: SigningKey | None = None

    async def key(self) -> SigningKey:
        """The signing key (the state's: the same on every process that shares it)."""
        if self._key is None:
            self._key = SigningKey((await self.state.keys())[0])
        return self._key

    # ------------------------------------------------------------------ requests

    async def serve(self, method: str, control: str, request: HttpRequest, body: bytes) -> Reply:
        """A request on ``/v1/stream/__ds/{control}``."""
        base = f"{request.scheme}://{request.header('host') or 'localhost'}/v1/stream/"
        try:
            if control == "jwks.json" and method in ("GET", "HEAD"):
                return Reply(
                    200,
                    json.dumps((await self.key()).jwks()).encode(),
                    JWKS_TYPE,
                    (("Cache-Control", "public, max-age=300"),),
                )
            match = _SUBSCRIPTION.fullmatch(control)
            if match is None:
                raise SubscriptionError(404, "NOT_FOUND", "no such control API")
            subscription_id, action, rest = match.groups()
            return await self._subscription(
                method, subscription_id, action, rest, request, body, base
            )
        except SubscriptionError as exc:
            return error_reply(exc)

    async def _subscription(
        self,
        method: str,
        subscription_id: str,
        action: str | None,
        rest: str | None,
        request: HttpRequest,
        body: bytes,
        base: str,
    ) -> Reply:
        key = await self.key()
        only: Select = lambda subscription: subscription.id == subscription_id  # noqa: E731
        if action is None and rest is None:
            if method == "PUT":
                config = config_of(body)
                pattern = config.pattern
                paths = [
                    path
                    for path in (await self.state.paths() if pattern is not None else [])
                    if pattern is not None and glob_match(pattern, path)
                ]
                async with self.state.hold([*paths, *(config.streams or ())], only) as held:
                    subscription, created = held.core.put(
                        subscription_id, config, self.clock(), paths, held.tail_of
                    )
                    held.bases.setdefault(subscription_id, base)
                    described = self.describe(held, subscription, key)
                await self._wake_linked(subscription_id, only)
                return _json(201 if created else 200, described)
            if method == "GET":
                async with self.state.hold((), only) as held:
                    described = self.describe(held, held.core.get(subscription_id), key)
                return _json(200, described)
            if method == "DELETE":
                async with self.state.hold((), only) as held:
                    held.core.delete(subscription_id)
                    held.bases.pop(subscription_id, None)
                return Reply(204, b"")
            raise SubscriptionError(405, "METHOD_NOT_ALLOWED", "PUT, GET or DELETE")
        if action == "streams":
            if method == "POST" and rest is None:
                given = _object(body).get("streams")
                if not isinstance(given, list) or not all(
                    isinstance(path, str) and path for path in given
                ):
                    raise SubscriptionError(400, "INVALID_REQUEST", "streams is a list of paths")
                async with self.state.hold(given, only) as held:
                    held.core.add_streams(subscription_id, given, held.tail_of)
                await self._wake_linked(subscription_id, only)
                return Reply(204, b"")
            if method == "DELETE" and rest:
                async with self.state.hold((), only) as held:
                    held.core.remove_stream(subscription_id, unquote(rest[1:]))
                return Reply(204, b"")
            raise SubscriptionError(405, "METHOD_NOT_ALLOWED", "POST, or DELETE .../streams/PATH")
        if method != "POST" or rest is not None:
            raise SubscriptionError(405, "METHOD_NOT_ALLOWED", f"{action} takes POST")
        if action == "claim":
            worker = _object(body).get("worker")
            if not isinstance(worker, str) or not worker or len(worker) > 256:
                raise SubscriptionError(400, "INVALID_REQUEST", "worker is 1 to 256 characters")
            async with self.state.hold((), only) as held:
                wake = held.core.claim(subscription_id, worker, self.clock(), held.tail_of)
                lease = held.core.get(subscription_id).config.lease_ttl_ms
            return _json(
                200,
                {
                    "wake_id": wake.wake_id,
                    "generation": wake.generation,
                    "token": wake.token,
                    "streams": list(wake.streams),
                    "lease_ttl_ms": lease,
                },
            )
        token = _bearer(request)
        request_body = _object(body)
        next_wake = False
        async with self.state.hold((), only) as held:
            if action == "release":
                following = held.core.release(
                    subscription_id, token, request_body, self.clock(), held.tail_of
                )
            else:
                next_wake, following = held.core.ack(
                    subscription_id, token, request_body, self.clock(), held.tail_of
                )
            bases = dict(held.bases)
        self._deliver([following], bases)
        if action == "release":
            return Reply(204, b"")
        return _json(200, {"ok": True, "next_wake": next_wake})

    async def _wake_linked(self, subscription_id: str, only: Select) -> None:
        """Wake a subscription that streams were just linked to, if they have data past
        their link: an append through another process, between the tails read and the
        link written, saw no subscription to wake."""
        async with self.state.hold((), only) as held:
            wake = held.core.wake(subscription_id, self.clock(), held.tail_of)
            bases = dict(held.bases)
        self._deliver([wake], bases)

    def describe(
        self, held: Held, subscription: Subscription, key: SigningKey
    ) -> dict[str, object]:
        """A subscription as ``GET`` returns it."""
        config = subscription.config
        base = held.bases.get(subscription.id, "/v1/stream/")
        webhook: dict[str, object] | None = None
        if config.webhook is not None:
            signing = {"alg": "ed25519", "kid": key.kid, "jwks_url": base + "__ds/jwks.json"}
            webhook = {"url": config.webhook.url, "signing": signing}
        created = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(subscription.created_at))
        return {
            "id": subscription.id,
            "subscription_id": subscription.id,
            "type": config.type,
            "pattern": config.pattern,
            "streams": [
                {key: row[key] for key in ("path", "link_type", "acked_offset")}
                for row in subscription.snapshot(held.tail_of)
            ],
            "webhook": webhook,
            "wake_stream": config.wake_stream,
            "lease_ttl_ms": config.lease_ttl_ms,
            "created_at": f"{created}.{int(subscription.created_at * 1000) % 1000:03d}Z",
            "status": "failed" if subscription.failed else "active",
            "description": config.description,
        }

    # ------------------------------------------------------------------ streams

    def quiet(self) -> bool:
        """Whether there is surely no subscription: no append concerns one."""
        return self.state.surely_none()

    async def appended(self, path: str, before: int) -> None:
        """A stream got data: wake what it concerns."""
        if not await self.state.any():
            return

        def concerned(subscription: Subscription) -> bool:
            pattern = subscription.config.pattern
            return path in subscription.links or (
                pattern is not None
                and path != subscription.config.wake_stream
                and glob_match(pattern, path)
            )

        async with self.state.hold([path], concerned) as held:
            wakes = held.core.appended(path, before, self.clock(), held.tail_of)
            bases = dict(held.bases)
        self._deliver(wakes, bases)

    async def deleted(self, path: str) -> None:
        """A stream is gone."""
        if not await self.state.any():
            return
        nothing: Select = lambda subscription: False  # noqa: E731
        async with self.state.hold((), nothing) as held:
            held.core.deleted(path)

    async def tick(self) -> None:
        """Retries and leases that are due."""
        if not await self.state.any():
            return
        busy: Select = lambda subscription: (  # noqa: E731
            subscription.current is not None or subscription.retry_at is not None
        )
        async with self.state.hold((), busy) as held:
            wakes = held.core.due(self.clock(), held.tail_of)
            bases = dict(held.bases)
        self._deliver(wakes, bases)

    # ------------------------------------------------------------------ delivery

    def _deliver(self, wakes: Sequence[Wake | None], bases: dict[str, str]) -> None:
        for wake in wakes:
            if wake is None:
                continue
            if wake.url is not None:
                self.spawn(self._post(wake, bases.get(wake.subscription_id, "/v1/stream/")))
            elif wake.wake_stream is not None:
                events = [
                    {
                        "type": "wake",
                        "subscription_id": wake.subscription_id,
                        "stream": path,
                        "generation": wake.generation,
                        "ts": int(self.clock() * 1000),
                    }
                    for path in wake.pending
                ]
                self.append_wake(wake.wake_stream, json.dumps(events).encode())

    async def _post(self, wake: Wake, base: str) -> None:
        """POST a webhook wake; what its answer means is the core's."""
        assert wake.url is not None
        body = json.dumps(
            {
                "subscription_id": wake.subscription_id,
                "wake_id": wake.wake_id,
                "generation": wake.generation,
                "streams": list(wake.streams),
                "callback_url": f"{base}__ds/subscriptions/{wake.subscription_id}/callback",
                "callback_token": wake.token,
            }
        ).encode()
        headers = {
            "Content-Type": "application/json",
            "Webhook-Signature": (await self.key()).signature(body, int(self.clock())),
        }
        done, failed = False, False
        try:
            status, answer = await self.post(wake.url, body, headers)
            failed = not 200 <= status < 300
            if not failed:
                try:
                    done = json.loads(answer or b"{}").get("done") is True
                except (ValueError, AttributeError):
                    done = False
        except (OSError, TimeoutError, ValueError) as exc:
            failed = True
            log.warning("webhook for subscription %s failed: %s", wake.subscription_id, exc)
        except Exception as exc:  # aiohttp's errors, without importing it here
            failed = True
            log.warning("webhook for subscription %s failed: %s", wake.subscription_id, exc)
        only: Select = lambda subscription: subscription.id == wake.subscription_id  # noqa: E731
        try:
            async with self.state.hold((), only) as held:
                core = held.core
                following = core.delivered(wake, done, self.clock(), held.tail_of, failed=failed)
                if failed:
                    subscription = core.subscriptions.get(wake.subscription_id)
                    attempts = subscription.attempts if subscription is not None else 1
                    delay = min(RETRY_MOST, RETRY_FIRST * 2 ** (attempts - 1))
                    delay *= 1 + random.uniform(-RETRY_JITTER, RETRY_JITTER)
                    core.retry(wake.subscription_id, self.clock() + delay)
                bases = dict(held.bases)
        except StreamRefused as exc:
            log.warning(
                "webhook answer for subscription %s not kept: %s", wake.subscription_id, exc.message
            )
            return
        self._deliver([following], bases)


def error_reply(exc: StreamRefused) -> Reply:
    """A refused control request: ``{"error": {"code": …, "message": …}}``."""
    details = exc.details if isinstance(exc, SubscriptionError) else {}
    body = {"error": {"code": exc.code, "message": exc.message, **details}}
    return _json(exc.status, body)


def _json(status: int, value: object) -> Reply:
    return Reply(status, json.dumps(value).encode(), "application/json")


def _object(body: bytes) -> dict[str, object]:
    try:
        value = json.loads(body or b"{}")
    except (ValueError, RecursionError):
        raise SubscriptionError(400, "INVALID_REQUEST", "the body is not JSON") from None
    if not isinstance(value, dict):
        raise SubscriptionError(400, "INVALID_REQUEST", "the body is a JSON object")
    return value


def _bearer(request: HttpRequest) -> str:
    scheme, _, value = request.header("authorization").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""
