"""The in-process broker (``memory://``): one relay process, nothing shared.

Everything happens synchronously inside each call, so events reach the
listener in call order and a catch-up can never race an event. History lives
in a :class:`~token_relay.core.history.HistoryStore` and is lost with the process, which
is why every channel's epoch is new after a restart.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.codec import encode_chunks
from ..core.errors import ErrorCode, FrameRejected, id_in_use
from ..core.events import CatchUp, Delta, FrameKind, LiveMessage
from ..core.history import HistoryStore
from ..core.inflight import InflightIndex
from ..core.protocol import with_position
from ..core.sessions import SessionState
from ..core.settings import Settings
from ..core.webhooks import DeadLetter, WebhookEntry
from . import BrokerListener, Published, WebhookStore, note_not_queued
from .filters import webhook_filter

__all__ = ["MemoryBroker", "MemoryWebhooks", "revived_frame"]

log = logging.getLogger(__name__)


class MemoryWebhooks:
    """The webhook outbox in this process's memory: what is in it when the process dies
    is lost (SIGTERM first delivers it, for up to ``--shutdown-timeout``)."""

    active = True
    """One process: it always delivers."""

    def __init__(self, settings: Settings) -> None:
        self.max_pending = settings.webhook_max_pending
        self.max_bytes = settings.webhook_max_pending_bytes
        self.max_dead = settings.webhook_max_dead
        self.max_dead_bytes = settings.webhook_max_dead_bytes
        self.not_queued = 0
        self._queue: collections.deque[WebhookEntry] = collections.deque()
        self._taken: dict[str, WebhookEntry] = {}
        self._bytes = 0
        self._dead: collections.deque[tuple[DeadLetter, int]] = collections.deque()
        """Newest first, each with its size (bytes of its JSON, as Redis counts them)."""
        self._dead_bytes = 0
        self._keys = 0
        self._arrived: asyncio.Event | None = None

    @property
    def depth(self) -> int:
        return len(self._queue) + len(self._taken)

    @property
    def dead_count(self) -> int:
        return len(self._dead)

    @property
    def dead_bytes(self) -> int:
        return self._dead_bytes

    @property
    def held_bytes(self) -> int:
        """Characters held: the outbox's frames and the dead letters."""
        return self._bytes + self._dead_bytes

    def add(self, channel: str, frame: str, producer: str, now: float, url: str = "") -> bool:
        """Queue a message; False (counted, logged) if the outbox is full."""
        self._keys += 1
        entry = WebhookEntry(str(self._keys), channel, frame, producer, now, url)
        if self.depth >= self.max_pending or self._bytes + entry.size > self.max_bytes:
            note_not_queued(self, channel, entry.payload.id)
            return False
        self._queue.append(entry)
        self._bytes += entry.size
        if self._arrived is not None:
            self._arrived.set()
        return True

    async def take(self, limit: int, wait: float) -> list[WebhookEntry]:
        """What is queued, up to ``limit``; waits up to ``wait`` for something."""
        if limit <= 0:
            return []
        if not self._queue and wait > 0:
            self._arrived = self._arrived or asyncio.Event()
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), wait)
            except TimeoutError:
                return []
        taken: list[WebhookEntry] = []
        while self._queue and len(taken) < limit:
            entry = self._queue.popleft()
            self._taken[entry.key] = entry
            taken.append(entry)
        return taken

    async def settle(self, entry: WebhookEntry) -> None:
        if self._taken.pop(entry.key, None) is not None:
            self._bytes -= entry.size

    async def bury(self, letter: DeadLetter) -> int:
        size = len(letter.model_dump_json().encode())
        if size > self.max_dead_bytes:
            return 1  # alone over the bound: dropped at once, the others kept
        self._dead.appendleft((letter, size))
        self._dead_bytes += size
        dropped = 0
        while len(self._dead) > self.max_dead or self._dead_bytes > self.max_dead_bytes:
            _, lost = self._dead.pop()
            self._dead_bytes -= lost
            dropped += 1
        return dropped

    async def dead(self) -> list[DeadLetter]:
        return [letter for letter, _ in self._dead]

    async def revive(self) -> int:
        revived = 0
        while self._dead:
            letter, size = self._dead[-1]  # oldest first, so a channel's order holds
            frame, producer = revived_frame(letter)
            if not self.add(letter.payload.channel, frame, producer, time.time(), letter.url):
                break  # the outbox is full: the rest stay dead letters
            self._dead.pop()
            self._dead_bytes -= size
            revived += 1
        return revived

    async def release(self) -> None:
        """Nothing to hand over."""


def revived_frame(letter: DeadLetter) -> tuple[str, str]:
    """The frame and producer identity a dead letter's entry is queued again with."""
    frame = letter.payload.model_dump_json(exclude={"producer"}, exclude_none=True)
    producer = letter.payload.producer
    return frame, json.dumps(producer) if producer is not None else ""


