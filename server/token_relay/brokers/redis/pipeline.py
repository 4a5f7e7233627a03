"""The write pipeline: one queue of writes, sent in order by one writer task in pipelines,
and the resync of messages whose writes failed."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio.connection import AbstractConnection

from ...core.codec import encode_parts_snapshot
from ...core.errors import BrokerUnavailable, id_in_use
from .. import BrokerListener, WebhookStore, note_not_queued
from .connections import COMMAND_TIMEOUT, DOWN, Connections
from .health import Health
from .outbox import Outbox
from .packing import packed_together
from .partlog import log_value
from .replies import NOT_ENOUGH_DATA, buffered, push_type
from .writes import Held, Runs, Target, Write, progress_write, resync_write, taken

__all__ = ["MAX_BATCH", "MAX_BROKEN_LOGS", "MAX_DIRTY", "MAX_QUEUE", "Pipeline"]

MAX_QUEUE = 100_000
"""Writes waiting for Redis, at most."""
MAX_BATCH = 1000
"""Writes sent in one pipeline, at most."""
MAX_BROKEN_LOGS = 10_000
"""Structured messages remembered as having a broken log, at most (see ``broken_logs``)."""
MAX_DIRTY = 10_000
"""Messages marked for a resync before those no longer in progress here are forgotten (see
:meth:`Pipeline.mark_dirty`)."""
OUTBOX_RETRY = 1.0
"""Seconds after a write of the outbox failed before the outbox is tried again, whether or
not Redis was seen to go away (a write that timed out on a Redis that still answers PING)."""


class Pipeline:
    """The queue of writes and the writer that sends them.

    A failed write of a message marks it dirty; its next delta, or Redis coming back,
    rewrites its whole text instead (:meth:`resync`).
    """

    def __init__(
        self, connections: Connections, health: Health, outbox: Outbox, text_ttl: int
    ) -> None:
        self._connections = connections
        self._health = health
        self._outbox = outbox
        self._text_ttl = text_ttl
        self.listener: BrokerListener | None = None
        self.webhooks: WebhookStore | None = None
        self.queue: deque[Write] = deque()
        """Writes waiting for the writer, at most :data:`MAX_QUEUE`."""
        self.held = Held()
        """The characters of text the queued writes and those in flight carry, at most
        :data:`~.writes.MAX_QUEUE_CHARS` (the write that crosses it is the last taken)."""
        self._waiting: asyncio.Future[None] | None = None
        """The writer's, while it waits for a write to be queued."""
        self.runs = Runs(self.held)
        """The queued delta writes the next deltas of their messages join."""
        self.last: Write | None = None
        """The write queued last, while it waits in the queue."""
        self.dirty: set[Target] = set()
        """Messages whose text in Redis may be behind: resynced before their next delta.
        Marked with :meth:`mark_dirty`, which keeps it within twice the messages in progress
        here (or :data:`MAX_DIRTY`)."""
        self._dirty_bound = MAX_DIRTY
        self.broken_logs: set[Target] = set()
        """Structured messages a log entry of which failed or was not queued: their log is
        cut by their next entry (see :mod:`.partlog`), forgotten at their terminal write,
        at most :data:`MAX_BROKEN_LOGS` (past it, the set starts again)."""
        self._writer: AbstractConnection | None = None
        """The writer's connection: its pipelines are timed as a whole (see
        :meth:`execute`), not reply by reply."""
        self._writes_since = 0
        """The outages the writer's connection has been renewed after."""
        self.drain_outbox: Callable[[], None] | None = None
        """Queue the outbox's frames again (the broker's): after a batch that went through,
        and :data:`OUTBOX_RETRY` after one of its frames failed."""
        self._retry: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ queueing

    def full(self) -> bool:
        """No write may be queued now: Redis is not healthy, or the queue is full."""
        held = self.held
        return not self._health.healthy or len(self.queue) >= MAX_QUEUE or held.chars >= held.limit

    def has_room(self) -> bool:
        """The queue is not full, in writes or in characters (whether or not Redis is
        healthy)."""
        held = self.held
        return len(self.queue) < MAX_QUEUE and held.chars < held.limit

    def enqueue(self, write: Write, target: Target) -> bool:
        """Queue a write of ``target``'s; if it can't be, mark the message for a resync."""
        held = self.held
        if not self._health.healthy or len(self.queue) >= MAX_QUEUE or held.chars >= held.limit:
            self.mark_dirty(target)
            return False
        self.put(write)
        return True

    def put(self, write: Write) -> None:
        """Queue a write; any but a delta (or a log entry) ends every run (see :class:`Runs`).
        Past :data:`MAX_QUEUE` writes or :data:`~.writes.MAX_QUEUE_CHARS` it is refused with
        :class:`BrokerUnavailable` (callers look at :meth:`full` first)."""
        queue, held = self.queue, self.held
        if len(queue) >= MAX_QUEUE or held.chars >= held.limit:
            raise BrokerUnavailable("the queue of writes to Redis is full")
        if write.script != "delta" and write.script != "part":
            self.runs.close()
        queue.append(write)
        held.chars += write.chars
        self.last = write
        waiting = self._waiting
        if waiting is not None:
            self._waiting = None
            if not waiting.done():
                waiting.set_result(None)

    async def flush_writes(self) -> None:
        """Wait until every write queued so far has been executed (or has failed)."""
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.full():
            return
        self.put(progress_write(("", "", ""), 0, done))
        with contextlib.suppress(BrokerUnavailable, TimeoutError):
            await asyncio.wait_for(done, 5)

    # ------------------------------------------------------------------ resync

    def mark_dirty(self, target: Target) -> None:
        """Mark a message for a resync. Once :attr:`dirty` reaches its bound, the messages
        in it no longer in progress here are forgotten (a resync of one would forget it
        too: there is nothing of it here to rewrite), and the bound becomes twice what is
        left, at least :data:`MAX_DIRTY`: the set stays within twice the messages in
        progress here, each pass over it paid for by as many marks."""
        dirty = self.dirty
        dirty.add(target)
        if len(dirty) < self._dirty_bound:
            return
        listener = self.listener
        if listener is not None:
            for marked in list(dirty):
                _, owner, message_id = marked
                if (
                    listener.partial(owner, message_id) is None
                    and listener.live_parts(owner, message_id) is None
                ):
                    dirty.discard(marked)
        self._dirty_bound = max(MAX_DIRTY, 2 * len(dirty))

    def resync(self, target: Target) -> None:
        """Rewrite a message's whole text to Redis and send it as a snapshot."""
        if self.listener is None:
            return
        channel, owner, message_id = target
        text = self.listener.partial(owner, message_id)
        if text is None:
            structured = self.listener.live_parts(owner, message_id)
            if structured is None:
                self.dirty.discard(target)
                return
            if self.full():
                return
            # A structured message: its log rewritten as its compacted catch-up (which
            # rebuilds its parts), whole again, and that catch-up sent as its snapshot.
            so_far, chunks = structured
            self.dirty.discard(target)
            self.broken_logs.discard(target)
            snapshot = encode_parts_snapshot(channel, message_id, so_far, chunks)
            self.put(resync_write(target, log_value(chunks), self._text_ttl, snapshot))
            return
        if self.full():
            return
        self.dirty.discard(target)
        self.put(resync_write(target, text, self._text_ttl))

    def resync_all(self) -> None:
        """After an outage, rewrite every message in progress here (Redis may have lost them)."""
        if self.listener is not None:
            self.dirty.update(self.listener.owned_messages())
        for target in list(self.dirty):
            self.resync(target)

    # ------------------------------------------------------------------ the writer

    async def write_forever(self) -> None:
        """Take the queue's writes in batches of at most :data:`MAX_BATCH`, send each batch
        as one pipeline, and settle each write with its reply."""
        queue, loop = self.queue, asyncio.get_running_loop()
        while not self._health.closing:
            if not queue:
                waiting = self._waiting = loop.create_future()
                await waiting
                continue
            batch = [queue.popleft() for _ in range(min(len(queue), MAX_BATCH))]
            self.runs.close()  # taken: no delta joins these any more
            self.last = None
            batch = [taken(write) for write in batch]
            try:
                results = await self.execute(batch)
            except asyncio.CancelledError:
                raise
            except (*DOWN, redis_errors.RedisError) as exc:
                self._health.suspect()
                results = [BrokerUnavailable(str(exc))] * len(batch)
            self._settle_all(batch, results)

    def _settle_all(self, batch: list[Write], results: list[Any]) -> None:
        kept_back = any_failed = False
        for write, result in reversed(list(zip(batch, results, strict=True))):
            if isinstance(result, Exception) and write.deferred is not None:
                self._outbox.put_back(write.deferred)  # in order, for the next try
                kept_back = True
        settled = 0
        for n, (write, result) in enumerate(zip(batch, results, strict=True)):
            settled += write.chars
            if write.script in ("terminal", "whole") and isinstance(result, list):
                # The frame; whether its webhook was queued; a third value if the frame
                # had been published already (its reply lost): nothing was done again.
                frame, queued, again = result[0], result[1], len(result) > 2
                if (
                    write.webhook is not None
                    and not queued
                    and not again
                    and self.webhooks is not None
                ):
                    note_not_queued(self.webhooks, *write.webhook)
                results[n] = result = frame
            failed = isinstance(result, Exception)
            any_failed = any_failed or failed
            if failed and write.message is not None:
                self.mark_dirty(write.message)
                if write.script == "part":
                    self.log_broken(write.message)
            if write.claim is not None and result == 0 and self.listener is not None:
                self.listener.on_claim_refused(*write.claim)
            if write.done is not None and not write.done.done():
                if failed:
                    write.done.set_exception(BrokerUnavailable(str(result)))
                elif write.terminal is not None:
                    self._settle(write.done, write.terminal, result)
                else:
                    write.done.set_result(result)
        self.held.chars -= settled  # what the batch carried is no longer held
        self._outbox_next(kept_back, any_failed)

    def _outbox_next(self, kept_back: bool, failed: bool) -> None:
        """Publish the outbox's frames once Redis takes writes again: at once after a batch
        that went through; after :data:`OUTBOX_RETRY` if some of them failed again. (Redis
        coming back after an outage drains it too.)"""
        if not self._outbox or self.drain_outbox is None:
            return
        if kept_back:
            if self._retry is None:
                loop = asyncio.get_running_loop()
                self._retry = loop.call_later(OUTBOX_RETRY, self._retry_outbox)
        elif not failed and self._health.healthy:
            self.drain_outbox()

    def _retry_outbox(self) -> None:
        self._retry = None
        if self._outbox and self.drain_outbox is not None and self._health.healthy:
            self.drain_outbox()

    def log_broken(self, target: Target) -> None:
        """A structured message's log in Redis misses an entry: cut it with the next."""
        if len(self.broken_logs) >= MAX_BROKEN_LOGS:
            self.broken_logs.clear()
        self.broken_logs.add(target)

    def _settle(self, done: asyncio.Future[Any], target: Target, frame: bytes | int) -> None:
        """A terminal write ran: its frame, or 0 when another owner held the id."""
        self.dirty.discard(target)
        self.broken_logs.discard(target)
        if isinstance(frame, int):
            channel, _, message_id = target
            done.set_exception(id_in_use(channel, message_id))
        else:
            done.set_result(frame.decode())

    async def execute(self, batch: list[Write]) -> list[Any]:
        """Run the writes as one pipeline, under one deadline: a reply's own timeout (a
        timer per reply) would cost more than the script that sent it.

        The commands go out as one packed write on the writer's connection and the replies
        are read in order, each error reply in its place: what redis-py's pipeline does,
        without its Python per command and per pipeline (its command stack, response
        callbacks, retries and observability hooks), which cost more than the relay's own
        work per message. Nothing is retried here: a write that fails is answered
        ``broker_unavailable`` (a final) or resynced (deltas), as the writer's loop says.
        """
        writes = self._connections.writes
        if writes is None:
            raise BrokerUnavailable("the broker is not started")
        if self._writes_since != self._health.outages:
            # Its connection may lead to a Redis that is gone (a restarted one does not
            # know it): a write on it would fail once Redis is back. It reconnects on use.
            self._writes_since = self._health.outages
            await writes.disconnect()
        connection = self._writer
        if connection is None:
            async with asyncio.timeout(COMMAND_TIMEOUT):
                connection = self._writer = await writes.get_connection()  # type: ignore[no-untyped-call]
        shas = self._connections.shas
        commands = [
            ("EVALSHA", shas[write.script], len(write.keys), *write.keys, *write.args)
            for write in batch
        ]
        results: list[Any] = []
        async with asyncio.timeout(COMMAND_TIMEOUT):
            # On the deadline redis-py drops the connection it was reading (the replies
            # left on it would answer the next pipeline) and the writes count as failed.
            packed = packed_together(commands) or connection.pack_commands(commands)
            await connection.send_packed_command(packed, check_health=False)
            for _ in commands:
                results.append(await _reply(connection))
        if any(isinstance(r, redis_errors.NoScriptError) for r in results):
            await self._connections.load_scripts()
            retry = [
                w
                for w, r in zip(batch, results, strict=True)
                if isinstance(r, redis_errors.NoScriptError)
            ]
            again = iter(await self.execute(retry))
            results = [
                next(again) if isinstance(r, redis_errors.NoScriptError) else r for r in results
            ]
        return results


async def _reply(connection: AbstractConnection) -> Any:
    """The next reply on the writer's connection, an error reply as its exception: taken
    from what the connection has read already (a pipeline's replies come in a burst; see
    :mod:`.replies`), or else read through redis-py."""
    gets = buffered(connection)
    reply = NOT_ENOUGH_DATA if gets is None else gets()
    if reply is not NOT_ENOUGH_DATA:
        if isinstance(reply, redis_errors.ResponseError):
            return reply
        if isinstance(reply, Exception):
            raise reply  # the connection broke, as redis-py's read raises it
        push = push_type(connection)
        if push is None or not isinstance(reply, push):
            return reply
        # A RESP3 push amid the replies (a server's notice): redis-py's handling, as its
        # read would, then the reply after it.
        parser: Any = connection._parser
        await parser.handle_push_response(reply)
    try:
        return await connection.read_response()
    except redis_errors.ResponseError as exc:
        return exc
