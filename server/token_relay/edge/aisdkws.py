"""A server for the AI SDK's ``WebSocketChatTransport`` (``ai`` 7): ``ws://HOST/ai-sdk/ws``.

Theory of operation
-------------------
One WebSocket carries many requests of the transport, each named by its ``requestId``
and each about one chat, whose id (``id``) is the channel (the token must grant it). The
socket (:class:`AiSdkSocket`) is also a deltas subscriber of the channels its requests
are about: the subscriber endpoint joins it to a channel exactly as it joins an SSE
stream, and every frame of the channel it is sent becomes, through the request's
:class:`~token_relay.core.uistream.ReplyChunks` (the same that serves
``GET /ai-sdk/{channel}/stream``), ``chunk`` frames of the request's reply.

* ``resume`` joins the channel and serves its reply in progress from ``start``,
  compacted (one ``*-start``, one delta holding the text so far, the ``*-end`` where the
  part has ended), then live, then ``end``; ``no-active`` if none is in progress.
* ``send`` hands the chat's messages to a producer of the channel as a ``request`` frame
  (:class:`~token_relay.core.protocol.ChatRequest`) naming the id its reply must have,
  and serves that reply as it streams; ``error`` (``no_producer``) if no producer
  listens on the channel (one connected with ``?channel=`` naming it, on any process of
  the broker: the broker hands the request to the newest such producer, wherever it is
  connected; ``producer_busy`` if that one is not reading).
* ``abort`` is Stop: a ``cancel`` to the reply's producer, as ``POST /ai-sdk/{channel}/stop``
  sends. The reply then ends as its producer ends it, and its ``end`` follows.

Sequences
---------
A request's chunks are numbered from 0 (``start``), one by one, as the relay sends them:
the numbering belongs to the request. The relay remembers what it sent under each
``requestId`` (:data:`MAX_LOGGED_REQUESTS` requests, the first :data:`MAX_LOGGED_CHUNKS`
chunks and :data:`MAX_LOGGED_BYTES` bytes of each, :data:`MAX_LOGGED_TOTAL_BYTES` in all:
past that, new chunks are not remembered until older requests are forgotten). A ``resume``
that gives ``lastSequence: N`` continues request ``requestId``: the relay rebuilds what a reader
holds after its chunks 0 to N, and sends from N + 1 only what it lacks of the reply now
(:func:`~token_relay.core.uistream.catch_up_from`: the rest of each text, the parts and
ends it has not seen), then the live chunks, numbered on. A compacted replay of the same
reply made later numbers its chunks differently, so a sequence means something only for
the request that sent it; a ``requestId`` this process does not remember, or an N past
what it sent, is ``unknown_sequence``. Without ``lastSequence`` a resume is a new replay,
from ``start`` and sequence 0 (what the SDK's own transport always asks).

Bounds
------
* A frame is at most ``--max-frame-bytes`` (1009 past it, as every WebSocket).
* :data:`MAX_REQUESTS` requests in progress per connection, one per chat
  (``too_many_requests``, ``request_in_progress``); requests count against
  ``--max-subscribes-per-second`` as subscribes do (``rate_limited``).
* A ``send`` whose reply has not started within :data:`REPLY_START_SECONDS` fails
  (``error``, ``no_reply``).
* A frame that is not a request of the transport is answered with ``error`` if it names a
  ``requestId``; otherwise the connection is closed with 1008 (the transport has no way
  to say which request failed).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from pydantic import MISSING, BaseModel
from websockets import CloseCode

from ..core.chatframes import (
    ChatAbort,
    ChatChunk,
    ChatClientFrame,
    ChatEnd,
    ChatError,
    ChatNoActive,
    ChatResume,
    ChatSend,
    ChatStart,
    decode_chat_frame,
)
from ..core.errors import ErrorCode, FrameRejected
from ..core.grants import Grant
from ..core.protocol import ChatRequest, encode
from ..core.ratelimit import TokenBucket
from ..core.settings import Settings
from ..core.uistream import ReplyChunks, reader_state
from .broadcast import Broadcast
from .frames import text_frame
from .metrics import Metrics
from .producers import ProducerEndpoint
from .subscribers import SubscriberEndpoint
from .websocket import WebSocket
from .writer import Writer

__all__ = [
    "MAX_LOGGED_BYTES",
    "MAX_LOGGED_CHUNKS",
    "MAX_LOGGED_REQUESTS",
    "MAX_LOGGED_TOTAL_BYTES",
    "MAX_REQUESTS",
    "REPLY_START_SECONDS",
    "AiSdkSocket",
    "ChatEndpoint",
]

MAX_REQUESTS = 16
"""Requests in progress on one connection."""
REPLY_START_SECONDS = 30.0
"""How long a ``send`` waits for its producer to start the reply."""
MAX_LOGGED_REQUESTS = 1024
"""Requests whose chunks a process remembers, for ``lastSequence`` (the oldest go first)."""
MAX_LOGGED_CHUNKS = 10_000
"""Chunks remembered per request: a ``lastSequence`` past them is ``unknown_sequence``."""
MAX_LOGGED_BYTES = 1 << 20
"""Bytes of chunks (as JSON) remembered per request, likewise."""
MAX_LOGGED_TOTAL_BYTES = 64 << 20
"""Bytes of chunks remembered for all requests of the process."""


class AiSdkSocket(WebSocket):
    """The transport's WebSocket: its requests come in as messages; the frames of the
    channels it subscribes to go to :attr:`channel_frame`, never to the socket as such."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.channel_frame: Any = None
        """Takes each frame of a channel (as a dict), while the socket is served."""

    def take(self, broadcast: Broadcast) -> None:
        """A frame of a channel: to the request about it."""
        self._channel(broadcast.data())

    async def send(self, data: str | bytes) -> None:
        """A frame of a channel, from a backlog: to the request about it."""
        self._channel(data.encode() if isinstance(data, str) else data)
        await self.drain()

    def _channel(self, data: bytes) -> None:
        if self.channel_frame is not None:
            self.channel_frame(json.loads(data))

    def reply(self, frame: BaseModel) -> None:
        """Send one frame of the transport."""
        self.write_frame(text_frame(frame.model_dump_json().encode()))


