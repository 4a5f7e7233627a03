"""The WebSocket edge: routes connections, feeds frames to the core, writes what it returns.

Endpoints
---------
* ``/produce[?channel=C]``: a producer (model gateway) pushes delta events.
* ``/subscribe[?channel=C]``: a subscriber (chat frontend) receives completed messages.

Anything else is answered with HTTP 404 before the handshake, and a malformed
``channel`` query with HTTP 400.

Writes
------
Producer replies (``ack``, ``error``) are awaited, which gives each producer
backpressure. Frames to subscribers never wait: a completed message is
serialized once and handed to websockets' ``broadcast()``. A subscriber whose
unsent bytes exceed ``max_subscriber_buffer_bytes`` is dropped from every
channel and closed with 1013 (try again later), so one stuck reader can neither
stall the others nor grow the relay's memory without bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel
from websockets import CloseCode
from websockets.asyncio.server import Server, ServerConnection, broadcast, serve
from websockets.http11 import Request, Response

from .errors import ErrorCode, FrameRejected
from .hub import ChannelHub
from .producer import ProducerSession
from .protocol import (
    MAX_NAME_LENGTH,
    Ack,
    ErrorFrame,
    MessageFrame,
    Subscribe,
    Subscribed,
    Unsubscribed,
    decode_producer_event,
    decode_subscriber_frame,
    encode,
)
from .settings import Settings

__all__ = ["PRODUCE_PATH", "SUBSCRIBE_PATH", "Relay"]

log = logging.getLogger("token_relay")

PRODUCE_PATH = "/produce"
SUBSCRIBE_PATH = "/subscribe"
SLOW_CONSUMER_REASON = "slow consumer: outgoing buffer over limit; reconnect"


def _query_channels(path: str) -> list[str]:
    """The ``channel`` values of a request path's query string (may repeat)."""
    return parse_qs(urlsplit(path).query, keep_blank_values=True).get("channel", [])


def _binary_rejected() -> FrameRejected:
    return FrameRejected(
        ErrorCode.BINARY_NOT_SUPPORTED, "binary frames are not supported; send JSON text frames"
    )


def _error_frame(exc: FrameRejected) -> str:
    return encode(ErrorFrame(code=exc.code, message=exc.message, id=exc.message_id))


class Relay:
    """A single relay process: the channel hub and the two WebSocket endpoints."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.hub: ChannelHub[ServerConnection] = ChannelHub(
            self.settings.max_channels_per_subscriber
        )
        self._closing: set[asyncio.Task[None]] = set()

    async def start(self) -> Server:
        """Start listening. The caller owns the returned server and must close it."""
        return await serve(
            self._handle,
            self.settings.host,
            self.settings.port,
            process_request=self._check_request,
            max_size=self.settings.max_frame_bytes,
            # Frames are small and mostly unique; deflate would cost CPU and ~50 KiB per
            # connection for little gain, so it is off for every endpoint.
            compression=None,
        )

    # ------------------------------------------------------------------ handshake

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path not in (PRODUCE_PATH, SUBSCRIBE_PATH):
            return connection.respond(
                HTTPStatus.NOT_FOUND, f"no endpoint at {path}; use /produce or /subscribe\n"
            )
        channels = _query_channels(request.path)
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
        if urlsplit(connection.request.path).path == PRODUCE_PATH:  # type: ignore[union-attr]
            await self._serve_producer(connection)
        else:
            await self._serve_subscriber(connection)

    # ------------------------------------------------------------------ producers

    async def _serve_producer(self, connection: ServerConnection) -> None:
        channels = _query_channels(connection.request.path)  # type: ignore[union-attr]
        session = ProducerSession(
            channels[0] if channels else None,
            max_streaming=self.settings.max_streaming_per_producer,
            max_completed=self.settings.max_completed_per_producer,
        )
        try:
            async for raw in connection:
                try:
                    if isinstance(raw, bytes):
                        raise _binary_rejected()
                    applied = session.receive(decode_producer_event(raw))
                except FrameRejected as exc:
                    await connection.send(_error_frame(exc))
                    continue
                if applied.text is None:
                    continue
                if applied.first_completion:
                    self.publish(
                        applied.channel,
                        MessageFrame(
                            channel=applied.channel, id=applied.message_id, text=applied.text
                        ),
                    )
                await connection.send(encode(Ack(id=applied.message_id, channel=applied.channel)))
        finally:
            session.close()

    # ---------------------------------------------------------------- subscribers

    async def _serve_subscriber(self, connection: ServerConnection) -> None:
        try:
            for channel in _query_channels(connection.request.path):  # type: ignore[union-attr]
                try:
                    self._subscribe(connection, channel)
                except FrameRejected as exc:
                    self._deliver([connection], _error_frame(exc))
            async for raw in connection:
                try:
                    if isinstance(raw, bytes):
                        raise _binary_rejected()
                    frame = decode_subscriber_frame(raw)
                    if isinstance(frame, Subscribe):
                        self._subscribe(connection, frame.channel)
                    else:
                        self.hub.unsubscribe(connection, frame.channel)
                        self._deliver([connection], encode(Unsubscribed(channel=frame.channel)))
                except FrameRejected as exc:
                    self._deliver([connection], _error_frame(exc))
        finally:
            self.hub.remove(connection)

    def _subscribe(self, connection: ServerConnection, channel: str) -> None:
        # Confirm and subscribe with no await in between, so the confirmation is
        # written before any message of the channel.
        self.hub.subscribe(connection, channel)
        self._deliver([connection], encode(Subscribed(channel=channel)))

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
        log.warning("closing slow subscriber %s: outgoing buffer over limit", connection.id)
        task = asyncio.get_running_loop().create_task(
            connection.close(CloseCode.TRY_AGAIN_LATER, SLOW_CONSUMER_REASON)
        )
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
