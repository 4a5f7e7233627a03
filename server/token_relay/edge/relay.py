"""The WebSocket edge: admits connections, feeds frames to the core, writes what it returns.

Endpoints
---------
* ``/produce[?channel=C]``: a producer (model gateway) pushes delta events.
* ``/subscribe[?channel=C[&deltas=1]]``: a subscriber (chat frontend) receives
  completed messages and, if asked, live deltas.
* ``GET /healthz``, ``/readyz``, ``/metrics``, and with ``--web-root`` the demo
  page; see :mod:`token_relay.edge.http` for admission (tokens, origins, limits).

Events
------
Producers' events go to the broker (:mod:`token_relay.brokers`), and the broker hands
every event of a channel this process listens to back to :meth:`on_frame`, own
events included, so every subscriber sees one order. A joining subscriber's
frames are buffered while the broker reads its catch-up cut; frames already in
the cut are dropped, the rest follow it: confirmation, replayed history,
snapshots, then the live stream, with no gap and no overlap.

Writes
------
Producer replies (``ack``, ``error``) are awaited, which gives each producer
backpressure. Frames to subscribers never wait: :mod:`token_relay.edge.writer` writes
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
import logging
import secrets
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from pydantic import MISSING
from websockets import CloseCode, State
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.typing import Origin

from ..brokers import Broker, FrameKind, open_broker
from ..core.errors import (
    BrokerUnavailable,
    ErrorCode,
    FrameRejected,
    binary_rejected,
    broker_rejected,
)
from ..core.grants import Grant
from ..core.hub import ChannelHub
from ..core.protocol import (
    AbortReason,
    Cancel,
    Snapshot,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    decode_subscriber_frame,
    encode,
)
from ..core.settings import Settings
from ..core.window import DeltaWindow
from .http import PRODUCE_PATH, SUBSCRIBE_PATH, Gate, query_of
from .metrics import Metrics
from .producers import ProducerLink, Producers
from .writer import Fanout

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
        self._background: set[asyncio.Task[Any]] = set()
        self.ingest = Producers(
            self.settings,
            self.broker,
            self.metrics,
            self.fanout,
            stopping=lambda: self._stopping,
            spawn=self._spawn,
        )
        self.server: Server | None = None
        self._joining: dict[tuple[ServerConnection, str], list[tuple[FrameKind, int, Any]]] = {}
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
                await self.ingest.abort_everything(AbortReason.SHUTDOWN)
                with contextlib.suppress(BrokerUnavailable):
                    await self.broker.flush()
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
                    await self.ingest.serve(
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
                    self.ingest.reject_now(connection, binary_rejected())
                    continue
                try:
                    request = decode_subscriber_frame(raw)
                except FrameRejected as exc:
                    self.ingest.reject_now(connection, exc)
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
            self.ingest.reject_now(connection, exc)

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
            raise broker_rejected(None) from None
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
            raise broker_rejected(frame.id) from None
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

    @property
    def producers(self) -> dict[str, ProducerLink]:
        """Producer sessions by owner, parked ones included."""
        return self.ingest.links

    def wants_deltas(self, channel: str) -> bool:
        """Whether a local subscriber of ``channel`` asked for deltas."""
        return bool(self.hub.delta_subscribers(channel))

    def on_cancel(self, owner: str, payload: str | bytes) -> None:
        """Pass a ``cancel`` frame to the local producer that owns the message."""
        self.ingest.cancel(owner, payload)

    def partial(self, owner: str, message_id: str) -> str | None:
        """The text so far of a local producer's message."""
        return self.ingest.partial(owner, message_id)

    def owned_messages(self) -> list[tuple[str, str, str]]:
        """Every message in progress on this process's producers."""
        return self.ingest.owned_messages()

    async def _expire_idle(self) -> None:
        """Abort messages with no event for ``idle_timeout`` seconds."""
        timeout = self.settings.idle_timeout
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(timeout / 4, 1.0))
            await self.ingest.expire_idle(loop.time() - timeout)

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
