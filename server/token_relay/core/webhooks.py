"""Webhooks: what is sent for each completed or aborted message, and when. Pure: no I/O.

Theory of operation
-------------------
Every terminal frame of a channel the webhooks take (``--webhook-channel``) becomes one
:class:`WebhookEntry` in the broker's outbox, atomically with its offset. The edge's
dispatcher takes entries from the outbox and hands them to an :class:`Outbox`, which
decides what to POST when:

* each URL is its own **lane** per channel: a lane sends its entries one at a time, in
  offset order, and an entry waits until the one before it succeeded or died;
* at most ``concurrency`` POSTs are in flight across all lanes;
* a failed POST is retried after ``backoff * 2**(attempts-1)`` seconds (at most
  :data:`MAX_BACKOFF`), drawn in [half, all] of that (jitter), until ``max_age`` seconds
  after the message completed; a POST that fails after that is a **dead letter**;
* an entry is settled (removed from the broker's outbox) once every URL's lane is done
  with it.

The body is :class:`WebhookPayload` as JSON, the same for every attempt, and the
``webhook-id`` (:func:`webhook_id`) depends on the channel, epoch and offset only, so a
receiver dedupes retries and redeliveries by it.

A webhook URL's userinfo and query often hold the receiver's key: logs and error texts show
it as :func:`loggable_url` gives it, never whole.
"""

from __future__ import annotations

import base64
import collections
import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, JsonValue

from .grants import Grant

__all__ = [
    "MAX_BACKOFF",
    "DeadLetter",
    "Delivery",
    "Outbox",
    "WebhookEntry",
    "WebhookPayload",
    "backoff_delay",
    "identity",
    "loggable_url",
    "scrubbed",
    "webhook_id",
]

IDENTITIES_KEPT = 1024
"""Producer identities kept encoded, the most recently used (each a few hundred bytes)."""
MAX_BACKOFF = 300.0
"""Seconds between two attempts at most."""


class WebhookPayload(BaseModel):
    """The JSON body POSTed for a completed (``message``) or aborted message."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["message", "aborted"]
    channel: str
    id: str
    text: str
    parts: list[dict[str, JsonValue]] | None = None
    """A structured message's parts, as its frame has them; absent for a plain one."""
    meta: dict[str, JsonValue]
    reason: str | None = None
    """Why it was aborted (``aborted`` only)."""
    offset: int
    epoch: str
    producer: dict[str, JsonValue] | None = None
    """The producer's token identity (``role`` and ``channels``) when the relay has a
    secret; absent when it runs open."""


class DeadLetter(BaseModel):
    """A message one webhook URL never took within ``--webhook-max-age``."""

    webhook_id: str
    url: str
    attempts: int
    error: str
    """What the last attempt got: an HTTP status, a timeout, or a network error."""
    completed_at: float
    """Unix time the message completed."""
    died_at: float
    payload: WebhookPayload


def webhook_id(channel: str, epoch: str, offset: int) -> str:
    """The ``webhook-id`` of a channel's message: stable across retries and processes."""
    digest = hashlib.sha256(f"{channel}\x00{epoch}\x00{offset}".encode()).digest()
    return "msg_" + base64.urlsafe_b64encode(digest[:18]).decode()