@dataclass
class _Budget:
    """The bytes every request's log holds, together."""

    used: int = 0


@dataclass
class _Log:
    """What one request sent, for a later ``resume`` with ``lastSequence``."""

    budget: _Budget
    channel: str
    message_id: str | None = None
    chunks: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0
    full: bool = False


class _Request:
    """One request of a connection: the reply it serves, numbered."""

    def __init__(
        self,
        socket: AiSdkSocket,
        request_id: str,
        channel: str,
        log: _Log,
        *,
        wanted: str | None,
        first: int = 0,
        held: list[dict[str, Any]] | None = None,
    ) -> None:
        self.socket = socket
        self.request_id = request_id
        self.channel = channel
        self.log = log
        self.next = first
        self.started = False
        self.ended = False
        self.stop_asked = False
        self.timer: asyncio.TimerHandle | None = None
        self.on_end: Any = None
        self.on_serve: Any = None
        self.reply = ReplyChunks(
            wanted,
            self._emit,
            on_serve=self._serving,
            on_end=self._end,
            held=None if held is None else reader_state(held),
        )

    def _serving(self, message_id: str) -> None:
        self.log.message_id = message_id
        if self.timer is not None:
            self.timer.cancel()
        self._start()
        if self.on_serve is not None:
            self.on_serve(self)

    def _start(self) -> None:
        if not self.started:
            self.started = True
            self.socket.reply(ChatStart(requestId=self.request_id))

    def _emit(self, chunk: dict[str, Any]) -> None:
        sequence, self.next = self.next, self.next + 1
        data = ChatChunk(requestId=self.request_id, sequence=sequence, chunk=chunk)
        raw = data.model_dump_json().encode()
        log = self.log
        if not log.full and sequence == len(log.chunks):
            size, budget = len(raw), log.budget
            if (
                len(log.chunks) < MAX_LOGGED_CHUNKS
                and log.size + size <= MAX_LOGGED_BYTES
                and budget.used + size <= MAX_LOGGED_TOTAL_BYTES
            ):
                log.chunks.append(chunk)
                log.size += size
                budget.used += size
            else:
                log.full = True
        self.socket.write_frame(text_frame(raw))

    def _end(self) -> None:
        if self.ended:
            return
        self._start()
        self.socket.reply(ChatEnd(requestId=self.request_id))
        self.finish()

    def fail(self, code: str, message: str) -> None:
        """End the request with ``error``."""
        if self.ended:
            return
        self.socket.reply(ChatError(requestId=self.request_id, errorText=f"{code}: {message}"))
        self.finish()

    def no_active(self) -> None:
        """End a resume that found nothing in progress."""
        if not self.ended:
            self.socket.reply(ChatNoActive(requestId=self.request_id))
            self.finish()

    def finish(self) -> None:
        self.ended = True
        self.reply.stop()
        if self.timer is not None:
            self.timer.cancel()
        if self.on_end is not None:
            self.on_end(self)


class _Connection:
    """One transport connection's requests."""

    def __init__(self, socket: AiSdkSocket, grant: Grant, bucket: TokenBucket) -> None:
        self.socket = socket
        self.grant = grant
        self.bucket = bucket
        self.requests: dict[str, _Request] = {}
        self.by_channel: dict[str, _Request] = {}