class MemoryBroker:
    """A broker for a single relay process."""

    def __init__(self, settings: Settings, instance: str = "local") -> None:
        self.instance = instance
        self.history = HistoryStore(
            size=settings.history_size,
            ttl=settings.history_ttl,
            max_channels=settings.max_history_channels,
        )
        self.inflight: InflightIndex[str] = InflightIndex(hold=settings.id_hold)
        self._seq = 0
        self._listener: BrokerListener | None = None
        self.webhooks: WebhookStore | None = MemoryWebhooks(settings) if settings.webhooks else None
        self._wants_webhook = webhook_filter(settings)
        self._takers: dict[str, dict[str, None]] = {}
        """Per channel, the owners that take its chat requests, oldest first."""

    @property
    def healthy(self) -> bool:
        """Always: nothing to reach."""
        return True

    def memory_bytes(self) -> int:
        """Characters this process holds for the broker: every channel's history (what
        has outlived ``--history-ttl`` is dropped first), the webhook outbox and the dead
        letters."""
        self.history.expire(time.monotonic())
        webhooks = self.webhooks
        held = webhooks.held_bytes if isinstance(webhooks, MemoryWebhooks) else 0
        return self.history.bytes + held

    async def start(self, listener: BrokerListener) -> None:
        """Start delivering events to ``listener``."""
        self._listener = listener

    async def close(self) -> None:
        """Stop delivering events."""
        self._listener = None

    async def listen(self, channel: str, messages: bool, deltas: bool) -> None:
        """Nothing to do: every event is handed to the listener, which filters locally."""

    def open(self, channel: str, owner: str, message_id: str, seq: int = 0) -> bool:
        """Claim the id and index the message for snapshots and cancel."""
        return self.inflight.claim(channel, owner, message_id, time.monotonic())

    def delta(
        self,
        channel: str,
        owner: str,
        message_id: str,
        delta: str,
        seq: int = 0,
        claimed: bool = True,
    ) -> None:
        """Hand the delta frame straight to the listener, built only if someone wants it."""
        inflight = self.inflight
        if claimed:  # nearly every delta: its owner must hold the id, whatever the time
            if inflight.holder(channel, message_id) != owner:
                return  # another owner holds the id: nothing of this message is published
        elif not inflight.may_publish(channel, owner, message_id, False, time.monotonic()):
            return
        self._seq += 1
        listener = self._listener
        if listener is not None and listener.wants_deltas(channel):
            listener.on_delta(channel, self._seq, Delta(channel, message_id, delta))

    def deltas(
        self, channel: str, owner: str, message_id: str, deltas: Sequence[str], count: int
    ) -> None:
        """Each non-empty delta as :meth:`delta` takes it (claimed): the holder is asked
        once, and the frames are built only if someone wants them."""
        if self.inflight.holder(channel, message_id) != owner:
            return
        listener = self._listener
        if listener is not None and listener.wants_deltas(channel):
            for delta in deltas:
                if delta:
                    self._seq += 1
                    listener.on_delta(channel, self._seq, Delta(channel, message_id, delta))
        else:
            self._seq += count

    def terminal(
        self,
        channel: str,
        owner: str,
        message_id: str,
        body: str,
        seq: int = 0,
        aborted: bool = False,
        producer: str = "",
        claimed: bool = False,
    ) -> Published:
        """Number, record and deliver a terminal frame (and queue its webhook) now: the
        publication is over when this returns."""
        try:
            return Published(
                self._terminal(channel, owner, message_id, body, producer, claimed, aborted)
            )
        except FrameRejected as exc:
            return Published(error=exc)

    def whole(
        self,
        channel: str,
        owner: str,
        message_id: str,
        text: str,
        body: str,
        producer: str = "",
    ) -> Published:
        """A one-shot message: its delta (if any) and its terminal frame, as :meth:`delta`
        and :meth:`terminal` (neither claimed) publish them, now."""
        if text:
            self.delta(channel, owner, message_id, text, 0, False)
        return self.terminal(channel, owner, message_id, body, producer=producer)

    def defer(
        self,
        channel: str,
        owner: str,
        message_id: str,
        body: str,
        seq: int = 0,
        aborted: bool = False,
        producer: str = "",
    ) -> None:
        """Nothing to wait for: publish at once."""
        self._terminal(channel, owner, message_id, body, producer, aborted=aborted)

    def part(
        self,
        channel: str,
        owner: str,
        message_id: str,
        entry: Mapping[str, Any] | str,
        seq: int = 0,
        convert: str = "",
        live: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """Hand the ``chunks`` frame of ``live`` straight to the listener, built only if
        someone wants it; nothing to keep: sessions live in this process."""
        if live is None:
            return
        self._seq += 1
        listener = self._listener
        if listener is None or not listener.wants_deltas(channel):
            return
        if not self.inflight.may_publish(channel, owner, message_id, True, time.monotonic()):
            return  # another owner holds the id: nothing of this message is published
        listener.on_frame(
            channel, FrameKind.DELTA, self._seq, encode_chunks(channel, message_id, live)
        )

    def progress(self, channel: str, owner: str, message_id: str, seq: int) -> None:
        """Nothing to note: sessions live in this process."""

    def meta(self, channel: str, owner: str, message_id: str, meta: str) -> None:
        """Nothing to note: sessions live in this process."""

    shares_sessions = False
    """Sessions live in this process only."""

    async def save_session(self, token: str, owner: str, grant: str) -> None:
        """Nothing to save: sessions live in this process."""

    async def take_session(self, token: str, grant: str, owner: str) -> SessionState | None:
        """No session lives anywhere else."""
        return None

    async def end_session(self, token: str, owner: str) -> None:
        """Nothing to forget."""

    async def leave(self) -> None:
        """Nothing to hand over."""

    def _terminal(
        self,
        channel: str,
        owner: str,
        message_id: str,
        body: str,
        producer: str = "",
        claimed: bool = False,
        aborted: bool = False,
    ) -> str:
        now = time.monotonic()
        inflight = self.inflight
        if not inflight.may_publish(channel, owner, message_id, claimed, now):
            if not claimed and not aborted:
                # Another owner's message under the id ended within its hold. If it was
                # this very message (a whole one sent again: its answer was lost), it was
                # published once: the frame as it was, nothing done again.
                copy = inflight.published(channel, message_id, now)
                if isinstance(copy, tuple) and copy[0] == hash(body):
                    return with_position(body, copy[1], copy[2])
            raise id_in_use(channel, message_id)
        payload = self.history.record(
            channel, now, lambda offset, epoch: with_position(body, offset, epoch)
        )
        if aborted or not inflight.hold:
            inflight.end(channel, owner, message_id, now, completed=not aborted)
        else:
            # How it was published, for a copy of it sent again (above): a digest of the
            # frame (Python's keyed string hash), its offset and epoch.
            offset, epoch = self.history.last(channel)
            inflight.end(channel, owner, message_id, now, published=(hash(body), offset, epoch))
        webhooks = self.webhooks
        if isinstance(webhooks, MemoryWebhooks) and self._wants_webhook(channel):
            webhooks.add(channel, payload, producer, time.time())
        self._emit(channel, FrameKind.TERMINAL, payload)
        return payload

    async def catch_up(
        self, channel: str, since: tuple[int, str] | None, live: bool, rewind: int = 0
    ) -> CatchUp:
        """The channel's position, missed history (or its last ``rewind`` frames) and
        messages in progress, right now."""
        now = time.monotonic()
        log = self.history.position(channel, now)
        recovered: bool | None = None
        frames: list[str] = []
        ages: list[float] = []
        if since is not None:
            replay = log.replay(*since)
            recovered, frames = replay.recovered, replay.frames
        elif rewind:
            entries = log.rewind_entries(rewind)
            frames = [frame for _, _, frame in entries]
            ages = [now - recorded for _, recorded, _ in entries]
        messages: list[LiveMessage] = []
        if live and self._listener is not None:
            for owner, message_id in self.inflight.in_channel(channel):
                text = self._listener.partial(owner, message_id)
                if text is not None:
                    messages.append(LiveMessage(owner, message_id, text))
                    continue
                structured = self._listener.live_parts(owner, message_id)
                if structured is not None:
                    text, chunks = structured
                    messages.append(LiveMessage(owner, message_id, text, chunks))
        return CatchUp(log.offset, log.epoch, recovered, frames, self._seq, messages, ages)

    async def cancel(self, channel: str, message_id: str, frame: str) -> int:
        """Hand the cancel frame to every owner of the message."""
        owners = self.inflight.owners(channel, message_id)
        if self._listener is not None:
            for owner in owners:
                self._listener.on_cancel(owner, frame)
        return len(owners)

    async def take_requests(self, channel: str, owner: str, taking: bool) -> None:
        """Register or unregister ``owner`` for the chat requests of ``channel``."""
        takers = self._takers.setdefault(channel, {})
        takers.pop(owner, None)
        if taking:
            takers[owner] = None
        elif not takers:
            del self._takers[channel]

    async def hand_request(self, channel: str, payload: str) -> ErrorCode | None:
        """Hand the request to the newest owner registered for ``channel``."""
        listener = self._listener
        if listener is None:
            return ErrorCode.NO_PRODUCER
        for owner in reversed(list(self._takers.get(channel, ()))):
            code = listener.on_request(owner, channel, payload)
            if code is not ErrorCode.NO_PRODUCER:
                return code
        return ErrorCode.NO_PRODUCER

    async def ready(self) -> bool:
        """Always ready."""
        return True

    async def flush(self) -> None:
        """Nothing to wait for: events are delivered inside each call."""

    async def flush_writes(self) -> None:
        """Nothing to wait for: every write is made inside its call."""

    def _emit(self, channel: str, kind: FrameKind, payload: str) -> None:
        self._seq += 1
        if self._listener is not None:
            self._listener.on_frame(channel, kind, self._seq, payload)
