"""The producer endpoint: reads a producer's frames, applies them, publishes, answers.

Theory of operation
-------------------
Each producer connection works through a session of the core's
:class:`~token_relay.core.sessions.SessionTable`. The relay sends the session
token first thing. Frames are handled as they are read (see
:meth:`~token_relay.edge.websocket.WebSocket.dispatch`). A frame is validated,
charged to the session's rate bucket as a whole, and its events applied to the
session's message streams in order, each as it comes: deltas go to the broker
without waiting, and so does a completed message, whose publication the broker
settles later (Redis) or at once (memory). The producer's next events are applied
meanwhile; its replies wait in :class:`_Replies` until the ones before them are
sent, so acks and errors keep the order of its frames (at most
:data:`MAX_PENDING_REPLIES`, then the producer is not read). The finals of a
batch are acknowledged together. Every reply goes through the one
:class:`~token_relay.edge.writer.Writer`; a producer whose socket is full is not
read until it drains, which is each producer's backpressure.

When the connection ends, the table parks or ends the session; this module owns
the grace timers and publishes the aborts of whatever an ended session left
unfinished.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from typing import Any

from msgspec import DecodeError
from pydantic import MISSING
from websockets import CloseCode

from ..brokers import Broker, Publication, Published
from ..core.codec import (
    Event,
    FastEvent,
    ack_frame,
    acks_frame,
    decode_by_models,
    decode_fast,
    message_body,
    nests_too_deep,
    session_frame,
)
from ..core.errors import (
    BrokerUnavailable,
    ErrorCode,
    FrameRejected,
    binary_rejected,
    broker_rejected,
    id_in_use,
)
from ..core.events import Payload
from ..core.grants import Grant
from ..core.protocol import (
    MAX_JSON_DEPTH,
    Aborted,
    AbortReason,
    ProducerEvent,
    encode_unpositioned,
    error_frame,
)
from ..core.sessions import ProducerSession, SessionTable
from ..core.settings import Settings
from ..core.streams import Applied, Overflow, Phase, Unfinished
from ..core.surrogates import has_surrogate
from ..core.webhooks import identity
from .flow import loop_clock
from .httpproducer import AbortMessage, HttpProducer, Item
from .metrics import Metrics
from .peer import ProducerPeer
from .websocket import WebSocket
from .writer import Writer

__all__ = ["ProducerEndpoint", "Session"]

log = logging.getLogger("token_relay")

MEMORY_CHECK_SECONDS = 0.1
"""How stale the count of memory in use may be when a new message is let in."""

MAX_PENDING_REPLIES = 1024
"""Replies a producer connection may have waiting for the broker (one per final, error or
batch); past it, its frames are not read until half of them are sent (its backpressure, as
for a full socket)."""

Session = ProducerSession[ProducerPeer]


class _Stopped(Exception):
    """The relay is stopping, or the session moved to another connection: stop serving."""


async def _stop() -> None:
    raise _Stopped


class _Completion:
    """A final that completed a message: where it is, and its publication under way."""

    __slots__ = ("channel", "duplicate", "index", "message_id", "meta", "published", "received")

    def __init__(
        self, channel: str, message_id: str, duplicate: bool, received: float, index: int | None
    ) -> None:
        self.channel = channel
        self.message_id = message_id
        self.duplicate = duplicate
        self.received = received
        self.index = index
        self.meta = False
        self.published: Publication | None = None
        """None when the message was published before (a repeated final)."""


_Entry = str | tuple[_Completion | None, list[tuple[str, str, bool]], bool]
"""A reply waiting its turn: a frame; a final's settlement, which sends its ack (a lone
event's) or adds it to its batch's list; or a batch's acks (completion None)."""


class _Replies:
    """One producer connection's replies in order, while some wait for the broker."""

    __slots__ = ("_waiter", "closed", "entries")

    def __init__(self) -> None:
        self.entries: collections.deque[_Entry] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False
        """The task sending them ended (all sent, or cancelled at shutdown)."""

    def push(
        self, completion: _Completion | None, acks: list[tuple[str, str, bool]], batch: bool = False
    ) -> None:
        self.entries.append((completion, acks, batch))

    def moved(self, done: bool = False) -> None:
        """An entry was sent (or the sending ended, ``done``): wake whoever waits."""
        self.closed = self.closed or done
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def below(self, count: int) -> None:
        """Wait until at most ``count`` entries wait."""
        while len(self.entries) > count and not self.closed:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    async def finished(self) -> None:
        """Wait until every entry is sent."""
        await self.below(0)


def _run_of_deltas(events: Sequence[Event], start: int, first: str) -> list[str]:
    """The run of plain deltas of ``events[start]``'s message from it on (its delta is
    ``first``): up to the first later event that is not one."""
    message_id, end = events[start].id, len(events)
    deltas = [first]
    at = start + 1
    while at < end:
        event = events[at]
        delta = event.delta
        if (
            event.id != message_id
            or delta is MISSING
            or event.channel is not MISSING
            or event.seq is not MISSING
            or event.meta is not MISSING
            or event.chunk is not MISSING
            or event.abort is not MISSING
            or event.final
        ):
            break
        deltas.append(delta)
        at += 1
    return deltas