class ChatEndpoint:
    """Every ``WebSocketChatTransport`` connection of one relay process."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        writer: Writer,
        subscribers: SubscriberEndpoint,
        producers: ProducerEndpoint,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.writer = writer
        self.subscribers = subscribers
        self.producers = producers
        self.logs: collections.OrderedDict[str, _Log] = collections.OrderedDict()
        """What each recent request sent, by ``requestId`` (bounded, oldest first)."""
        self.budget = _Budget()

    async def serve(self, socket: AiSdkSocket, grant: Grant) -> None:
        """Serve one transport connection until it ends."""
        loop = asyncio.get_running_loop()
        rate = self.settings.max_subscribes_per_second
        connection = _Connection(socket, grant, TokenBucket(rate, rate, loop.time()))

        def channel_frame(frame: dict[str, Any]) -> None:
            request = connection.by_channel.get(str(frame.get("channel")))
            if request is None:
                return
            kind = frame.get("type")
            if kind == "error":
                request.fail(str(frame.get("code")), str(frame.get("message")))
            elif kind not in ("subscribed", "unsubscribed"):
                try:
                    request.reply.frame(frame)
                except FrameRejected as exc:  # what the reader holds is not what the reply has
                    request.fail(exc.code.value, exc.message)

        socket.channel_frame = channel_frame
        try:
            async for raw in socket:
                self.metrics.frames_in_subscriber.inc()
                if not isinstance(raw, str):
                    socket.start_close(CloseCode.UNSUPPORTED_DATA, "text frames only")
                    break
                try:
                    frame = decode_chat_frame(raw)
                except FrameRejected as exc:
                    self.metrics.errors.labels(exc.code.value).inc()
                    if exc.message_id is None:
                        socket.start_close(CloseCode.POLICY_VIOLATION, exc.message[:120])
                        break
                    socket.reply(
                        ChatError(requestId=exc.message_id, errorText=f"{exc.code}: {exc.message}")
                    )
                    continue
                await self._answer(connection, frame)
        finally:
            socket.channel_frame = None
            for request in list(connection.requests.values()):
                request.ended = True
                request.reply.stop()
                if request.timer is not None:
                    request.timer.cancel()
            self.subscribers.forget(socket)

    async def _answer(self, connection: _Connection, frame: ChatClientFrame) -> None:
        if isinstance(frame, ChatAbort):
            request = connection.requests.get(frame.requestId)
            if request is not None:
                await self._stop(request)
            return
        try:
            self._admit(connection, frame)
            if isinstance(frame, ChatResume):
                await self._resume(connection, frame)
            else:
                await self._send(connection, frame)
        except FrameRejected as exc:
            self.metrics.errors.labels(exc.code.value).inc()
            request = connection.requests.get(frame.requestId)
            if request is not None:
                request.fail(exc.code.value, exc.message)
            else:
                connection.socket.reply(
                    ChatError(requestId=frame.requestId, errorText=f"{exc.code}: {exc.message}")
                )

    def _admit(self, connection: _Connection, frame: ChatSend | ChatResume) -> None:
        """The checks every request passes before it starts."""
        if not connection.bucket.take(asyncio.get_running_loop().time()):
            raise FrameRejected(
                ErrorCode.RATE_LIMITED,
                f"over {self.settings.max_subscribes_per_second:g} requests per second",
            )
        connection.grant.check(frame.id)
        if frame.requestId in connection.requests:
            raise FrameRejected(
                ErrorCode.REQUEST_IN_PROGRESS, f"request '{frame.requestId}' is in progress"
            )
        if frame.id in connection.by_channel:
            raise FrameRejected(
                ErrorCode.REQUEST_IN_PROGRESS,
                f"a request about chat '{frame.id}' is in progress on this connection",
            )
        if len(connection.requests) >= MAX_REQUESTS:
            raise FrameRejected(
                ErrorCode.TOO_MANY_REQUESTS,
                f"{MAX_REQUESTS} requests are in progress on this connection",
            )

    def _open(self, connection: _Connection, request: _Request) -> None:
        connection.requests[request.request_id] = request
        connection.by_channel[request.channel] = request

        def ended(request: _Request) -> None:
            connection.requests.pop(request.request_id, None)
            if connection.by_channel.get(request.channel) is request:
                del connection.by_channel[request.channel]
            # Not now: this runs while the channel's frame is being sent to its subscribers.
            asyncio.get_running_loop().call_soon(self._leave, connection, request.channel)

        def serving(request: _Request) -> None:
            if request.stop_asked:
                self.spawn_stop(request)

        request.on_end = ended
        request.on_serve = serving

    def _leave(self, connection: _Connection, channel: str) -> None:
        if channel not in connection.by_channel:
            self.subscribers.leave(connection.socket, channel)

    def _remember(self, request_id: str, log: _Log) -> None:
        old = self.logs.pop(request_id, None)
        if old is not None:
            self.budget.used -= old.size
        self.logs[request_id] = log
        self.budget.used += log.size
        while len(self.logs) > MAX_LOGGED_REQUESTS:
            _, forgotten = self.logs.popitem(last=False)
            self.budget.used -= forgotten.size

    async def _resume(self, connection: _Connection, frame: ChatResume) -> None:
        channel, held = frame.id, None
        wanted: str | None = None
        first, rewind = 0, 0
        if frame.lastSequence is not MISSING:
            log = self.logs.get(frame.requestId)
            last = frame.lastSequence
            if log is None or log.channel != channel or log.message_id is None:
                raise FrameRejected(
                    ErrorCode.UNKNOWN_SEQUENCE,
                    f"request '{frame.requestId}' of chat '{channel}' is not known here: "
                    "resume without lastSequence",
                )
            if last >= len(log.chunks):
                raise FrameRejected(
                    ErrorCode.UNKNOWN_SEQUENCE,
                    f"request '{frame.requestId}' sent {len(log.chunks)} chunks this relay "
                    f"remembers, not {last + 1}: resume without lastSequence",
                )
            held = log.chunks[: last + 1]
            wanted, first, rewind = log.message_id, last + 1, self.settings.history_size
            # What it holds is remembered as it was (its size too, as an upper bound).
            log = _Log(self.budget, channel, log.message_id, list(held), log.size, log.full)
        else:
            log = _Log(self.budget, channel)
        self._remember(frame.requestId, log)
        request = _Request(
            connection.socket, frame.requestId, channel, log, wanted=wanted, first=first, held=held
        )
        if held is not None:
            request.started = True  # the reader has the stream: it needs no second start
            connection.socket.reply(ChatStart(requestId=frame.requestId))
        self._open(connection, request)
        await self.subscribers.join(connection.socket, channel, rewind)
        if request.ended:
            return
        try:
            found = request.reply.decide()
        except FrameRejected as exc:  # what the reader holds is not what the reply has
            request.fail(exc.code.value, exc.message)
            return
        if not found:
            request.no_active()

    async def _send(self, connection: _Connection, frame: ChatSend) -> None:
        channel = frame.id
        reply_id = "chat-" + secrets.token_urlsafe(12)
        log = _Log(self.budget, channel)
        self._remember(frame.requestId, log)
        request = _Request(connection.socket, frame.requestId, channel, log, wanted=reply_id)
        self._open(connection, request)
        # Joined first: the reply's first chunk can't come before the join that serves it.
        await self.subscribers.join(connection.socket, channel, 0)
        if request.ended:
            return
        request.reply.decide()
        handed = ChatRequest(
            channel=channel,
            id=reply_id,
            request=frame.requestId,
            trigger=frame.trigger,
            message_id=frame.messageId,
            messages=frame.messages,
            body=frame.body,
            metadata=frame.metadata,
        )
        refused = await self.producers.hand_request(channel, encode(handed))
        if refused is ErrorCode.NO_PRODUCER:
            raise FrameRejected(refused, f"no producer listens on channel '{channel}'")
        if refused is not None:
            raise FrameRejected(refused, f"the producer of channel '{channel}' is not reading")
        if request.ended:
            return
        request.timer = asyncio.get_running_loop().call_later(
            REPLY_START_SECONDS, _no_reply, request
        )

    async def _stop(self, request: _Request) -> None:
        """Stop: the reply's producer gets a ``cancel``; its reply then ends."""
        request.stop_asked = True
        target = request.reply.target
        if target is None or request.ended:
            return  # stopped as soon as it starts (see serving)
        with contextlib.suppress(FrameRejected):  # it ended meanwhile
            await self.subscribers.stop(request.channel, target)

    def spawn_stop(self, request: _Request) -> None:
        """Stop a reply that started after its request was aborted."""
        task = asyncio.ensure_future(self._stop_started(request))
        task.add_done_callback(lambda done: done.cancelled() or done.exception())

    async def _stop_started(self, request: _Request) -> None:
        target = request.reply.target
        if target is not None:
            with contextlib.suppress(FrameRejected):
                await self.subscribers.stop(request.channel, target)


def _no_reply(request: _Request) -> None:
    """A ``send`` whose producer started no reply in time."""
    if request.reply.target is None:
        request.fail(
            ErrorCode.NO_REPLY.value,
            f"the producer started no reply within {REPLY_START_SECONDS:g} s",
        )