def loggable_url(url: str) -> str:
    """A URL as logs show it: scheme, host, port and path, without userinfo, query or
    fragment (they often hold the receiver's key)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def scrubbed(text: str) -> str:
    """``text`` (an exception's message) with every URL in it as :func:`loggable_url`
    gives it."""
    return _URL.sub(lambda match: loggable_url(match.group()), text)


@functools.lru_cache(maxsize=IDENTITIES_KEPT)
def identity(grant: Grant) -> str:
    """A producer's token identity as the outbox keeps it (JSON); the last
    :data:`IDENTITIES_KEPT` grants' are kept, as each final of a producer asks again."""
    return json.dumps({"role": grant.role.value, "channels": sorted(grant.channels)})


@dataclass(slots=True)
class WebhookEntry:
    """One message in the outbox."""

    key: str
    """The outbox's own id for it (a Redis stream id, or a counter)."""
    channel: str
    frame: str
    """The terminal frame as subscribers got it (with ``offset`` and ``epoch``)."""
    producer: str
    """The producer's identity (JSON), or "" without auth."""
    completed: float
    """Unix time the message completed."""
    url: str = ""
    """Only this URL (a revived dead letter); "" for every one."""
    payload: WebhookPayload = field(init=False)
    id: str = field(init=False)
    body: bytes = field(init=False)
    size: int = field(init=False)

    def __post_init__(self) -> None:
        frame: dict[str, Any] = json.loads(self.frame)
        self.payload = WebhookPayload(
            type=frame["type"],
            channel=frame["channel"],
            id=frame["id"],
            text=frame["text"],
            parts=frame.get("parts"),
            meta=frame.get("meta") or {},
            reason=frame.get("reason"),
            offset=frame["offset"],
            epoch=frame["epoch"],
            producer=json.loads(self.producer) if self.producer else None,
        )
        self.id = webhook_id(self.channel, self.payload.epoch, self.payload.offset)
        self.body = self.payload.model_dump_json(exclude_none=True).encode()
        # Bytes (UTF-8), as --webhook-max-pending-bytes says and as the Redis outbox counts
        # them (Lua's string.len), so that settling takes off what adding put on.
        self.size = len(self.frame.encode()) + len(self.producer.encode())


def backoff_delay(attempts: int, backoff: float, jitter: float) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones; ``jitter`` in [0, 1)."""
    ceiling = min(MAX_BACKOFF, backoff * 2.0 ** max(0, attempts - 1))
    return float(ceiling / 2 + jitter * ceiling / 2)


@dataclass(slots=True)
class Delivery:
    """One entry on its way to one URL."""

    entry: WebhookEntry
    url: str
    attempts: int = 0
    due: float = 0.0
    """Monotonic time of the next attempt."""
    error: str = ""

    @property
    def lane(self) -> tuple[str, str]:
        return self.url, self.entry.channel


class Outbox:
    """Which POST goes out when: lanes, retries, concurrency and dead letters."""

    def __init__(
        self, urls: tuple[str, ...], *, concurrency: int, backoff: float, max_age: float
    ) -> None:
        self.urls = urls
        self.concurrency = concurrency
        self.backoff = backoff
        self.max_age = max_age
        self._lanes: dict[tuple[str, str], collections.deque[Delivery]] = {}
        self._flying: set[tuple[str, str]] = set()
        self._left: dict[str, int] = {}
        """Each entry held, and how many URLs still owe it."""

    def __len__(self) -> int:
        return len(self._left)

    @property
    def in_flight(self) -> int:
        return len(self._flying)

    def add(self, entry: WebhookEntry, now: float) -> None:
        """Queue an entry for every URL (or its one URL), behind its channel's earlier ones."""
        if entry.key in self._left:
            return  # taken twice (read again after a lease moved): once is enough
        urls = [entry.url] if entry.url else list(self.urls)
        self._left[entry.key] = len(urls)
        for url in urls:
            delivery = Delivery(entry, url, due=now)
            self._lanes.setdefault(delivery.lane, collections.deque()).append(delivery)

    def due(self, now: float) -> list[Delivery]:
        """The POSTs to start now: each idle lane's first entry, if it is due, up to the
        concurrency left. Each is in flight until :meth:`succeeded` or :meth:`failed`."""
        room = self.concurrency - len(self._flying)
        started: list[Delivery] = []
        if room <= 0:
            return started
        for lane, queue in self._lanes.items():
            if lane in self._flying or queue[0].due > now:
                continue
            self._flying.add(lane)
            started.append(queue[0])
            if len(started) == room:
                break
        return started

    def next_due(self) -> float | None:
        """When the next idle lane's first entry is due, if any lane is idle."""
        times = [q[0].due for lane, q in self._lanes.items() if lane not in self._flying]
        return min(times, default=None)

    def succeeded(self, delivery: Delivery) -> WebhookEntry | None:
        """The POST got a 2xx; returns the entry if every URL is now done with it."""
        return self._done(delivery)

    def failed(
        self, delivery: Delivery, error: str, now: float, wall: float, jitter: float
    ) -> tuple[Literal["retry", "dead"], WebhookEntry | None]:
        """The POST failed. A retry is scheduled, or, past ``max_age`` since the message
        completed (``wall``, Unix time), it is dead; the entry comes back if every URL is
        now done with it."""
        delivery.attempts += 1
        delivery.error = error
        self._flying.discard(delivery.lane)
        left = delivery.entry.completed + self.max_age - wall
        if left <= 0:
            return "dead", self._done(delivery)
        delivery.due = now + min(left, backoff_delay(delivery.attempts, self.backoff, jitter))
        return "retry", None

    def clear(self) -> None:
        """Forget everything (another process delivers the outbox now)."""
        self._lanes.clear()
        self._flying.clear()
        self._left.clear()

    def _done(self, delivery: Delivery) -> WebhookEntry | None:
        lane = delivery.lane
        self._flying.discard(lane)
        queue = self._lanes.get(lane)
        if not queue or queue[0] is not delivery:
            return None  # cleared meanwhile
        queue.popleft()
        if not queue:
            del self._lanes[lane]
        key = delivery.entry.key
        self._left[key] -= 1
        if self._left[key] > 0:
            return None
        del self._left[key]
        return delivery.entry
