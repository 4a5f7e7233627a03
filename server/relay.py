"""The WebSocket edge: routes connections, feeds frames to the core, writes what it returns.

Endpoints
---------
* ``/produce[?channel=C]``: a producer (model gateway) pushes delta events.
* ``/subscribe[?channel=C[&deltas=1]]``: a subscriber (chat frontend) receives
  completed messages and, if asked, live deltas.
* ``GET /healthz`` (the process is up) and ``GET /readyz`` (its broker is
  reachable), and with ``--web-root`` the files of that folder (``/`` is
  ``index.html``).

Anything else is answered with HTTP 404 before the handshake, and a malformed
``channel`` query with HTTP 400.

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
backpressure. Frames to subscribers never wait: each is serialized once and
handed to websockets' ``broadcast()``. A peer whose unsent bytes exceed
``max_subscriber_buffer_bytes`` is dropped from every channel and closed with
1013 (try again later), so one stuck reader can neither stall the others nor
grow the relay's memory without bound; it can resume by offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections.abc import Coroutine, Iterable
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

from pydantic import MISSING
from websockets import CloseCode
from websockets.asyncio.server import Server, ServerConnection, broadcast, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from .broker import Broker, FrameKind, open_broker
from .errors import BrokerUnavailable, ErrorCode, FrameRejected
from .hub import ChannelHub
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
    encode_unpositioned,
)
from .settings import Settings
from .web import StaticFiles

__all__ = ["PRODUCE_PATH", "SUBSCRIBE_PATH", "Relay"]

log = logging.getLogger("token_relay")

PRODUCE_PATH = "/produce"
SUBSCRIBE_PATH = "/subscribe"
SLOW_CONSUMER_REASON = "slow consumer: outgoing buffer over limit; resume by offset"
BROKER_RESTORED_REASON = "broker reconnected: resume by offset"
MAX_JOIN_BUFFER = 10_000
"""Frames buffered for one joining subscription while its catch-up is read."""
_TRUE = frozenset({"1", "true", "yes", "on"})


class _Producer(NamedTuple):
    connection: ServerConnection
    session: ProducerSession


def _query(path: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(path).query, keep_blank_values=True)


def _binary_rejected() -> FrameRejected:
    return FrameRejected(
        ErrorCode.BINARY_NOT_SUPPORTED, "binary frames are not supported; send JSON text frames"
    )


def _broker_rejected(message_id: str | None) -> FrameRejected:
    return FrameRejected(
        ErrorCode.BROKER_UNAVAILABLE,
        "the relay's broker is unreachable; nothing was published, retry shortly",
        message_id,
    )


def _error_frame(exc: FrameRejected) -> str:
    return encode(ErrorFrame(code=exc.code, message=exc.message, id=exc.message_id))


class Relay:
    """One relay process: local connections and subscriptions, joined by a broker."""

    def __init__(self, settings: Settings | None = None, broker: Broker | None = None) -> None:
        self.settings = settings or Settings()
        self.broker = broker or open_broker(self.settings, secrets.token_hex(4))
        self.hub: ChannelHub[ServerConnection] = ChannelHub(
            self.settings.max_channels_per_subscriber
        )
        self.producers: dict[str, _Producer] = {}
        self.web = StaticFiles(Path(self.settings.web_root)) if self.settings.web_root else None
        self.server: Server | None = None
        self._joining: dict[tuple[ServerConnection, str], list[tuple[FrameKind, int, Any]]] = {}
        self._owner_numbers = itertools.count(1)
        self._background: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Server:
        """Connect the broker and start listening."""
        await self.broker.start(self)
        self.server = await serve(
            self._handle,
            self.settings.host,
            self.settings.port,
            process_request=self._check_request,
            max_size=self.settings.max_frame_bytes,
            # Frames are small and mostly unique; deflate would cost CPU and ~50 KiB per
            # connection for little gain, so it is off for every endpoint.
            compression=None,
            reuse_port=self.settings.workers > 1 or None,
        )
        self._sweeper = asyncio.create_task(self._expire_idle())
        return self.server

    async def stop(self) -> None:
        """Close every connection (1001), then the broker."""
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
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

    # ------------------------------------------------------------------ handshake

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        if path == "/healthz":
            return connection.respond(HTTPStatus.OK, "ok\n")
        if path == "/readyz":
            if self.broker.healthy:
                return connection.respond(HTTPStatus.OK, "ready\n")
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "broker unreachable\n")
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
        owner = f"{self.broker.instance}.{next(self._owner_numbers)}"
        session = ProducerSession(
            channel,
            max_streaming=self.settings.max_streaming_per_producer,
            max_completed=self.settings.max_completed_per_producer,
        )
        self.producers[owner] = _Producer(connection, session)
        # Completed here but not yet published (the broker was down): a repeated final retries.
        unpublished: dict[str, None] = {}
        loop = asyncio.get_running_loop()
        broker = self.broker
        try:
            async for raw in connection:
                try:
                    if isinstance(raw, bytes):
                        raise _binary_rejected()
                    applied = session.receive(decode_producer_event(raw), loop.time())
                    channel_name, message_id, text = (
                        applied.channel,
                        applied.message_id,
                        applied.text,
                    )
                    if applied.opened and text is None:
                        broker.open(channel_name, owner, message_id)
                    if applied.delta:
                        frame = DeltaFrame(channel=channel_name, id=message_id, delta=applied.delta)
                        broker.delta(channel_name, owner, message_id, applied.delta, encode(frame))
                    if text is None:
                        continue
                    if applied.first_completion or message_id in unpublished:
                        body = encode_unpositioned(
                            MessageFrame(
                                channel=channel_name, id=message_id, text=text, offset=0, epoch=""
                            )
                        )
                        try:
                            await broker.terminal(channel_name, owner, message_id, body)
                        except BrokerUnavailable:
                            unpublished[message_id] = None
                            if len(unpublished) > self.settings.max_completed_per_producer:
                                del unpublished[next(iter(unpublished))]
                            raise _broker_rejected(message_id) from None
                        unpublished.pop(message_id, None)
                except FrameRejected as exc:
                    await connection.send(_error_frame(exc))
                    continue
                await connection.send(encode(Ack(id=message_id, channel=channel_name)))
        finally:
            del self.producers[owner]
            for unfinished in session.close():
                await self._abort(owner, unfinished, AbortReason.PRODUCER_DISCONNECTED)

    async def _abort(self, owner: str, unfinished: Unfinished, reason: AbortReason) -> None:
        frame = Aborted(
            channel=unfinished.channel,
            id=unfinished.message_id,
            text=unfinished.text,
            reason=reason,
            offset=0,
            epoch="",
        )
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
        self, connection: ServerConnection, initial: list[Subscribe]
    ) -> None:
        try:
            for frame in initial:
                await self._answer(connection, frame)
            async for raw in connection:
                if isinstance(raw, bytes):
                    self._deliver([connection], _error_frame(_binary_rejected()))
                    continue
                try:
                    request = decode_subscriber_frame(raw)
                except FrameRejected as exc:
                    self._deliver([connection], _error_frame(exc))
                    continue
                await self._answer(connection, request)
        finally:
            channels = list(self.hub.channels(connection))
            self.hub.remove(connection)
            for channel in channels:
                await self._update_interest(channel)

    async def _answer(
        self, connection: ServerConnection, frame: Subscribe | Unsubscribe | Cancel
    ) -> None:
        try:
            if isinstance(frame, Subscribe):
                await self._subscribe(connection, frame)
            elif isinstance(frame, Unsubscribe):
                self.hub.unsubscribe(connection, frame.channel)
                self._deliver([connection], encode(Unsubscribed(channel=frame.channel)))
                await self._update_interest(frame.channel)
            else:
                await self._cancel(connection, frame)
        except FrameRejected as exc:
            self._deliver([connection], _error_frame(exc))

    async def _subscribe(self, connection: ServerConnection, frame: Subscribe) -> None:
        """Subscribe; send the confirmation, replayed history, snapshots, then what followed."""
        channel = frame.channel
        was_subscribed = not self.hub.subscribe(connection, channel, frame.deltas)
        key = (connection, channel)
        self._joining[key] = []
        try:
            await self._update_interest(channel)
            since = None if frame.since is MISSING else (frame.since.offset, frame.since.epoch)
            cut = await self.broker.catch_up(channel, since, frame.deltas)
        except BrokerUnavailable:
            self._joining.pop(key, None)
            if not was_subscribed:
                self.hub.unsubscribe(connection, channel)
                await self._update_interest(channel)
            raise _broker_rejected(None) from None
        buffered = self._joining.pop(key, None)
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
        self._deliver_each(connection, replies)

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
        hub = self.hub
        receivers = (
            hub.subscribers(channel)
            if kind is FrameKind.TERMINAL
            else hub.delta_subscribers(channel)
        )
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
                    self._drop(receiver, CloseCode.TRY_AGAIN_LATER, SLOW_CONSUMER_REASON)
            receivers = ready  # type: ignore[assignment]
        self._deliver(receivers, payload)

    def on_cancel(self, owner: str, payload: str | bytes) -> None:
        """Pass a ``cancel`` frame to the local producer that owns the message."""
        producer = self.producers.get(owner)
        if producer is not None:
            self._deliver([producer.connection], payload)

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

    def on_restored(self) -> None:
        """Events may have been missed during a broker outage: have subscribers resume."""
        subscribers = list(self.hub.subscriber_handles())
        if subscribers:
            log.warning("broker restored: closing %d subscribers so they resume", len(subscribers))
        for connection in subscribers:
            self._drop(connection, CloseCode.SERVICE_RESTART, BROKER_RESTORED_REASON)

    # ---------------------------------------------------------------- fan-out

    def _deliver_each(self, connection: ServerConnection, payloads: Iterable[str | bytes]) -> None:
        for payload in payloads:
            self._deliver([connection], payload)

    def _deliver(self, receivers: Iterable[ServerConnection], payload: str | bytes) -> None:
        limit = self.settings.max_subscriber_buffer_bytes
        ready: list[ServerConnection] = []
        slow: list[ServerConnection] = []
        for receiver in receivers:
            transport = receiver.transport
            if transport is not None and transport.get_write_buffer_size() > limit:
                slow.append(receiver)
            else:
                ready.append(receiver)
        broadcast(ready, payload, text=True)
        for connection in slow:
            log.warning("closing slow peer %s: outgoing buffer over limit", connection.id)
            self._drop(connection, CloseCode.TRY_AGAIN_LATER, SLOW_CONSUMER_REASON)

    def _drop(self, connection: ServerConnection, code: CloseCode, reason: str) -> None:
        self.hub.remove(connection)
        for key in [key for key in self._joining if key[0] is connection]:
            del self._joining[key]
        self._spawn(connection.close(code, reason))

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