class _DeltaRun:
    """A producer's deltas of one plain message, a frame each (a WebSocket's) or a line each
    (an NDJSON body's), read in a row: applied together when the run ends (as
    :meth:`MessageStreams.plain_deltas` applies a batch's run, with one call to the broker).
    It ends before anything else is done: at the producer's next frame or line that is not
    one of them, and at the end of each read of its socket (for a body, once the lines read
    so far are handed over), before the loop runs anything else. So nobody can see anything
    but what applying each frame as it came shows, in the same order.

    It takes only deltas that :meth:`MessageStreams.plain_deltas` applies as
    :meth:`MessageStreams.plain_delta` would one by one: of a plain message in progress on
    the default channel, without a surrogate half, within the message's size. Any other
    is applied alone, after the run.
    """

    __slots__ = ("deltas", "endpoint", "message_id", "now", "room", "session")

    def __init__(self, endpoint: ProducerEndpoint, session: Session) -> None:
        self.endpoint = endpoint
        self.session = session
        self.message_id: str | None = None
        """The message of the run; None when no run is under way."""
        self.deltas: list[str] = []
        self.room = 0
        """Characters the message may still take."""
        self.now = 0.0
        """When the run's first delta was read."""

    def start(self, message_id: str, delta: str, now: float) -> bool:
        """Start a run of another message's deltas with ``delta`` (ending the run under way
        first); False, with no run under way, if it must be applied alone.

        The run's next deltas :meth:`ProducerEndpoint._frame` adds itself (``deltas``,
        ``room``), a call less per frame, and ends the run with one that does not fit."""
        if self.message_id is not None:
            self.end()
        room = self.session.streams.room(message_id)
        if room is None or len(delta) > room or (not delta.isascii() and has_surrogate(delta)):
            return False
        self.message_id, self.room, self.now = message_id, room - len(delta), now
        self.deltas.append(delta)
        return True

    def end(self) -> None:
        """Apply the run's deltas, if a run is under way."""
        message_id = self.message_id
        if message_id is None:
            return
        deltas, self.message_id, self.deltas = self.deltas, None, []
        if deltas:
            ran = self.session.streams.plain_deltas(message_id, deltas, self.now)
            assert ran is not None, "take() admits only deltas plain_deltas applies"
            self.endpoint.published_run(self.session.owner, message_id, deltas, ran)


