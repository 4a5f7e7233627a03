"""The WebSocket edge: admits connections, feeds frames to the core, writes what it returns.

Endpoints
---------
* ``/produce[?channel=C]``: a producer (model gateway) pushes delta events.
* ``/subscribe[?channel=C[&deltas=1]]``: a subscriber (chat frontend) receives
  completed messages and, if asked, live deltas.
* ``GET /healthz``, ``/readyz``, ``/metrics``, and with ``--web-root`` the demo
  page; see :mod:`server.gate` for admission (tokens, origins, limits).

Events
------
Producers' events go to the broker (:mod:`server.broker`), and the broker hands
every event of a channel this process listens to back to :meth:`on_frame`, own
events included, so every subscriber sees one order. A joining subscriber's
frames are buffered while the broker reads its catch-up cut; frames already in
the cut are dropped, the rest follow it: confirmation, replayed history,
snapshots, then the live stream, with no gap and no overlap.

Writes
------
Producer replies (``ack``, ``error``) are awaited, which gives each producer
backpressure. Frames to subscribers never wait: :mod:`server.fanout` writes
each once to every ready socket and merges the deltas of slow ones.

Shutdown
--------
:meth:`stop` stops accepting, aborts every message in progress with reason
``shutdown`` (subscribers get the ``aborted`` frame first), lets slow
subscribers' backlogs drain, then closes every connection with 1001, all
within ``--shutdown-timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from pydantic import MISSING
from websockets import CloseCode, State
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.typing import Origin

from .auth import Grant
from .broker import Broker, FrameKind, open_broker
from .errors import BrokerUnavailable, ErrorCode, FrameRejected
from .fanout import Fanout
from .gate import PRODUCE_PATH, SUBSCRIBE_PATH, Gate, query_of
from .hub import ChannelHub
from .metrics import Metrics
from .producer import Applied, MessageTooLarge, ProducerSession, Unfinished
from .protocol import (
    Aborted,
    AbortReason,
    Ack,
    AckBatch,
    AckEntry,
    Cancel,
    ErrorFrame,
    MessageFrame,
    ProducerEvent,
    SessionFrame,
    Snapshot,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    decode_producer_frame,
    decode_subscriber_frame,
    encode,
    encode_unpositioned,
)
from .ratelimit import TokenBucket
from .settings import Settings
from .window import DeltaWindow

__all__ = ["PRODUCE_PATH", "SUBSCRIBE_PATH", "Relay"]

log = logging.getLogger("token_relay")

try:
    import websockets.speedups  # noqa: F401

    SPEEDUPS = True
except ImportError:  # pragma: no cover - depends on the installed wheel
    SPEEDUPS = False

BROKER_RESTORED_REASON = "broker reconnected: resume by offset"
SHUTDOWN_REASON = "relay shutting down"
MAX_JOIN_BUFFER = 10_000
"""Frames buffered for one joining subscription while its catch-up is read."""
_TRUE = frozenset({"1", "true", "yes", "on"})


MAX_PARKED_CANCELS = 100
"""Cancels kept for a parked producer session, delivered when it resumes."""


@dataclass(slots=True, eq=False)
class _ProducerLink:
    """A producer session: its assembler and what the relay keeps beside it.

    It outlives its connection by up to ``--session-grace`` when the connection
    vanishes, so a producer that reconnects with the session token continues.
    """

    owner: str
    token: str
    session: ProducerSession
    grant: Grant | None
    bucket: TokenBucket
    connection: ServerConnection | None
    unpublished: dict[str, None] = field(default_factory=dict)
    """Completed here but not yet published (the broker was down): a repeated final retries."""
    cancels: deque[str | bytes] = field(default_factory=lambda: deque(maxlen=MAX_PARKED_CANCELS))
    """Cancels that arrived while the session was parked."""
    expiry: asyncio.TimerHandle | None = None


def _binary_rejected() -> FrameRejected:
    return FrameRejected(
        ErrorCode.BINARY_NOT_SUPPORTED, "binary frames are not supported; send JSON text frames"
    )


def _error_frame(exc: FrameRejected) -> str:
    frame = ErrorFrame(code=exc.code, message=exc.message, id=exc.message_id)
    extra = {
        name: value
        for name, value in (("index", exc.index), ("expected", exc.expected))
        if value is not None
    }
    if extra:
        frame = frame.model_copy(update=extra)
    return encode(frame)


def _acks(acks: list[tuple[str, str, bool]], *, batch: bool) -> str:
    """One ``ack`` frame for a single event, one ``acks`` frame for a batch."""
    if not batch:
        channel, message_id, duplicate = acks[0]
        ack = Ack(id=message_id, channel=channel)
        return encode(ack.model_copy(update={"duplicate": True}) if duplicate else ack)
    entries = [
        AckEntry(id=message_id, channel=channel).model_copy(update={"duplicate": True})
        if duplicate
        else AckEntry(id=message_id, channel=channel)
        for channel, message_id, duplicate in acks
    ]
    return encode(AckBatch(acks=entries))


def _broker_rejected(message_id: str | None) -> FrameRejected:
    return FrameRejected(
        ErrorCode.BROKER_UNAVAILABLE,
        "the relay's broker is unreachable; nothing was published, retry shortly",
        message_id,
    )


class Relay:
    """One relay process: local connections and subscriptions, joined by a broker."""

    def __init__(self, settings: Settings | None = None, broker: Broker | None = None) -> None:
        self.settings = settings or Settings()
        self.broker = broker or open_broker(self.settings, secrets.token_hex(4))
        self.metrics = Metrics()
        self.hub: ChannelHub[ServerConnection] = ChannelHub(
            self.settings.max_channels_per_subscriber
        )
        self.gate = Gate(self.settings, self.metrics, lambda: self.broker.healthy)
        self.fanout = Fanout(self.settings, self.metrics, self.hub.remove)
        self.producers: dict[str, _ProducerLink] = {}
        self._sessions: dict[str, _ProducerLink] = {}
        self._parked: dict[str, _ProducerLink] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self.server: Server | None = None
        self._joining: dict[tuple[ServerConnection, str], list[tuple[FrameKind, int, Any]]] = {}
        self._owner_numbers = itertools.count(1)
        self._sweeper: asyncio.Task[None] | None = None
        self._stopping = False
        self._window = DeltaWindow() if self.settings.delta_flush_ms > 0 else None
        # Channels with a subscriber joining: their deltas skip the window, so a merged
        # frame never straddles a joiner's catch-up cut.
        self._joining_channels: dict[str, int] = {}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Server:
        """Connect the broker and start listening."""
        if not SPEEDUPS:
            log.warning("websockets' C speedups are missing: frames are masked in pure Python")
        await self.broker.start(self)
        origins = self.settings.allowed_origins
        self.server = await serve(
            self._handle,
            self.settings.host,
            self.settings.port,
            process_request=self.gate.check,
            origins=[*(Origin(origin) for origin in origins), None] if origins else None,
            max_size=self.settings.max_frame_bytes,
            # Frames are small and mostly unique; deflate would cost CPU and ~50 KiB per
            # connection for little gain, so it is off for every endpoint.
            compression=None,
            reuse_port=self.settings.workers > 1 or None,
        )
        self._sweeper = asyncio.create_task(self._expire_idle())
        return self.server

    async def stop(self) -> None:
        """Shut down gracefully within ``--shutdown-timeout``; see the module docstring."""
        if self._stopping:
            return
        self._stopping = True
        deadline = time.monotonic() + self.settings.shutdown_timeout
        server = self.server
        if server is not None:
            server.close(close_connections=False)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self._abort_everything(AbortReason.SHUTDOWN)
                while self.fanout.backlogs:  # noqa: ASYNC110 - drained by fanout tasks
                    await asyncio.sleep(0.01)
        if server is not None:
            # A peer that never answers the close handshake must not hold the process:
            # whatever is still open at the deadline is cut.
            connections = list(server.connections)
            closing = [
                asyncio.ensure_future(connection.close(CloseCode.GOING_AWAY, SHUTDOWN_REASON))
                for connection in connections
            ]
            if closing:
                await asyncio.wait(closing, timeout=max(0.1, deadline - time.monotonic()))
            for connection in connections:
                if connection.state is not State.CLOSED and connection.transport is not None:
                    connection.transport.abort()
            for task in closing:
                task.cancel()
            await asyncio.gather(*closing, return_exceptions=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 1)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self.fanout.stop()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.broker.close()

    async def __aenter__(self) -> Relay:
        if self.server is None:
            await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _abort_everything(self, reason: AbortReason) -> None:
        for owner, producer in list(self.producers.items()):
            if producer.expiry is not None:
                producer.expiry.cancel()
            for unfinished in producer.session.close():
                await self._abort(owner, unfinished, reason)
        with contextlib.suppress(BrokerUnavailable):
            await self.broker.flush()

    # ------------------------------------------------------------------ connections

    async def _handle(self, connection: ServerConnection) -> None:
        request = connection.request
        assert request is not None  # the handshake is done
        path = urlsplit(request.path).path
        role = "producer" if path == PRODUCE_PATH else "subscriber"
        grant = self.gate.admit(connection)
        gauge = self.metrics.connections.labels(role)
        gauge.inc()
        opened = time.monotonic()
        peer = connection.remote_address[0] if connection.remote_address else None
        log.info(
            "%s connected from %s (%s)",
            role,
            peer,
            connection.id,
            extra={
                "event": "open",
                "role": role,
                "peer": peer,
                "connection": str(connection.id),
                "path": path,
            },
        )
        query = query_of(request.path)
        try:
            # A peer that vanishes without a close frame ends its handler; that is the
            # world's doing (trio would say Broken), not an error of ours to log.
            with contextlib.suppress(ConnectionClosed):
                if role == "producer":
                    channels = query.get("channel")
                    resume = query.get("session", [""])[-1] or None
                    await self._serve_producer(
                        connection, channels[0] if channels else None, grant, resume
                    )
                else:
                    deltas = query.get("deltas", ["0"])[-1].lower() in _TRUE
                    initial = [
                        Subscribe(type="subscribe", channel=c, deltas=deltas)
                        for c in query.get("channel", [])
                    ]
                    await self._serve_subscriber(connection, initial, grant)
        finally:
            gauge.dec()
            self.gate.release(connection)
            code = connection.close_code
            log.info(
                "%s %s closed (%s)",
                role,
                connection.id,
                code,
                extra={
                    "event": "close",
                    "role": role,
                    "peer": peer,
                    "connection": str(connection.id),
                    "code": code,
                    "seconds": round(time.monotonic() - opened, 3),
                },
            )

    async def _reject(self, connection: ServerConnection, exc: FrameRejected) -> None:
        self.metrics.errors.labels(exc.code.value).inc()
        await connection.send(_error_frame(exc))

    def _reject_now(self, connection: ServerConnection, exc: FrameRejected) -> None:
        self.metrics.errors.labels(exc.code.value).inc()
        self.fanout.send((connection,), _error_frame(exc))

    # ------------------------------------------------------------------ producers

    async def _serve_producer(
        self,
        connection: ServerConnection,
        channel: str | None,
        grant: Grant | None,
        resume: str | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        link, resumed = self._attach(connection, grant, resume)
        link.session.default_channel = channel
        await connection.send(encode(SessionFrame(session=link.token, resumed=resumed)))
        while link.cancels:
            self.fanout.send((connection,), link.cancels.popleft())
        received = self.metrics.frames_in_producer
        try:
            async for raw in connection:
                received.inc()
                if self._stopping or link.connection is not connection:
                    break
                now = loop.time()
                try:
                    if isinstance(raw, bytes):
                        raise _binary_rejected()
                    frame = decode_producer_frame(raw)
                except FrameRejected as exc:
                    await self._reject(connection, exc)
                    continue
                events = frame if isinstance(frame, list) else (frame,)
                acks: list[tuple[str, str, bool]] = []
                for index, event in enumerate(events):
                    applied = self._apply(
                        connection, link, event, now, index if events is frame else None
                    )
                    if applied is None:
                        continue
                    if isinstance(applied, MessageTooLarge):
                        if applied.unfinished is not None:
                            await self._abort(
                                link.owner, applied.unfinished, AbortReason.MESSAGE_TOO_LARGE
                            )
                        continue
                    if applied.text is not None:
                        ack = await self._complete(connection, link, applied, now)
                        if ack is not None:
                            acks.append(ack)
                if acks:
                    await connection.send(_acks(acks, batch=events is frame))
        finally:
            await self._detach(connection, link)

    def _attach(
        self, connection: ServerConnection, grant: Grant | None, resume: str | None
    ) -> tuple[_ProducerLink, bool]:
        """This connection's producer state: a parked session it resumes, or a new one."""
        link = self._sessions.get(resume) if resume else None
        if link is not None and link.grant != grant:
            link = None  # a session token is bound to the identity that opened it
        if link is not None:
            if link.expiry is not None:
                link.expiry.cancel()
                link.expiry = None
            self._parked.pop(link.token, None)
            previous = link.connection
            if previous is not None:
                # The old connection is half-open or still alive: this one takes over.
                self.fanout.close(previous, CloseCode.POLICY_VIOLATION, "session resumed elsewhere")
            link.connection = connection
            return link, True
        settings = self.settings
        link = _ProducerLink(
            owner=f"{self.broker.instance}.{next(self._owner_numbers)}",
            token=secrets.token_urlsafe(24),
            session=ProducerSession(
                None,
                max_streaming=settings.max_streaming_per_producer,
                max_completed=settings.max_completed_per_producer,
                max_chars=settings.max_message_chars,
            ),
            grant=grant,
            bucket=TokenBucket(
                settings.max_events_per_second,
                settings.max_events_per_second,
                asyncio.get_running_loop().time(),
            ),
            connection=connection,
        )
        self.producers[link.owner] = link
        self._sessions[link.token] = link
        return link, False

    async def _detach(self, connection: ServerConnection, link: _ProducerLink) -> None:
        """The connection ended: park the session for a resume, or end it now."""
        if link.connection is not connection:
            return  # another connection resumed this session
        link.connection = None
        grace = self.settings.session_grace
        # A producer that said goodbye (a close frame) is done; one that vanished may be back.
        vanished = connection.protocol.close_rcvd is None
        if vanished and grace > 0 and not self._stopping:
            self._parked[link.token] = link
            while len(self._parked) > self.settings.max_parked_sessions:
                oldest = self._parked.pop(next(iter(self._parked)))
                self._spawn(self._end_session(oldest))
            link.expiry = asyncio.get_running_loop().call_later(
                grace, lambda: self._spawn(self._end_session(link))
            )
            return
        await self._end_session(link)

    async def _end_session(self, link: _ProducerLink) -> None:
        """Forget a producer's session and abort what it left unfinished."""
        if link.connection is not None:
            return  # resumed meanwhile
        self._parked.pop(link.token, None)
        self._sessions.pop(link.token, None)
        self.producers.pop(link.owner, None)
        for unfinished in link.session.close():
            await self._abort(link.owner, unfinished, AbortReason.PRODUCER_DISCONNECTED)

    def _apply(
        self,
        connection: ServerConnection,
        link: _ProducerLink,
        event: ProducerEvent,
        now: float,
        index: int | None,
    ) -> Applied | MessageTooLarge | None:
        """Apply one event and pass its delta on; None if it was rejected (and answered).

        A rejected event is answered with an error frame (naming ``index`` in a batch)
        and changes nothing else. This never waits: only completing a message does.
        """
        try:
            if not link.bucket.take(now):
                raise FrameRejected(
                    ErrorCode.RATE_LIMITED,
                    f"over {self.settings.max_events_per_second:g} events per second; "
                    "this event was not applied, send it again",
                    event.id,
                )
            if link.grant is not None and event.channel is not MISSING:
                link.grant.check(event.channel, event.id)
            applied = link.session.receive(event, now)
        except FrameRejected as exc:
            exc.index = index
            self._reject_now(connection, exc)
            return exc if isinstance(exc, MessageTooLarge) else None
        if applied.opened and applied.text is None:
            self.broker.open(applied.channel, link.owner, applied.message_id)
        if applied.delta:
            self.broker.delta(applied.channel, link.owner, applied.message_id, applied.delta)
            if applied.delta_wait is not None:
                metrics = self.metrics
                timings = metrics.first_delta if applied.first_delta else metrics.delta_gap
                timings.observe(applied.delta_wait)
        return applied

    async def _complete(
        self, connection: ServerConnection, link: _ProducerLink, applied: Applied, now: float
    ) -> tuple[str, str, bool] | None:
        """Publish a message its final completed; returns ``(channel, id, duplicate)`` to ack."""
        channel, message_id, text = applied.channel, applied.message_id, applied.text
        assert text is not None
        if applied.first_completion or message_id in link.unpublished:
            try:
                await self._publish(link, channel, message_id, text)
            except FrameRejected as exc:
                self._reject_now(connection, exc)
                return None
            self.metrics.completed.inc()
            self.metrics.final_to_delivery.observe(asyncio.get_running_loop().time() - now)
        return channel, message_id, applied.duplicate

    async def _publish(self, link: _ProducerLink, channel: str, message_id: str, text: str) -> None:
        """Publish a completed message once; if the broker is down, keep it for a retried final."""
        body = encode_unpositioned(
            MessageFrame.model_construct(
                channel=channel, id=message_id, text=text, offset=0, epoch=""
            )
        )
        try:
            await self.broker.terminal(channel, link.owner, message_id, body)
        except BrokerUnavailable:
            link.unpublished[message_id] = None
            if len(link.unpublished) > self.settings.max_completed_per_producer:
                del link.unpublished[next(iter(link.unpublished))]
            raise _broker_rejected(message_id) from None
        link.unpublished.pop(message_id, None)

    async def _abort(self, owner: str, unfinished: Unfinished, reason: AbortReason) -> None:
        frame = Aborted(
            channel=unfinished.channel,
            id=unfinished.message_id,
            text=unfinished.text,
            reason=reason,
            offset=0,
            epoch="",
        )
        self.metrics.messages.labels(reason.value).inc()
        try:
            await self.broker.terminal(
                unfinished.channel, owner, unfinished.message_id, encode_unpositioned(frame)
            )
        except BrokerUnavailable:
            log.warning(
                "could not publish abort of %r on %r: broker unreachable",
                unfinished.message_id,
                unfinished.channel,
            )

    async def _expire_idle(self) -> None:
        """Abort messages with no event for ``idle_timeout`` seconds."""
        timeout = self.settings.idle_timeout
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(timeout / 4, 1.0))
            deadline = loop.time() - timeout
            for owner, producer in list(self.producers.items()):
                for unfinished in producer.session.expire(deadline):
                    await self._abort(owner, unfinished, AbortReason.IDLE_TIMEOUT)

    # ---------------------------------------------------------------- subscribers

    async def _serve_subscriber(
        self, connection: ServerConnection, initial: list[Subscribe], grant: Grant | None
    ) -> None:
        received = self.metrics.frames_in_subscriber
        try:
            for frame in initial:
                await self._answer(connection, frame, grant)
            async for raw in connection:
                received.inc()
                if isinstance(raw, bytes):
                    self._reject_now(connection, _binary_rejected())
                    continue
                try:
                    request = decode_subscriber_frame(raw)
                except FrameRejected as exc:
                    self._reject_now(connection, exc)
                    continue
                await self._answer(connection, request, grant)
        finally:
            channels = list(self.hub.channels(connection))
            self.hub.remove(connection)
            for channel in channels:
                await self._update_interest(channel)

    async def _answer(
        self,
        connection: ServerConnection,
        frame: Subscribe | Unsubscribe | Cancel,
        grant: Grant | None,
    ) -> None:
        try:
            if isinstance(frame, Subscribe):
                if grant is not None:
                    grant.check(frame.channel)
                await self._subscribe(connection, frame)
            elif isinstance(frame, Unsubscribe):
                self.hub.unsubscribe(connection, frame.channel)
                self.fanout.send((connection,), encode(Unsubscribed(channel=frame.channel)))
                await self._update_interest(frame.channel)
            else:
                if grant is not None:
                    grant.check(frame.channel, frame.id)
                await self._cancel(connection, frame)
        except FrameRejected as exc:
            self._reject_now(connection, exc)

    async def _subscribe(self, connection: ServerConnection, frame: Subscribe) -> None:
        """Subscribe; send the confirmation, replayed history, snapshots, then what followed."""
        channel = frame.channel
        if self._window is not None and self._window.holds(channel):
            self._flush_window(channel)
        was_subscribed = not self.hub.subscribe(connection, channel, frame.deltas)
        key = (connection, channel)
        self._joining[key] = []
        self._joining_channels[channel] = self._joining_channels.get(channel, 0) + 1
        try:
            await self._update_interest(channel)
            since = None if frame.since is MISSING else (frame.since.offset, frame.since.epoch)
            cut = await self.broker.catch_up(channel, since, frame.deltas)
        except BrokerUnavailable:
            self._joining.pop(key, None)
            self._done_joining(channel)
            if not was_subscribed:
                self.hub.unsubscribe(connection, channel)
                await self._update_interest(channel)
            raise _broker_rejected(None) from None
        buffered = self._joining.pop(key, None)
        self._done_joining(channel)
        if buffered is None:  # dropped as slow while joining
            return
        confirmation = Subscribed(channel=channel, offset=cut.offset, epoch=cut.epoch)
        if cut.recovered is not None:
            confirmation = confirmation.model_copy(update={"recovered": cut.recovered})
        replies: list[str | bytes] = [encode(confirmation), *cut.frames]
        positions = {} if frame.positions is MISSING else frame.positions
        for message in cut.live:
            held = positions.get(message.message_id)
            if held is not None and held <= len(message.text):
                snapshot = Snapshot(
                    channel=channel, id=message.message_id, text=message.text[held:], from_=held
                )
            else:
                snapshot = Snapshot(channel=channel, id=message.message_id, text=message.text)
            replies.append(encode(snapshot))
        for kind, seq, payload in buffered:
            # Frames in the cut are already covered, except that a subscriber that was
            # already subscribed is owed the terminal frames it did not ask to replay.
            owed = was_subscribed and kind is FrameKind.TERMINAL and since is None
            if seq > cut.seq or owed:
                replies.append(payload)
        self.fanout.send_each(connection, replies)

    def _done_joining(self, channel: str) -> None:
        left = self._joining_channels.get(channel, 1) - 1
        if left > 0:
            self._joining_channels[channel] = left
        else:
            self._joining_channels.pop(channel, None)

    async def _update_interest(self, channel: str) -> None:
        """Tell the broker whether this process still needs the channel's traffic."""
        with contextlib.suppress(BrokerUnavailable):
            await self.broker.listen(
                channel,
                bool(self.hub.subscribers(channel)),
                bool(self.hub.delta_subscribers(channel)),
            )

    async def _cancel(self, connection: ServerConnection, frame: Cancel) -> None:
        if not self.hub.is_subscribed(connection, frame.channel):
            raise FrameRejected(
                ErrorCode.NOT_SUBSCRIBED,
                f"subscribe to channel '{frame.channel}' before cancelling its messages",
                frame.id,
            )
        try:
            owners = await self.broker.cancel(frame.channel, frame.id, encode(frame))
        except BrokerUnavailable:
            raise _broker_rejected(frame.id) from None
        if not owners:
            raise FrameRejected(
                ErrorCode.UNKNOWN_MESSAGE,
                f"no message '{frame.id}' is in progress on channel '{frame.channel}'",
                frame.id,
            )

    # ---------------------------------------------------------------- broker callbacks

    def on_frame(self, channel: str, kind: FrameKind, seq: int, payload: str | bytes) -> None:
        """Deliver one event's frame to this process's subscribers of ``channel``."""
        window = self._window
        if window is not None:
            if kind is FrameKind.DELTA and not self._joining_channels.get(channel):
                if window.add(channel, seq, payload):
                    asyncio.get_running_loop().call_later(
                        self.settings.delta_flush_ms / 1000, self._flush_window, channel
                    )
                return
            if window.holds(channel):
                self._flush_window(channel)
        self._dispatch(channel, kind, seq, payload)

    def _flush_window(self, channel: str) -> None:
        assert self._window is not None
        for seq, payload in self._window.take(channel):
            self._dispatch(channel, FrameKind.DELTA, seq, payload)

    def _dispatch(self, channel: str, kind: FrameKind, seq: int, payload: str | bytes) -> None:
        if kind is FrameKind.TERMINAL:
            receivers = self.hub.subscribers(channel)
        else:
            receivers = self.hub.delta_subscribers(channel)
        if not receivers:
            return
        if self._joining:
            ready = []
            for receiver in receivers:
                buffer = self._joining.get((receiver, channel))
                if buffer is None:
                    ready.append(receiver)
                elif len(buffer) < MAX_JOIN_BUFFER:
                    buffer.append((kind, seq, payload))
                else:
                    del self._joining[(receiver, channel)]
                    self.metrics.slow_closes.inc()
                    self.fanout.close(receiver, CloseCode.TRY_AGAIN_LATER, "too slow to join")
            self.fanout.send(ready, payload, kind is FrameKind.DELTA)
            return
        self.fanout.send(receivers, payload, kind is FrameKind.DELTA)

    def on_cancel(self, owner: str, payload: str | bytes) -> None:
        """Pass a ``cancel`` frame to the local producer that owns the message."""
        producer = self.producers.get(owner)
        if producer is None:
            return
        if producer.connection is None:
            producer.cancels.append(payload)  # parked: delivered when it resumes
        else:
            self.fanout.send((producer.connection,), payload)

    def wants_deltas(self, channel: str) -> bool:
        """Whether a local subscriber of ``channel`` asked for deltas."""
        return bool(self.hub.delta_subscribers(channel))

    def partial(self, owner: str, message_id: str) -> str | None:
        """The text so far of a local producer's message."""
        producer = self.producers.get(owner)
        return None if producer is None else producer.session.partial(message_id)

    def owned_messages(self) -> list[tuple[str, str, str]]:
        """Every message in progress on this process's producers."""
        return [
            (channel, owner, message_id)
            for owner, producer in self.producers.items()
            for message_id, channel in producer.session.streaming()
        ]

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def on_restored(self) -> None:
        """Events may have been missed during a broker outage: have subscribers resume."""
        subscribers = self.hub.subscriber_handles()
        if subscribers:
            log.warning("broker restored: closing %d subscribers so they resume", len(subscribers))
        for connection in subscribers:
            self.fanout.close(connection, CloseCode.SERVICE_RESTART, BROKER_RESTORED_REASON)
