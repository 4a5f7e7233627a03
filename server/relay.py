"""The WebSocket edge: routes connections, feeds frames to the core, writes what it returns.

Endpoints
---------
* ``/produce[?channel=C]``: a producer (model gateway) pushes delta events.
* ``/subscribe[?channel=C[&deltas=1]]``: a subscriber (chat frontend) receives
  completed messages and, if asked, live deltas.
* with ``--web-root``, plain HTTP ``GET`` of the files in that folder (``/`` is
  ``index.html``).

Anything else is answered with HTTP 404 before the handshake, and a malformed
``channel`` query with HTTP 400.

Ordering
--------
Everything a subscriber is sent while it subscribes (confirmation, replayed
history, snapshots) is written in one synchronous step together with its entry
in the hub, so no delta or message can slip in between: snapshot plus deltas is
the text, with no gap and no overlap.

Writes
------
Producer replies (``ack``, ``error``) are awaited, which gives each producer
backpressure. Frames to subscribers never wait: each frame is serialized once
and handed to websockets' ``broadcast()``. A peer whose unsent bytes exceed
``max_subscriber_buffer_bytes`` is dropped from every channel and closed with
1013 (try again later), so one stuck reader can neither stall the others nor
grow the relay's memory without bound; it can resume by offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from pydantic import MISSING, BaseModel
from websockets import CloseCode
from websockets.asyncio.server import Server, ServerConnection, broadcast, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from .errors import ErrorCode, FrameRejected
from .history import HistoryStore
from .hub import ChannelHub
from .inflight import InflightIndex
from .producer import ProducerSession, Unfinished
from .protocol import (
    MAX_NAME_LENGTH,
    Aborted,
    AbortReason,
    Ack,
    Cancel,
    DeltaFrame,
    ErrorFrame,
    MessageFrame,
    Snapshot,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    decode_producer_event,
    decode_subscriber_frame,
    encode,
)
from .settings import Settings
from .web import StaticFiles

__all__ = ["PRODUCE_PATH", "SUBSCRIBE_PATH", "Relay"]

log = logging.getLogger("token_relay")

PRODUCE_PATH = "/produce"
SUBSCRIBE_PATH = "/subscribe"
SLOW_CONSUMER_REASON = "slow consumer: outgoing buffer over limit; resume by offset"
_TRUE = frozenset({"1", "true", "yes", "on"})


def _query(path: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(path).query, keep_blank_values=True)


def _binary_rejected() -> FrameRejected:
    return FrameRejected(
        ErrorCode.BINARY_NOT_SUPPORTED, "binary frames are not supported; send JSON text frames"
    )


def _error_frame(exc: FrameRejected) -> str:
    return encode(ErrorFrame(code=exc.code, message=exc.message, id=exc.message_id))


class Relay:
    """A single relay process: the channel hub, history, and the WebSocket endpoints."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.hub: ChannelHub[ServerConnection] = ChannelHub(
            self.settings.max_channels_per_subscriber
        )
        self.history = HistoryStore(
            size=self.settings.history_size,
            ttl=self.settings.history_ttl,
            max_channels=self.settings.max_history_channels,
        )
        self.inflight: InflightIndex[ServerConnection] = InflightIndex()
        self.producers: dict[ServerConnection, ProducerSession] = {}
        self.web = StaticFiles(Path(self.settings.web_root)) if self.settings.web_root else None
        self._background: set[asyncio.Task[None]] = set()

    async def start(self) -> Server:
        """Start listening. The caller owns the returned server and must close it."""
        server = await serve(
            self._handle,
            self.settings.host,
            self.settings.port,
            process_request=self._check_request,
            max_size=self.settings.max_frame_bytes,
            # Frames are small and mostly unique; deflate would cost CPU and ~50 KiB per
            # connection for little gain, so it is off for every endpoint.
            compression=None,
        )
        self._spawn(self._expire_idle(server))
        return server

    # ------------------------------------------------------------------ handshake

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path not in (PRODUCE_PATH, SUBSCRIBE_PATH):
            page = self.web.respond(connection, path) if self.web else None
            return page or connection.respond(
                HTTPStatus.NOT_FOUND, f"no endpoint at {path}; use /produce or /subscribe\n"
            )
        channels = _query(request.path).get("channel", [])
        if path == PRODUCE_PATH and len(channels) > 1:
            return connection.respond(HTTPStatus.BAD_REQUEST, "give at most one ?channel=\n")
        for channel in channels:
            if not 1 <= len(channel) <= MAX_NAME_LENGTH:
                return connection.respond(
                    HTTPStatus.BAD_REQUEST,
                    f"?channel= must be 1 to {MAX_NAME_LENGTH} characters\n",
                )
        return None

    async def _handle(self, connection: ServerConnection) -> None:
        request = connection.request
        assert request is not None  # the handshake is done
        query = _query(request.path)
        # A peer that vanishes without a close frame ends its handler; that is the
        # world's doing (trio would say Broken), not an error of ours to log.
        with contextlib.suppress(ConnectionClosed):
            if urlsplit(request.path).path == PRODUCE_PATH:
                channels = query.get("channel")
                await self._serve_producer(connection, channels[0] if channels else None)
            else:
                deltas = query.get("deltas", ["0"])[-1].lower() in _TRUE
                initial = [
                    Subscribe(type="subscribe", channel=c, deltas=deltas)
                    for c in query.get("channel", [])
                ]
                await self._serve_subscriber(connection, initial)

    # ------------------------------------------------------------------ producers

    async def _serve_producer(self, connection: ServerConnection, channel: str | None) -> None:
        session = ProducerSession(
            channel,
            max_streaming=self.settings.max_streaming_per_producer,
            max_completed=self.settings.max_completed_per_producer,
        )
        self.producers[connection] = session
        loop = asyncio.get_running_loop()
        try:
            async for raw in connection:
                try:
                    if isinstance(raw, bytes):
                        raise _binary_rejected()
                    applied = session.receive(decode_producer_event(raw), loop.time())
                except FrameRejected as exc:
                    await connection.send(_error_frame(exc))
                    continue
                channel_name, message_id = applied.channel, applied.message_id
                if applied.opened and applied.text is None:
                    self.inflight.add(channel_name, connection, message_id)
                if applied.delta:
                    receivers = self.hub.delta_subscribers(channel_name)
                    if receivers:
                        frame = DeltaFrame(channel=channel_name, id=message_id, delta=applied.delta)
                        self._deliver(receivers, encode(frame))
                if applied.text is None:
                    continue
                if applied.first_completion:
                    if not applied.opened:
                        self.inflight.remove(channel_name, connection, message_id)
                    self._publish_message(channel_name, message_id, applied.text)
                await connection.send(encode(Ack(id=message_id, channel=channel_name)))
        finally:
            del self.producers[connection]
            for unfinished in session.close():
                self._abort(connection, unfinished, AbortReason.PRODUCER_DISCONNECTED)

    def _publish_message(self, channel: str, message_id: str, text: str) -> None:
        payload = self.history.record(
            channel,
            asyncio.get_running_loop().time(),
            lambda offset, epoch: encode(
                MessageFrame(channel=channel, id=message_id, text=text, offset=offset, epoch=epoch)
            ),
        )
        self._deliver(self.hub.subscribers(channel), payload)

    def _abort(self, owner: ServerConnection, unfinished: Unfinished, reason: AbortReason) -> None:
        channel, message_id = unfinished.channel, unfinished.message_id
        self.inflight.remove(channel, owner, message_id)
        payload = self.history.record(
            channel,
            asyncio.get_running_loop().time(),
            lambda offset, epoch: encode(
                Aborted(
                    channel=channel,
                    id=message_id,
                    text=unfinished.text,
                    reason=reason,
                    offset=offset,
                    epoch=epoch,
                )
            ),
        )
        self._deliver(self.hub.subscribers(channel), payload)

    async def _expire_idle(self, server: Server) -> None:
        """Abort messages with no event for ``idle_timeout`` seconds, until the server closes."""
        timeout = self.settings.idle_timeout
        interval = min(timeout / 4, 1.0)
        loop = asyncio.get_running_loop()
        closed = asyncio.ensure_future(server.wait_closed())
        try:
            while not closed.done():
                await asyncio.wait([closed], timeout=interval)
                deadline = loop.time() - timeout
                for owner, session in list(self.producers.items()):
                    for unfinished in session.expire(deadline):
                        self._abort(owner, unfinished, AbortReason.IDLE_TIMEOUT)
        finally:
            closed.cancel()

    # ---------------------------------------------------------------- subscribers

    async def _serve_subscriber(
        self, connection: ServerConnection, initial: list[Subscribe]
    ) -> None:
        try:
            for frame in initial:
                self._answer(connection, frame)
            async for raw in connection:
                if isinstance(raw, bytes):
                    self._deliver([connection], _error_frame(_binary_rejected()))
                    continue
                try:
                    request = decode_subscriber_frame(raw)
                except FrameRejected as exc:
                    self._deliver([connection], _error_frame(exc))
                    continue
                self._answer(connection, request)
        finally:
            self.hub.remove(connection)

    def _answer(
        self, connection: ServerConnection, frame: Subscribe | Unsubscribe | Cancel
    ) -> None:
        try:
            if isinstance(frame, Subscribe):
                replies = self._subscribe(connection, frame)
            elif isinstance(frame, Unsubscribe):
                self.hub.unsubscribe(connection, frame.channel)
                replies = [encode(Unsubscribed(channel=frame.channel))]
            else:
                self._cancel(connection, frame)
                return
        except FrameRejected as exc:
            replies = [_error_frame(exc)]
        for payload in replies:
            self._deliver([connection], payload)

    def _subscribe(self, connection: ServerConnection, frame: Subscribe) -> list[str]:
        """Subscribe, and return what to send first: confirmation, replay, snapshots."""
        channel = frame.channel
        channel_log = self.history.log(channel, asyncio.get_running_loop().time())
        self.hub.subscribe(connection, channel, frame.deltas)
        replayed: list[str] = []
        if frame.since is MISSING:
            confirmation = Subscribed(
                channel=channel, offset=channel_log.offset, epoch=channel_log.epoch
            )
        else:
            replay = channel_log.replay(frame.since.offset, frame.since.epoch)
            replayed = replay.frames
            confirmation = Subscribed(
                channel=channel,
                offset=replay.offset,
                epoch=replay.epoch,
                recovered=replay.recovered,
            )
        replies = [encode(confirmation), *replayed]
        if frame.deltas:
            positions = {} if frame.positions is MISSING else frame.positions
            for owner, message_id in self.inflight.in_channel(channel):
                text = self.producers[owner].partial(message_id) or ""
                held = positions.get(message_id)
                if held is not None and held <= len(text):
                    snapshot = Snapshot(
                        channel=channel, id=message_id, text=text[held:], from_=held
                    )
                else:
                    snapshot = Snapshot(channel=channel, id=message_id, text=text)
                replies.append(encode(snapshot))
        return replies

    def _cancel(self, connection: ServerConnection, frame: Cancel) -> None:
        if not self.hub.is_subscribed(connection, frame.channel):
            raise FrameRejected(
                ErrorCode.NOT_SUBSCRIBED,
                f"subscribe to channel '{frame.channel}' before cancelling its messages",
                frame.id,
            )
        owners = self.inflight.owners(frame.channel, frame.id)
        if not owners:
            raise FrameRejected(
                ErrorCode.UNKNOWN_MESSAGE,
                f"no message '{frame.id}' is in progress on channel '{frame.channel}'",
                frame.id,
            )
        self._deliver(owners, encode(frame))

    # ---------------------------------------------------------------- fan-out

    def publish(self, channel: str, frame: BaseModel) -> None:
        """Serialize ``frame`` once and send it to every subscriber of ``channel``."""
        receivers = self.hub.subscribers(channel)
        if receivers:
            self._deliver(receivers, encode(frame))

    def _deliver(self, receivers: Iterable[ServerConnection], payload: str) -> None:
        limit = self.settings.max_subscriber_buffer_bytes
        ready: list[ServerConnection] = []
        slow: list[ServerConnection] = []
        for receiver in receivers:
            transport = receiver.transport
            if transport is not None and transport.get_write_buffer_size() > limit:
                slow.append(receiver)
            else:
                ready.append(receiver)
        broadcast(ready, payload)
        for connection in slow:
            self._drop_slow(connection)

    def _drop_slow(self, connection: ServerConnection) -> None:
        self.hub.remove(connection)
        log.warning("closing slow peer %s: outgoing buffer over limit", connection.id)
        self._spawn(connection.close(CloseCode.TRY_AGAIN_LATER, SLOW_CONSUMER_REASON))

    def _spawn(self, coroutine: object) -> None:
        task = asyncio.ensure_future(coroutine)  # type: ignore[call-overload]
        self._background.add(task)
        task.add_done_callback(self._background.discard)
