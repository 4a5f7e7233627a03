"""The facade: :class:`RedisBroker`, the broker contract over the parts that do the work
(see the package's docstring for the theory of operation)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from ...core.errors import BrokerUnavailable, ErrorCode
from ...core.events import CatchUp
from ...core.sessions import SessionState
from ...core.settings import Settings
from .. import BrokerListener, WebhookStore
from ..filters import webhook_filter
from .catchup import CatchUps
from .connections import Connections
from .health import Health
from .leases import Leases
from .outbox import Deferred, Outbox
from .partlog import chunk_entry, delta_entry
from .pipeline import Pipeline
from .reader import Reader
from .requests import Requests
from .sessions import Sessions
from .webhooks import RedisWebhooks
from .writes import (
    CLAIMED,
    OPENED_HERE,
    Target,
    Write,
    delta_write,
    make_whole,
    meta_write,
    open_write,
    part_write,
    progress_write,
    terminal_write,
    whole_write,
)

__all__ = ["RedisBroker"]


class RedisBroker:
    """A broker shared by relay processes through one Redis server."""

    shares_sessions = True
    """Producer sessions live in Redis: a producer resumes on any process."""

    def __init__(self, url: str, settings: Settings, instance: str) -> None:
        self.url = url
        self.instance = instance
        self.settings = settings
        self._text_ttl = max(1, int(settings.idle_timeout * 2))
        self._wants_webhook = webhook_filter(settings)
        self._connections = Connections(url)
        self._health = Health()
        self._outbox = Outbox()
        self._pipeline = Pipeline(self._connections, self._health, self._outbox, self._text_ttl)
        self._pipeline.drain_outbox = self._drain_outbox
        # The pipeline's own runs and dirty set, at hand for the publish path (one lookup).
        self._runs = self._pipeline.runs
        self._dirty = self._pipeline.dirty
        self._reader = Reader(self._connections, self._health, instance)
        self._requests = Requests(self._connections, self._health, instance)
        self._reader.requests = self._requests
        self._catch_ups = CatchUps(self._connections, self._health, settings)
        self._sessions = Sessions(
            self._connections, self._health, self._pipeline, instance, self._text_ttl
        )
        self._leases = Leases(
            self._connections,
            self._health,
            self._pipeline,
            settings,
            instance,
            self._terminal,
            self._requests.reap,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._restoring: asyncio.Future[None] | None = None
        """The registrations for chat requests being made again after an outage."""
        self.webhooks: WebhookStore | None = (
            RedisWebhooks(settings, instance, self._connections.client, self._connections.run)
            if settings.webhooks
            else None
        )
        self._pipeline.webhooks = self.webhooks

    # ------------------------------------------------------------------ lifecycle

    @property
    def healthy(self) -> bool:
        """A fact about Redis, probed: it answers PING and the pub/sub connection is up.

        A failed command does not clear it; it only makes the next probe come at once.
        """
        return self._health.healthy

    async def start(self, listener: BrokerListener) -> None:
        """Connect (if Redis is up) and start the reader, writer and probe tasks."""
        self._pipeline.listener = self._reader.listener = self._requests.listener = listener
        self._connections.open()
        connected = asyncio.get_running_loop().create_future()
        self._tasks = [
            asyncio.create_task(self._reader.read_forever(connected, self._restored)),
            asyncio.create_task(self._pipeline.write_forever()),
            asyncio.create_task(self._health.probe_forever(self._connections)),
            asyncio.create_task(self._leases.lease_forever()),
        ]
        # Serve at once either way: if Redis is down, readiness says so and the
        # reader keeps retrying in the background.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(connected), 3)

    async def close(self) -> None:
        """Stop the tasks and disconnect."""
        self._health.closing = True
        # A cancel that lands while a library's own timeout fires can be swallowed by it:
        # cancel again until every task has ended (each loop also checks closing).
        for _ in range(50):
            pending = [task for task in self._tasks if not task.done()]
            if not pending:
                break
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=0.1)
        self._tasks = []
        await self._reader.close()
        await self._connections.close()
        self._health.up = self._health.listening = False

    async def flush(self) -> None:
        """Wait until a marker published now comes back: pub/sub keeps order on one connection."""
        await self._reader.flush()

    async def ready(self) -> bool:
        """Ping Redis."""
        return await self._connections.ready()

    def _restored(self) -> None:
        """Redis is back after an outage: publish the outbox, resync every message in
        progress here, and tell the listener."""
        self._drain_outbox()
        self._pipeline.resync_all()
        self._restoring = asyncio.ensure_future(self._requests.restore())
        if self._pipeline.listener is not None:
            self._pipeline.listener.on_restored()

    # ------------------------------------------------------------------ events out

    def open(self, channel: str, owner: str, message_id: str, seq: int = 0) -> bool:
        """Claim the id and register the message as in progress, with empty text.

        Always True here: the claim is settled in Redis, in order with the message's
        deltas (which are dropped there if the claim failed), and a refused claim is
        reported to :meth:`BrokerListener.on_claim_refused`.
        """
        target = (channel, owner, message_id)
        write = open_write(target, seq, self._text_ttl)
        if self._pipeline.enqueue(write, target):
            self._runs.opened(target, write, "", seq)  # its first deltas join it: one script
        return True

    def delta(
        self,
        channel: str,
        owner: str,
        message_id: str,
        delta: str,
        seq: int = 0,
        claimed: bool = True,
    ) -> None:
        """Append to the message's text in Redis and publish the delta frame."""
        target = (channel, owner, message_id)
        if target in self._dirty:
            self._pipeline.resync(target)
            return
        if self._runs.join(target, delta, seq):
            return
        write = delta_write(target, delta, seq, claimed, self._text_ttl)
        if self._pipeline.enqueue(write, target):
            self._runs.opened(target, write, delta, seq)

    def deltas(
        self, channel: str, owner: str, message_id: str, deltas: Sequence[str], count: int
    ) -> None:
        """Each non-empty delta as :meth:`delta` takes it (claimed, unnumbered)."""
        for delta in deltas:
            if delta:
                self.delta(channel, owner, message_id, delta)

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
        """Add to a structured message's log in Redis (see :mod:`.partlog`), and publish
        ``live`` as a ``chunks`` frame, in one script. ``convert`` (``1``, ``0``) if the
        message becomes structured here."""
        target = (channel, owner, message_id)
        if target in self._dirty and live is not None:
            # A write of it failed: its log and its subscribers are made whole again (what
            # this event did included), as a plain message's text is.
            self._pipeline.resync(target)
            if target in self._dirty:  # not queued: its log misses this entry
                self._pipeline.log_broken(target)
            return
        logged = delta_entry(entry) if isinstance(entry, str) else chunk_entry(entry)
        broken = self._pipeline.broken_logs
        if target in broken:
            # An entry of it failed or was not queued: its log misses it, so it is cut.
            broken.discard(target)
            convert = "x"
        elif self._runs.join_entry(target, logged, seq, live):
            return
        write = part_write(target, logged, seq, True, convert, self._text_ttl)
        if self._pipeline.enqueue(write, target):
            self._runs.opened_log(target, write, logged, seq, live)
        else:
            self._pipeline.log_broken(target)

    def progress(self, channel: str, owner: str, message_id: str, seq: int) -> None:
        """Note the seq of an event that carried no text, so a resume elsewhere knows it."""
        target = (channel, owner, message_id)
        self._pipeline.enqueue(progress_write(target, seq), target)

    def meta(self, channel: str, owner: str, message_id: str, meta: str) -> None:
        """Keep a message's merged metadata for a process that takes its session over."""
        self._pipeline.enqueue(meta_write(owner, message_id, meta), (channel, owner, message_id))

    def _terminal(
        self,
        target: Target,
        body: str,
        done: asyncio.Future[Any] | None,
        seq: int = 0,
        aborted: bool = False,
        strict: int = 0,
        producer: str = "",
    ) -> Write:
        """The TERMINAL write of ``target``'s frame (its webhook queued if one takes it)."""
        channel, _, _ = target
        webhook = self._wants_webhook(channel)  # False without --webhook
        return terminal_write(
            self.settings, webhook, target, body, done, seq, aborted, strict, producer
        )

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
    ) -> asyncio.Future[str]:
        """Queue the terminal write now, in order; the future ends once Redis ran it: the
        frame given its offset, added to history and published, atomically (and its
        webhook queued)."""
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        pipeline = self._pipeline
        if pipeline.full():
            done.set_exception(BrokerUnavailable("Redis is unreachable"))
            return done
        target = (channel, owner, message_id)
        opening = self._runs.completes(target, pipeline.last)
        # Joined to its open (WHOLE), the claim is checked in the same script; a message
        # that opened with events of its own is never taken for a whole one sent again.
        strict = (CLAIMED if opening is None else OPENED_HERE) if claimed else 0
        write = self._terminal(target, body, done, seq, aborted, strict, producer)
        write.terminal = target
        if opening is None:
            pipeline.put(write)
            return done
        # Nothing of the message reached Redis yet, and nothing was queued after its open:
        # the open, its deltas and the terminal frame go as one script, in the open's place.
        make_whole(opening, write, target)
        pipeline.held.chars += write.chars  # the frame, now in the queued open's place
        self._runs.close()
        return done

    def whole(
        self,
        channel: str,
        owner: str,
        message_id: str,
        text: str,
        body: str,
        producer: str = "",
    ) -> asyncio.Future[str] | None:
        """Queue a one-shot message as one script (``WHOLE``, nothing kept per owner); the
        future ends as :meth:`terminal`'s does. None if no write can be queued now."""
        pipeline = self._pipeline
        if pipeline.full():
            return None
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        target = (channel, owner, message_id)
        webhook = self._wants_webhook(channel)
        pipeline.put(whole_write(self.settings, webhook, target, text, body, done, producer))
        return done

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
        """Publish a terminal frame as soon as Redis takes it: now, or once it is back.

        Frames wait in an outbox of at most :data:`~.outbox.MAX_OUTBOX` frames and
        :data:`~.outbox.MAX_OUTBOX_BYTES`, published in the order they came; past either
        the oldest is dropped, and logged.
        """
        self._outbox.add(Deferred(channel, owner, message_id, body, seq, aborted, producer))
        if self.healthy:
            self._drain_outbox()

    def _drain_outbox(self) -> None:
        outbox, pipeline = self._outbox, self._pipeline
        while outbox and pipeline.has_room():
            deferred = outbox.take()
            target = (deferred.channel, deferred.owner, deferred.message_id)
            write = self._terminal(
                target,
                deferred.body,
                None,
                deferred.seq,
                deferred.aborted,
                producer=deferred.producer,
            )
            write.deferred = deferred
            pipeline.put(write)

    @property
    def outbox(self) -> int:
        """Terminal frames waiting for Redis."""
        return len(self._outbox)

    def memory_bytes(self) -> int:
        """Characters this process holds for the broker: the outbox's frames, and the text
        the writes queued for Redis (and in flight) carry."""
        return self._outbox.bytes + self._pipeline.held.chars

    async def cancel(self, channel: str, message_id: str, frame: str) -> int:
        """Publish the cancel to each process owning the message; count those that got it."""
        return await self._reader.cancel(channel, message_id, frame)

    async def take_requests(self, channel: str, owner: str, taking: bool) -> None:
        """Register or unregister a local owner for ``channel``'s chat requests."""
        await self._requests.take(channel, owner, taking)

    async def hand_request(self, channel: str, payload: str) -> ErrorCode | None:
        """Hand a chat request to the newest owner registered for ``channel``."""
        return await self._requests.hand(channel, payload)

    # ------------------------------------------------------------------ sessions

    async def save_session(self, token: str, owner: str, grant: str) -> None:
        """Record a new session, so that any process can take it over."""
        await self._sessions.save(token, owner, grant)

    async def take_session(self, token: str, grant: str, owner: str) -> SessionState | None:
        """Move a session to ``owner`` on this process; None if there is none to take.

        The process that had it is told, so it lets go of it without aborting anything.
        """
        return await self._sessions.take(token, grant, owner)

    async def end_session(self, token: str, owner: str) -> None:
        """Forget a session that ended here (its aborts are already published)."""
        await self._sessions.end(token, owner)

    async def leave(self) -> None:
        """Hand this process's sessions over: the others abort what no producer resumes
        within ``--session-grace`` (reason ``shutdown``)."""
        await self._pipeline.flush_writes()
        await self._leases.leave()

    async def flush_writes(self) -> None:
        """Wait until every write queued so far has been executed (or has failed)."""
        await self._pipeline.flush_writes()

    # ------------------------------------------------------------------ events in

    async def listen(self, channel: str, messages: bool, deltas: bool) -> None:
        """Subscribe to exactly the topics this process needs for ``channel``."""
        await self._reader.listen(channel, messages, deltas)

    async def catch_up(
        self, channel: str, since: tuple[int, str] | None, live: bool, rewind: int = 0
    ) -> CatchUp:
        """Read the channel's cut in one script."""
        return await self._catch_ups.catch_up(channel, since, live, rewind)