class ProducerEndpoint:
    """Every producer connection and session of one relay process."""

    def __init__(
        self,
        settings: Settings,
        broker: Broker,
        metrics: Metrics,
        writer: Writer,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.settings = settings
        self._open_access = settings.open_access
        self.broker = broker
        self.metrics = metrics
        self.writer = writer
        self.spawn = spawn
        self.stopping = False
        """Set when the relay stops: producers' frames are no longer applied."""
        self.clock: Callable[[], float] = time.monotonic
        """The serving event loop's clock (see :func:`loop_clock`)."""
        self.handing_off = False
        """Set by a rolling restart: sessions are left to the broker, never ended here."""
        self.one_shot = True
        """Whether a one-shot message may be answered at once (:mod:`.oneshot`); when
        False, every producer request takes the general path (the tests play both)."""
        self.delta_runs = True
        """Whether a producer's deltas read in a row (a WebSocket's frames, an NDJSON body's
        lines) are applied as runs (:class:`_DeltaRun`); when False, each is applied as it
        is read (the tests play both)."""
        self.memory_used = 0
        """Bytes of text held, as last counted (see :meth:`overloaded`)."""
        self.held_elsewhere: Callable[[], int] = lambda: 0
        """Bytes of ``--max-memory-bytes`` held by the rest of the relay (the Durable
        Streams' data): new messages may take only what they leave."""
        self.delta_channels: Collection[str] = ()
        """The channels a deltas subscriber of this process listens to (the relay's live
        set): a structured message's chunks go to a broker that keeps no sessions only
        for them."""
        self._memory_checked = -MEMORY_CHECK_SECONDS
        self._replies: dict[ProducerPeer, _Replies] = {}
        """Per producer connection, its replies still waiting for the broker, in order."""
        self.takers: dict[str, tuple[str, WebSocket]] = {}
        """Per owner, the channel whose chat requests it takes and its connection: a
        WebSocket producer connected with ``?channel=``, while it is connected."""
        self.sessions: SessionTable[ProducerPeer] = SessionTable(
            broker.instance,
            grace=settings.session_grace,
            max_parked=settings.max_parked_sessions,
            max_streaming=settings.max_streaming_per_producer,
            max_completed=settings.max_completed_per_producer,
            max_chars=settings.max_message_chars,
            rate=settings.max_events_per_second,
            max_parked_chars=settings.max_parked_chars,
            max_parked_per_address=settings.max_parked_per_ip,
            max_meta_bytes=settings.max_meta_bytes,
            max_named_per_address=settings.max_named_producers_per_ip,
        )

    async def serve(
        self, connection: ProducerPeer, channel: str | None, grant: Grant, resume: str | None
    ) -> None:
        """Serve one producer connection until it ends."""
        loop = asyncio.get_running_loop()
        try:
            session, resumed, displaced = await self._attach(connection, grant, resume, loop.time())
        except FrameRejected as exc:  # a named HTTP producer past a limit: nothing applied
            self.reject_now(connection, exc)
            return
        if not session.named:  # a named one stays counted where it was opened
            session.address = connection.client
        if displaced is not None:
            # The old connection is half-open or still alive: this one takes over.
            self.writer.close(displaced, CloseCode.POLICY_VIOLATION, "session resumed elsewhere")
        session.streams.default_channel = channel
        if not isinstance(connection, HttpProducer):
            # A request's answer has no session frame: its token is never shown.
            await self.writer.reply(connection, session_frame(session.token, resumed))
        while session.cancels:
            self.writer.send((connection,), session.cancels.popleft())
        taker = connection if channel is not None and isinstance(connection, WebSocket) else None
        if taker is not None:
            await self._take_requests(session.owner, channel, taker, True)
        received, waiting, streams = self.metrics.frames_in_producer, self._replies, session.streams
        self.clock = loop_time = loop_clock(loop)
        # A WebSocket ends each read's run of deltas (see _DeltaRun), and an NDJSON body each
        # run of the lines read so far; an AI SDK body's events are applied one by one.
        run = (
            _DeltaRun(self, session)
            if self.delta_runs and (isinstance(connection, WebSocket) or connection.takes_runs)
            else None
        )

        def handle(raw: Item | bytes) -> Awaitable[None] | None:
            received.value += 1
            if self.stopping or (
                session.connection is not connection and connection not in session.joined
            ):
                if self.stopping and isinstance(connection, HttpProducer):
                    # Its answer must say so, or a 200 with no ack would pass for done.
                    connection.unapplied = connection.taken - 1
                return _stop()
            # Requests of one named producer may overlap, each with its own ?channel=.
            streams.default_channel = channel
            later = self._frame(connection, session, raw, loop_time(), run)
            if later is None and not connection.paused:
                # Nearly always no producer's replies wait for the broker: one check then.
                replies = waiting.get(connection) if waiting else None
                if replies is None or len(replies.entries) <= MAX_PENDING_REPLIES:
                    return None
            return self._after_frame(connection, later)

        try:
            await connection.dispatch(handle, None if run is None else run.end)
        except _Stopped:
            pass
        finally:
            if run is not None:
                run.end()  # (each read ended its run already)
            if taker is not None:
                await self._take_requests(session.owner, channel, taker, False)
            # Every final's fate is settled (published, or kept for a retry) before the
            # session is parked or ended.
            replies = self._replies.get(connection)
            if replies is not None:
                await replies.finished()
            if (
                isinstance(connection, HttpProducer)
                and connection.named
                and self.broker.shares_sessions
                and session.streams.streaming_count
            ):
                # The answer says what was applied: the next request of this producer may
                # go to another process, which must find every message in progress as it
                # was left here, so the writes reach the broker before the answer does.
                await self.broker.flush_writes()
            await self._detach(session, connection)

    async def _detach(self, session: Session, connection: ProducerPeer) -> None:
        """The connection ended: park the session, end it, or (rolling restart) leave it."""
        loop = asyncio.get_running_loop()
        if session.connection is connection and (
            self.handing_off
            or (
                self.stopping
                and not connection.close_received
                and self.broker.shares_sessions
                and self.broker.healthy
            )
        ):
            # The session lives on in the broker for another process to resume. So does one
            # whose serving ended once the relay began to stop, before the hand-off: a frame
            # that arrives then is not applied (``handle``), which ends its serving here,
            # while the connection is still open. Ending the session would abort its
            # messages, which the producer would then send again whole elsewhere, under the
            # same ids (each reader would get the message aborted, then whole). Its
            # connection is closed with the rest, with 1012. A producer that closed on its
            # own, or a request that ends its producer, still ends it.
            self.sessions.forget(session.owner)
            return
        vanished = not connection.close_received and not self.stopping
        # A named HTTP producer posts its chunks on their own: its session waits between
        # requests as long as its messages may (--idle-timeout).
        named = isinstance(connection, HttpProducer)
        grace = max(self.settings.session_grace, self.settings.idle_timeout) if named else None
        ended = self.sessions.detach(
            session, connection, vanished=vanished, now=loop.time(), grace=grace
        )
        if session.parked_until is not None:
            loop.call_later(session.parked_until - loop.time(), self._expire_sessions)
        for gone in ended:
            await self._end(gone, AbortReason.PRODUCER_DISCONNECTED)

    async def _attach(
        self, connection: ProducerPeer, grant: Grant, resume: str | None, now: float
    ) -> tuple[Session, bool, ProducerPeer | None]:
        """The session for a new connection: local, taken over from the broker, or new."""
        sessions = self.sessions
        named = isinstance(connection, HttpProducer) and connection.named
        address = connection.client
        if resume and resume not in sessions.by_token and self.broker.shares_sessions:
            owner = sessions.new_owner()
            try:
                state = await self.broker.take_session(resume, _grant_key(grant), owner)
            except BrokerUnavailable:
                state = None
            if state is not None:
                adopted = sessions.adopt(
                    connection, grant, resume, owner, state, now, named=named, address=address
                )
                for message_id, channel, _, text in state.streaming:
                    if message_id in state.logs and adopted.streams.phase(message_id) is (
                        Phase.ABORTED
                    ):  # structured, its log cut: its parts can't be continued here
                        lost = Unfinished(channel, message_id, text, state.meta.get(message_id))
                        await self._abort(adopted, lost, AbortReason.RELAY_LOST)
                return adopted, True, None
        session, resumed, displaced = sessions.attach(
            connection, grant, resume, now, named=named, address=address
        )
        if not resumed and self.broker.shares_sessions:
            # Without the record a resume elsewhere would start afresh; with it, exactly once.
            with contextlib.suppress(BrokerUnavailable):
                await self.broker.save_session(session.token, session.owner, _grant_key(grant))
        return session, resumed, displaced

    def session_moved(self, owner: str) -> None:
        """Another process took the session over: close its old connection, abort nothing."""
        session = self.sessions.forget(owner)
        if session is not None:
            for connection in session.connections():
                if isinstance(connection, HttpProducer):
                    connection.start_close(CloseCode.POLICY_VIOLATION)  # now: no line more
                self.writer.close(
                    connection, CloseCode.POLICY_VIOLATION, "session resumed elsewhere"
                )

    async def hand_off(self) -> None:
        """A rolling restart: leave every session to the broker and close with 1012."""
        self.handing_off = True
        await self.broker.leave()
        for session in list(self.sessions.by_owner.values()):
            if session.connection is not None:
                for connection in session.connections():
                    self.writer.close(
                        connection, CloseCode.SERVICE_RESTART, "relay restarting: resume"
                    )
            else:
                self.sessions.forget(session.owner)

    def _frame(
        self,
        connection: ProducerPeer,
        session: Session,
        raw: Item | bytes,
        now: float,
        run: _DeltaRun | None = None,
    ) -> Coroutine[Any, Any, None] | None:
        """Apply one frame and answer it, without waiting; what is left to wait for (an
        abort being published), if anything. With ``run`` (a WebSocket's), a plain delta
        may join the run of its message's deltas; any other frame ends the run first."""
        if isinstance(raw, str):
            try:  # codec.decode_producer_frame, inlined
                frame: Event | list[FastEvent] | list[ProducerEvent] = decode_fast(raw)
            except (DecodeError, RecursionError):
                modelled = self._modelled(connection, raw, run)
                if modelled is None:
                    return None
                frame = modelled
        elif isinstance(raw, AbortMessage):
            # The producer's own word, not a frame: neither decoded nor charged.
            if run is not None:
                run.end()
            unfinished = session.streams.abort(raw.message_id)
            return None if unfinished is None else self._abort(session, unfinished, raw.reason)
        else:
            # An HTTP body's line the edge refused before decoding it, or a binary frame.
            if run is not None:
                run.end()
            self.reject_now(
                connection, raw if isinstance(raw, FrameRejected) else binary_rejected()
            )
            return None
        if now - self._memory_checked >= MEMORY_CHECK_SECONDS:  # see overloaded()
            if run is not None:
                run.end()  # its deltas counted as the frames' before them would be
            self._count_memory(now)
        if isinstance(frame, list):
            if run is not None:
                run.end()
            if len(raw) > MAX_JSON_DEPTH and nests_too_deep(raw, frame):
                modelled = self._modelled(connection, raw, None)
                if not isinstance(modelled, list):
                    return None
                frame = modelled
            if not session.bucket.take(now, len(frame)):
                # The whole frame is refused, so the producer sends it again as it was.
                self.reject_now(connection, self._rate_limited(frame, session))
                return None
            return self._events(connection, session, frame, True, now, 0, [], False)
        if not session.bucket.take(now, 1):  # one event: one type check per frame, not two
            if run is not None:
                run.end()
            self.reject_now(connection, self._rate_limited(frame, session))
            return None
        if frame.final or frame.abort is not MISSING:
            if run is not None:
                run.end()
            if (
                frame.delta is MISSING
                and frame.abort is MISSING
                and frame.channel is MISSING
                and frame.seq is MISSING
                and frame.meta is MISSING
                and frame.chunk is MISSING
            ):
                # Most finals: a plain message in progress, completed (as in _events).
                completed = session.streams.plain_final(frame.id)
                if completed is not None:
                    # As _events answers it, without the loop: its ack, encoded once, to
                    # the one producer.
                    acks: list[tuple[str, str, bool]] = []
                    self._finished(connection, session, completed, now, frame, None, acks, False)
                    if acks:  # settled now (else its reply waits its turn)
                        self.writer.send_to(connection, ack_frame(*acks[0]))
                    return None
            if len(raw) > MAX_JSON_DEPTH and nests_too_deep(raw, frame):
                return self._remodelled(connection, session, raw, now)
            return self._events(connection, session, (frame,), False, now, 0, [], False)
        # One event that is not a final: nothing to ack, nothing to publish but its delta.
        if (
            frame.delta is not MISSING
            and frame.channel is MISSING
            and frame.seq is MISSING
            and frame.meta is MISSING
            and frame.chunk is MISSING
        ):
            # Most frames: a delta of a plain message in progress, on the default channel
            # (the short way of _apply, as in _events), or of the run under way.
            if run is not None:
                delta = frame.delta
                if frame.id != run.message_id:
                    if run.start(frame.id, delta, now):
                        return None
                elif len(delta) <= run.room and (delta.isascii() or not has_surrogate(delta)):
                    run.room -= len(delta)  # the next delta of the run (see _DeltaRun.start)
                    run.deltas.append(delta)
                    return None
                else:
                    run.end()
            # Applied alone (with no run under way now: it ended above, or never started).
            streamed = session.streams.plain_delta(frame.id, frame.delta, now)
            if streamed is not None:
                channel, wait, first = streamed
                if wait is not None:  # not an empty delta
                    self.broker.delta(channel, session.owner, frame.id, frame.delta, 0, True)
                    metrics = self.metrics
                    (metrics.first_delta if first else metrics.delta_gap).observe(wait)
                return None
            if self._opened(connection, session, frame.id, frame.delta, now, None, None):
                return None
        else:
            if run is not None:
                run.end()
            if len(raw) > MAX_JSON_DEPTH and nests_too_deep(raw, frame):
                return self._remodelled(connection, session, raw, now)
        applied = self._apply(connection, session, frame, now, None, None)
        if isinstance(applied, Overflow):
            return self._abort_then(session, applied.unfinished, None)
        return None

    def _modelled(
        self, connection: ProducerPeer, raw: str, run: _DeltaRun | None
    ) -> Event | list[ProducerEvent] | None:
        """A frame msgspec did not read, or read nesting deeper than the models read (see
        :func:`~token_relay.core.codec.nests_too_deep`), as the models read it; None if
        they refuse it (answered, the run under way ended first)."""
        try:
            return decode_by_models(raw)
        except FrameRejected as exc:
            if run is not None:
                run.end()
            self.reject_now(connection, exc)
            return None

    def _remodelled(
        self, connection: ProducerPeer, session: Session, raw: str, now: float
    ) -> Coroutine[Any, Any, None] | None:
        """One event whose ``meta`` or ``chunk`` nests deeper than msgspec's reading is
        trusted: applied as the models read it, if they take it (its rate already taken)."""
        frame = self._modelled(connection, raw, None)
        if frame is None:
            return None
        events = frame if isinstance(frame, list) else (frame,)
        return self._events(connection, session, events, False, now, 0, [], False)

    def _events(
        self,
        connection: ProducerPeer,
        session: Session,
        events: Sequence[Event],
        batch: bool,
        now: float,
        start: int,
        acks: list[tuple[str, str, bool]],
        waiting: bool,
    ) -> Coroutine[Any, Any, None] | None:
        """Apply a frame's events from ``start`` on; its acks go out once all are applied."""
        # One count of memory for the frame, taken when an event first needs it (most
        # frames' events never do): every event of it is applied at one ``now``, at which
        # the count is refreshed at most once (see :meth:`overloaded`).
        overloaded: bool | None = None
        streams, owner, metrics = session.streams, session.owner, self.metrics
        plain_delta, plain_final = streams.plain_delta, streams.plain_final
        count, skip, tried = len(events), start, start
        for index in range(start, count):
            if index < skip:
                continue  # in a run of deltas applied together (below)
            event = events[index]
            if (
                event.delta is not MISSING
                and event.channel is MISSING
                and event.seq is MISSING
                and event.meta is MISSING
                and event.chunk is MISSING
                and event.abort is MISSING
                and not event.final
            ):
                # Most events: a delta of a plain message in progress, on the default
                # channel: the short way of _apply (as in _frame).
                if (
                    index >= tried
                    and index + 1 < count
                    and events[index + 1].id == event.id
                    and streams.phase(event.id) is Phase.STREAMING
                ):
                    # A run may start here: the message is in progress and the next event
                    # is of it. (A delta that opens its message is applied alone, below,
                    # and its run looked for from the next event: none would be taken.)
                    deltas = _run_of_deltas(events, index, event.delta)
                    run = index + len(deltas)
                    if run > index + 1:
                        # Its next events are more deltas of the same message, applied
                        # together, as one after another (see MessageStreams.plain_deltas).
                        ran = streams.plain_deltas(event.id, deltas, now)
                        if ran is not None:
                            self.published_run(owner, event.id, deltas, ran)
                            skip = run
                            continue
                        # Its run needs the long way: one at a time, the whole run.
                        tried = run
                streamed = plain_delta(event.id, event.delta, now)
                if streamed is not None:
                    channel, wait, first = streamed
                    if wait is not None:
                        self.broker.delta(channel, owner, event.id, event.delta, 0, True)
                        (metrics.first_delta if first else metrics.delta_gap).observe(wait)
                    continue
                if overloaded is None:
                    overloaded = self.overloaded(now)
                at = index if batch else None
                if self._opened(connection, session, event.id, event.delta, now, at, overloaded):
                    continue
            else:
                at = index if batch else None
            if event.abort is not MISSING:
                unfinished = self._cancel(connection, session, event, at)
                if unfinished is not None:
                    rest = (connection, session, events, batch, now, index + 1, acks, waiting)
                    return self._abort_then(session, unfinished, rest, AbortReason(event.abort))
                continue
            applied: Applied | Overflow | None = None
            if (
                event.final
                and event.delta is MISSING
                and event.channel is MISSING
                and event.seq is MISSING
                and event.meta is MISSING
                and event.chunk is MISSING
            ):
                # Most finals: a plain message in progress, completed (all _apply would do).
                applied = plain_final(event.id)
            if applied is None:
                if overloaded is None:
                    overloaded = self.overloaded(now)
                applied = self._apply(connection, session, event, now, at, overloaded)
            if applied is None:
                continue
            if isinstance(applied, Overflow):
                rest = (connection, session, events, batch, now, index + 1, acks, waiting)
                return self._abort_then(session, applied.unfinished, rest)
            if applied.text is None:
                continue
            if self._finished(connection, session, applied, now, event, at, acks, batch):
                waiting = True
        replies = self._replies.get(connection)
        if replies is None:
            if acks:
                self.writer.send((connection,), acks_frame(acks, batch=batch))
        elif batch and (acks or waiting):
            replies.push(None, acks, batch)  # one acks frame for the batch, in its turn
        elif acks:
            replies.entries.append(acks_frame(acks, batch=False))
        return None

    def _finished(
        self,
        connection: ProducerPeer,
        session: Session,
        applied: Applied,
        now: float,
        event: Event,
        index: int | None,
        acks: list[tuple[str, str, bool]],
        batch: bool,
    ) -> bool:
        """Publish the message a final completed. Settled now (a broker in this process,
        nothing waiting before it): its ack goes to ``acks``, or its refusal is answered.
        Still publishing: the producer's next events go on meanwhile, and its replies wait
        their turn behind this one, so they keep their order; then True."""
        completion = self._complete(session, applied, now, event, index)
        replies = self._replies.get(connection)
        published = completion.published
        if replies is None and (
            published is None or isinstance(published, Published) or published.done()
        ):
            settled = self._settle(session, completion)
            if isinstance(settled, FrameRejected):
                self.reject_now(connection, settled)
            else:
                acks.append(settled)
            return False
        if replies is None:
            replies = self._replies[connection] = _Replies()
            self.spawn(self._answer(connection, session, replies))
        replies.push(completion, acks, batch)
        return True

    def published_run(
        self,
        owner: str,
        message_id: str,
        deltas: Sequence[str],
        ran: tuple[str, float | None, bool, int],
    ) -> None:
        """Publish a run of a message's deltas that :meth:`MessageStreams.plain_deltas`
        applied (``ran`` is its answer), and count their waits."""
        channel, wait, first, count = ran
        if wait is not None:
            self.broker.deltas(channel, owner, message_id, deltas, count)
            metrics = self.metrics
            (metrics.first_delta if first else metrics.delta_gap).observe(wait)
            if count > 1:
                metrics.delta_gap.observe_zeros(count - 1)

    async def _after_frame(
        self, connection: ProducerPeer, later: Coroutine[Any, Any, None] | None
    ) -> None:
        """What a frame left to wait for, then the producer's backpressure: its socket
        drained, and its replies waiting for the broker at most half the limit."""
        if later is not None:
            await later
        if connection.paused:
            await connection.drain()  # the producer reads its replies too slowly
        replies = self._replies.get(connection)
        if replies is not None and len(replies.entries) > MAX_PENDING_REPLIES:
            await replies.below(MAX_PENDING_REPLIES // 2)

    async def _abort_then(
        self,
        session: Session,
        unfinished: Unfinished,
        rest: tuple[Any, ...] | None,
        reason: AbortReason = AbortReason.MESSAGE_TOO_LARGE,
    ) -> None:
        """A message grew too large (or its producer aborted it): publish its abort, then
        apply the frame's other events (``rest``: the arguments of :meth:`_events` from the
        next one; None if none)."""
        await self._abort(session, unfinished, reason)
        later = None if rest is None else self._events(*rest)
        if later is not None:
            await later

    async def _answer(self, connection: ProducerPeer, session: Session, replies: _Replies) -> None:
        """Send a producer's replies in order, each final's once its message is published."""
        try:
            while replies.entries:
                entry = replies.entries[0]
                if isinstance(entry, str):
                    await self.writer.reply(connection, entry)
                else:
                    completion, acks, batch = entry
                    if completion is None:
                        if acks:
                            await self.writer.reply(connection, acks_frame(acks, batch=batch))
                    else:
                        published = completion.published
                        if published is not None and not published.done():
                            with contextlib.suppress(Exception):
                                await asyncio.shield(published)
                        settled = self._settle(session, completion)
                        if isinstance(settled, FrameRejected):
                            self.metrics.errors.labels(settled.code.value).inc()
                            await self.writer.reply(connection, error_frame(settled))
                        elif batch:
                            acks.append(settled)  # the batch's acks frame follows
                        else:
                            await self.writer.reply(connection, acks_frame([settled], batch=False))
                replies.entries.popleft()
                replies.moved()
        finally:
            # Nothing is left (or the task was cancelled at shutdown): replies go out directly.
            if self._replies.get(connection) is replies:
                del self._replies[connection]
            replies.moved(done=True)

    def _cancel(
        self, connection: ProducerPeer, session: Session, event: Event, index: int | None
    ) -> Unfinished | None:
        """Apply an event's ``abort``: the message it ends, if it was in progress; None if
        not, or if the event was refused (and answered)."""
        try:
            if event.channel is not MISSING:
                session.grant.check(event.channel, event.id)
            return session.streams.cancel(event)
        except FrameRejected as exc:
            exc.index = index
            self.reject_now(connection, exc)
            return None

    def _opened(
        self,
        connection: ProducerPeer,
        session: Session,
        message_id: str,
        delta: str,
        now: float,
        index: int | None,
        overloaded: bool | None,
    ) -> bool:
        """An event of only ``id`` and ``delta`` that opens a plain message on the default
        channel, applied the short way of :meth:`_apply` (``index`` and ``overloaded`` as
        it takes them); False, changing nothing, if it needs :meth:`_apply`."""
        if overloaded or (overloaded is None and self._over_memory()):
            return False  # _apply refuses it
        streams, owner = session.streams, session.owner
        channel = streams.plain_open(message_id, delta, now)
        if channel is None:
            return False
        broker = self.broker
        if not broker.open(channel, owner, message_id, 0):
            streams.refuse(message_id)
            refusal = id_in_use(channel, message_id)
            refusal.index = index
            self.reject_now(connection, refusal)
        elif delta:
            broker.delta(channel, owner, message_id, delta, 0, True)
            self.metrics.first_delta.observe(0.0)
        return True

    def _apply(
        self,
        connection: ProducerPeer,
        session: Session,
        event: Event,
        now: float,
        index: int | None,
        overloaded: bool | None,
    ) -> Applied | Overflow | None:
        """Apply one event and pass its delta on; None if it was refused (and answered).
        ``overloaded``: :meth:`overloaded` at ``now``, as the caller asked it for the frame;
        None if not asked (the memory count is fresh: a new message asks).

        This never waits: only completing a message does.
        """
        try:
            if event.channel is not MISSING:
                session.grant.check(event.channel, event.id)
            if (
                overloaded is not False
                and session.streams.phase(event.id) is None
                and (overloaded or self._over_memory())
            ):
                raise self._overloaded(event.id)
            convert = ""
            if event.chunk is not MISSING and self.broker.shares_sessions:
                assembler = session.streams.assembler
                if assembler.is_streaming(event.id):  # plain so far: this chunk converts it
                    convert = "1" if assembler.has_deltas(event.id) else "0"
            applied = session.streams.receive(event, now)
        except FrameRejected as exc:
            exc.index = index
            self.reject_now(connection, exc)
            return None
        if isinstance(applied, Overflow):
            applied.rejection.index = index
            self.reject_now(connection, applied.rejection)
            return applied
        seq = 0 if event.seq is MISSING else event.seq
        if (
            applied.opened
            and applied.text is None
            and not self.broker.open(applied.channel, session.owner, applied.message_id, seq)
        ):
            session.streams.refuse(applied.message_id)
            refusal = id_in_use(applied.channel, applied.message_id)
            refusal.index = index
            self.reject_now(connection, refusal)
            return None
        if event.meta is not MISSING and applied.text is None and not applied.duplicate:
            merged = session.streams.meta_of(applied.message_id)
            if merged:
                self.broker.meta(
                    applied.channel, session.owner, applied.message_id, json.dumps(merged)
                )
        live = applied.chunks
        if live is not None and (
            applied.channel in self.delta_channels or self.broker.shares_sessions
        ):
            # A structured message's event, in progress (most of a structured reply): its
            # chunks to its deltas subscribers, and its log kept where sessions are shared.
            if event.chunk is not MISSING:
                entry: Any = event.chunk
                if applied.opened:
                    convert = "0"
            else:
                entry, convert = event.delta, ""
            self.broker.part(
                applied.channel, session.owner, applied.message_id, entry, seq, convert, live
            )
        elif applied.delta:
            # A one-shot message (a final that opened it) never claimed its id.
            claimed = applied.text is None or not applied.opened
            self.broker.delta(
                applied.channel, session.owner, applied.message_id, applied.delta, seq, claimed
            )
            if applied.delta_wait is not None:
                metrics = self.metrics
                timings = metrics.first_delta if applied.first_delta else metrics.delta_gap
                timings.observe(applied.delta_wait)
        elif (
            applied.text is None
            and not applied.duplicate
            and self.broker.shares_sessions
            and (event.chunk is not MISSING or event.delta is not MISSING)
            and applied.delta is None  # a plain message's empty delta is ""
            and session.streams.phase(applied.message_id) is Phase.STREAMING  # not a late one
        ):
            self._log_part(session, applied, event, seq, convert)
        elif seq and not applied.opened and applied.text is None and not applied.duplicate:
            self.broker.progress(applied.channel, session.owner, applied.message_id, seq)
        return applied

    def _log_part(
        self, session: Session, applied: Applied, event: Event, seq: int, convert: str
    ) -> None:
        """Keep what a structured message applied, that its deltas subscribers need not be
        told (an empty top-level delta for its open text part), in a shared broker, so that
        another process can rebuild its parts."""
        channel, message_id = applied.channel, applied.message_id
        if event.chunk is not MISSING:
            if applied.opened:
                convert = "0"
            self.broker.part(channel, session.owner, message_id, event.chunk, seq, convert)
        elif event.delta is not MISSING:  # a top-level delta of a structured message
            self.broker.part(channel, session.owner, message_id, event.delta, seq)

    def _complete(
        self, session: Session, applied: Applied, now: float, event: Event, index: int | None
    ) -> _Completion:
        """Publish the message its final completed, unless it was published already."""
        channel, message_id, text = applied.channel, applied.message_id, applied.text
        assert text is not None
        completion = _Completion(channel, message_id, applied.duplicate, now, index)
        if applied.first_completion or message_id in session.unpublished:
            seq = 0 if event.seq is MISSING else event.seq
            body = message_body(channel, message_id, text, applied.meta, applied.parts)
            completion.meta = bool(applied.meta)
            # A message that opened before holds its id's claim, or is not published; a
            # one-shot one (or a final retried after the broker was down) needs nobody
            # else to hold it.
            claimed = applied.first_completion and not applied.opened
            completion.published = self.broker.terminal(
                channel,
                session.owner,
                message_id,
                body,
                seq,
                producer="" if self._open_access else identity(session.grant),
                claimed=claimed,
            )
        return completion

    def _settle(
        self, session: Session, completion: _Completion
    ) -> tuple[str, str, bool] | FrameRejected:
        """A final whose message is published (or was already): its ack, or its refusal.

        If the broker was down, the message is kept for the producer's retried final.
        """
        channel, message_id = completion.channel, completion.message_id
        published = completion.published
        if published is not None:
            if isinstance(published, Published):  # a broker in this process: ended already
                error, frame = published.error, published.frame
            elif published.cancelled():
                error, frame = BrokerUnavailable("the broker closed"), ""
            else:
                error = published.exception()
                frame = "" if error is not None else published.result()
            if isinstance(error, BrokerUnavailable):
                session.unpublished[message_id] = None
                if len(session.unpublished) > self.settings.max_completed_per_producer:
                    del session.unpublished[next(iter(session.unpublished))]
                error = broker_rejected(message_id)
            if isinstance(error, FrameRejected):
                if error.code is ErrorCode.ID_IN_USE:
                    session.streams.refuse(message_id)
                error.index = completion.index
                return error
            if error is not None:
                raise error
            session.unpublished.pop(message_id, None)
            self.metrics.completed.value += 1  # Tally.inc(), a call less per message
            if session.joined or isinstance(session.connection, HttpProducer):
                self._ended(session, message_id, frame)
            if completion.meta:
                self.broker.meta(channel, session.owner, message_id, "")  # ended: forgotten
            elapsed = self.clock() - completion.received
            self.metrics.final_to_delivery.observe(elapsed)
        return channel, message_id, completion.duplicate

    @staticmethod
    def _ended(session: Session, message_id: str, frame: str) -> None:
        """Tell the session's HTTP requests that a message of it ended, published as
        ``frame``."""
        connection = session.connection
        if isinstance(connection, HttpProducer):
            connection.ended(message_id, frame)
        for joined in session.joined:  # a named HTTP producer's other requests
            if isinstance(joined, HttpProducer):
                joined.ended(message_id, frame)

    def producer_identity(self, grant: Grant) -> str:
        """The producer identity a webhook carries: "" when the relay runs open."""
        return "" if self._open_access else identity(grant)

    async def _abort(self, session: Session, unfinished: Unfinished, reason: AbortReason) -> None:
        owner, producer = session.owner, self.producer_identity(session.grant)
        frame = Aborted(
            channel=unfinished.channel,
            id=unfinished.message_id,
            text=unfinished.text,
            parts=MISSING if unfinished.parts is None else unfinished.parts,
            reason=reason,
            meta=MISSING if unfinished.meta is None else unfinished.meta,
            offset=0,
            epoch="",
        )
        self.metrics.messages.labels(reason.value).inc()
        if unfinished.meta:
            self.broker.meta(unfinished.channel, owner, unfinished.message_id, "")
        where = (unfinished.channel, owner, unfinished.message_id, encode_unpositioned(frame))
        try:
            published = await self.broker.terminal(
                *where, aborted=True, producer=producer, claimed=True
            )
            self._ended(session, unfinished.message_id, published)
        except FrameRejected:
            pass  # the id was another producer's (its claim was refused): nothing to abort
        except BrokerUnavailable:
            # Nobody will send it again: the broker keeps it and publishes it once it can.
            log.warning(
                "abort of %r on %r waits for the broker", unfinished.message_id, unfinished.channel
            )
            self.broker.defer(*where, aborted=True, producer=producer)

    async def _end(self, session: Session, reason: AbortReason) -> None:
        # Messages completed here but never published (the broker was down and the
        # producer is gone): publish them once the broker can, rather than lose them.
        for message_id in session.unpublished:
            channel = session.streams.completed_channel(message_id)
            completed = session.streams.completed(message_id)
            if channel is not None and completed is not None:
                text, parts = completed
                self.broker.defer(
                    channel,
                    session.owner,
                    message_id,
                    message_body(channel, message_id, text, parts=parts),
                    producer=self.producer_identity(session.grant),
                )
        session.unpublished.clear()
        for unfinished in session.end():
            await self._abort(session, unfinished, reason)
        await self.broker.end_session(session.token, session.owner)

    def _expire_sessions(self) -> None:
        for session in self.sessions.expire(asyncio.get_running_loop().time()):
            self.spawn(self._end(session, AbortReason.PRODUCER_DISCONNECTED))

    async def expire_idle(self, deadline: float) -> None:
        """Abort messages whose last event came before ``deadline``."""
        for session in list(self.sessions.by_owner.values()):
            for unfinished in session.streams.expire(deadline):
                await self._abort(session, unfinished, AbortReason.IDLE_TIMEOUT)

    async def abort_everything(self, reason: AbortReason) -> None:
        """End every session, parked ones included, aborting what is in progress."""
        for session in self.sessions.end_all():
            await self._end(session, reason)

    def memory_in_use(self) -> int:
        """Bytes of text held (see ``--max-memory-bytes``), counted now."""
        return self.sessions.text_chars() + self.broker.memory_bytes()

    def overloaded(self, now: float) -> bool:
        """Whether memory in use is past ``--max-memory-bytes``, as counted at most
        :data:`MEMORY_CHECK_SECONDS` ago (a count walks every session), with what the rest
        of the relay holds (:attr:`held_elsewhere`) counted now."""
        if now - self._memory_checked >= MEMORY_CHECK_SECONDS:
            self._count_memory(now)
        return self._over_memory()

    def _count_memory(self, now: float) -> None:
        self._memory_checked = now
        self.memory_used = self.memory_in_use()

    def _over_memory(self) -> bool:
        """Whether memory in use, as last counted, with what the rest of the relay holds
        now, is past ``--max-memory-bytes``."""
        return self.memory_used + self.held_elsewhere() > self.settings.max_memory_bytes

    def _overloaded(self, message_id: str) -> FrameRejected:
        self.metrics.overloaded.inc()
        limit = self.settings.max_memory_bytes
        return FrameRejected(
            ErrorCode.OVERLOADED,
            f"the relay holds over --max-memory-bytes ({limit}) of text; this new message "
            "was not started, send it again later (messages under way go on)",
            message_id,
            expected=1,
        )

    def _rate_limited(
        self, frame: Event | list[FastEvent] | list[ProducerEvent], session: Session
    ) -> FrameRejected:
        limit = f"{self.settings.max_events_per_second:g}"
        if isinstance(frame, list):
            return FrameRejected(
                ErrorCode.RATE_LIMITED,
                f"over {limit} events per second; none of this batch's {len(frame)} events "
                "was applied, send it again",
            )
        # With seq, say where to send again from, so a producer resumes without duplicates.
        expected = session.streams.next_seq(frame.id) if frame.seq is not MISSING else None
        return FrameRejected(
            ErrorCode.RATE_LIMITED,
            f"over {limit} events per second; this event was not applied, send it again",
            frame.id,
            expected=expected,
        )

    def reject_now(self, connection: ProducerPeer, exc: FrameRejected) -> None:
        """Answer a refused frame without waiting (in order behind replies still waiting)."""
        self.metrics.errors.labels(exc.code.value).inc()
        replies = self._replies.get(connection)
        if replies is not None:
            replies.entries.append(error_frame(exc))
        else:
            self.writer.send((connection,), error_frame(exc))

    def cancel(self, owner: str, payload: Payload) -> None:
        """Pass a ``cancel`` frame to the local producer session that owns the message.

        Once per message: repeated cancels of a message already cancelled are dropped, and
        so is one for a message no longer in progress. A producer that is not reading gets
        none past its high-water mark (the cancel is dropped, the producer is never closed
        for it): a subscriber's flood of Stop presses can't cut an unrelated reply.
        """
        session = self.sessions.by_owner.get(owner)
        if session is None:
            return
        try:
            frame = json.loads(payload)
            key = (str(frame["channel"]), str(frame["id"]))
        except (ValueError, KeyError, TypeError):
            return
        if session.streams.channel_of(key[1]) != key[0] or key in session.cancelled:
            return
        if len(session.cancelled) >= self.settings.max_streaming_per_producer:
            # Forget the cancels of messages that have ended since.
            session.cancelled = {
                k: None for k in session.cancelled if session.streams.channel_of(k[1]) == k[0]
            }
        session.cancelled[key] = None
        if session.connection is None:
            session.cancels.append(payload)  # parked: delivered when it resumes
        else:
            self.writer.offer(session.connection, payload)

    def claim_refused(self, channel: str, owner: str, message_id: str) -> None:
        """The broker found the id held by another producer: refuse the local message,
        its later events, and its final if it came meanwhile (that final's publication is
        refused too: its claim is not held)."""
        session = self.sessions.by_owner.get(owner)
        if session is None:
            return
        streams = session.streams
        if channel not in (streams.channel_of(message_id), streams.completed_channel(message_id)):
            return
        streams.refuse(message_id)
        if session.connection is not None:
            self.reject_now(session.connection, id_in_use(channel, message_id))

    def partial(self, owner: str, message_id: str) -> str | None:
        """The text so far of a local producer's message."""
        session = self.sessions.by_owner.get(owner)
        return None if session is None else session.streams.partial(message_id)

    def live_parts(self, owner: str, message_id: str) -> tuple[str, list[dict[str, Any]]] | None:
        """The text so far and catch-up chunks of a local producer's structured message."""
        session = self.sessions.by_owner.get(owner)
        return None if session is None else session.streams.live_parts(message_id)

    async def _take_requests(
        self, owner: str, channel: str | None, connection: WebSocket, taking: bool
    ) -> None:
        """Register a producer connection as the one of ``owner`` that takes ``channel``'s
        chat requests, or unregister it (unless a newer connection of the owner took its
        place). The broker is told in the order these calls are made."""
        if channel is None:
            return
        if taking:
            self.takers[owner] = (channel, connection)
        else:
            taker = self.takers.get(owner)
            if taker is not None and taker[1] is connection:
                del self.takers[owner]
            elif taker is not None and taker[0] == channel:
                return  # a newer connection of the owner takes them now
        with contextlib.suppress(BrokerUnavailable):  # made again once it is back
            await self.broker.take_requests(channel, owner, taking)

    async def hand_request(self, channel: str, payload: str) -> ErrorCode | None:
        """Hand a chat request (the WebSocket chat transport's ``send``) to the newest
        producer, on any process, connected with ``?channel=`` naming ``channel``."""
        try:
            return await self.broker.hand_request(channel, payload)
        except BrokerUnavailable:
            raise broker_rejected(None) from None

    def on_request(self, owner: str, channel: str, payload: Payload) -> ErrorCode | None:
        """Hand a chat request to the local producer ``owner``, if it takes ``channel``'s."""
        taker = self.takers.get(owner)
        if taker is None or taker[0] != channel:
            return ErrorCode.NO_PRODUCER
        if not self.writer.offer(taker[1], payload):
            return ErrorCode.PRODUCER_BUSY
        return None

    def owned_messages(self) -> list[tuple[str, str, str]]:
        """Every message in progress on this process's producers."""
        return [
            (channel, owner, message_id)
            for owner, session in self.sessions.by_owner.items()
            for message_id, channel in session.streams.streaming()
        ]


def _grant_key(grant: Grant) -> str:
    """The identity a session is bound to, as the broker compares it."""
    return json.dumps([grant.role.value, sorted(grant.channels)])
