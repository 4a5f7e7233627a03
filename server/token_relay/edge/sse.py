"""A subscriber over Server-Sent Events: ``GET /sse?channel=C[&channel=D…][&deltas=1]``.

Every frame a WebSocket subscriber would get is one event, ``event: <type>`` with
``data: <the same JSON>``, in the same order, with the same snapshots and the same
exactly-once rules: an :class:`SseStream` stands where a
:class:`~token_relay.edge.websocket.WebSocket` would, for the router and the writer.

Every ``subscribed``, ``message`` and ``aborted`` event carries an ``id:``, a resume
token holding the position of every channel of the stream
(:mod:`token_relay.core.resume`). A ``subscribed`` event's id points before what its
join replays, so a stream cut after it, before its first message (or during a replay),
resumes with nothing missed; cut before even that, a client has no id and comes back new.
A browser's
``EventSource`` sends the last one back as ``Last-Event-ID`` when it reconnects, and
``?since=TOKEN`` does the same for clients that can't set headers: each channel is
resumed exactly as ``since`` resumes it on a WebSocket.

A comment line every ``--sse-heartbeat`` seconds keeps proxies from timing the stream
out. The slow-subscriber policy applies as on WebSockets: a stream whose unsent bytes
pass ``--max-subscriber-buffer-bytes`` is ended, and its client resumes by its last id.
An ended stream (shutdown, slow reader) finishes its chunked response after a comment
naming the WebSocket close code it stands for, and closes its socket. A stream that ends
normally (code 1000: an AI SDK reply, or its 204) leaves a kept-alive connection open: the
socket goes back to HTTP for the next request, which may already be waiting (pipelined).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from websockets import CloseCode

from ..core.grants import Grant
from ..core.resume import encode_positions
from .broadcast import Broadcast, Fields, event_fields
from .flow import SocketPeer
from .http11 import Http11

__all__ = ["RETRY_MS", "SSE_HEADERS", "SseStream", "event_fields"]

MAX_HELD_BYTES = 16 * 1024
"""What a client may send ahead (its next requests) while its stream runs, before its
socket is no longer read."""

RETRY_MS = 1000
"""Sent first on every stream (``retry:``): how soon a browser reconnects after a cut."""

SSE_HEADERS = (
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
    ("Server", "token-relay"),
)


def _chunk(body: bytes) -> bytes:
    """``body`` as one chunk of a chunked response."""
    return b"%x\r\n%b\r\n" % (len(body), body)


class SseStream(SocketPeer):
    """One SSE response: frames out as events, nothing in."""

    sse = True
    """How the writer tells a stream from a WebSocket."""

    def __init__(
        self,
        transport: asyncio.Transport,
        http: Http11,
        *,
        path: str,
        client: str,
        grant: Grant,
        positions: dict[str, tuple[int, str]],
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(transport, path=path, client=client, grant=grant)
        self.http = http
        self.headers = headers
        """Headers every response head of this stream carries (CORS)."""
        self.positions = positions
        """Every channel's position so far: what the next ``id:`` holds."""
        self.close_received = False
        self.head_sent = False
        self.chunked = False
        """Whether the response is chunked (HTTP/1.1): then events are framed here."""
        self._code: int | None = None
        self._ended = False
        self.completed: Callable[[SseStream], None] | None = None
        """Called when the response is complete and its connection is kept alive: the socket
        goes back to HTTP, for the next request."""
        self._held = 0

    # ------------------------------------------------------------------ state

    @property
    def open(self) -> bool:
        """Whether events may still be sent."""
        return not self._ended and not self.transport.is_closing()

    @property
    def close_code(self) -> int | None:
        """The WebSocket code the end stands for: ours, or 1006 if the client went away."""
        if self._code is not None:
            return self._code
        return CloseCode.ABNORMAL_CLOSURE if self._closed.done() else None

    # ------------------------------------------------------------------ events out

    def start(self) -> None:
        """The response head, then the stream's first line: how soon to reconnect."""
        self._head(200, SSE_HEADERS)
        self._write(f"retry: {RETRY_MS}\n\n".encode())

    def _head(self, status: int, headers: tuple[tuple[str, str], ...]) -> None:
        self.transport.write(self.http.respond(status, [*headers, *self.headers]))
        self.chunked = self.http.chunked
        self.head_sent = True

    def take(self, broadcast: Broadcast) -> None:
        """Send a frame sent to many peers as an event: its fields are read once, by the
        first stream, and its chunk built once, by the first stream it is the same for."""
        fields = broadcast.fields
        if fields is None:
            fields = broadcast.fields = event_fields(broadcast.data())
        channel, positions = fields.channel, self.positions
        if channel is not None:
            if fields.offset < 0:
                positions.pop(channel, None)
            else:
                positions[channel] = fields.position
        if self._ended or self.transport.is_closing():
            return
        if self.chunked and len(positions) <= fields.shared:
            chunk = fields.chunk
            if chunk is None:
                chunk = fields.chunk = _chunk(self._event(broadcast.data(), fields))
            self.write_now(chunk)
            return
        body = self._event(broadcast.data(), fields)
        if self.chunked:
            self.write_now(_chunk(body))  # what the writer writes for a chunk
        else:
            self._write(body)

    def write_event(self, data: bytes, fields: Fields | None = None) -> Fields | None:
        """Send one frame as an event; returns what was read of it, for the next stream."""
        broadcast = Broadcast(data)
        broadcast.fields = fields
        self.take(broadcast)
        return broadcast.fields

    def _event(self, data: bytes, fields: Fields) -> bytes:
        """The frame as this stream's event, its ``id:`` this stream's positions."""
        if fields.identified:
            position = encode_positions(self.positions).encode()
            return b"%bid: %b\ndata: %b\n\n" % (fields.line, position, data)
        return b"%bdata: %b\n\n" % (fields.line, data)

    async def send(self, data: str | bytes) -> None:
        """Send one frame as an event, then wait until the socket can take more."""
        self.write_event(data.encode() if isinstance(data, str) else data)
        await self.drain()

    def ping(self) -> None:
        """A heartbeat: a comment line, which every client ignores."""
        if self.open and self.head_sent:
            self._write(b":\n\n")

    def _write(self, body: bytes) -> None:
        if self.chunked:
            self.transport.write(_chunk(body))
            return
        data = self.http.body(body)
        if data:
            self.transport.write(data)

    # ------------------------------------------------------------------ ending

    def start_close(self, code: int, reason: str = "") -> None:
        """End the response (a comment names the code), then close the socket, or hand it
        back for the next request (a normal end on a connection kept alive)."""
        if self._ended:
            return
        self._code = code
        if not self.transport.is_closing():
            if not self.head_sent:
                self._head(204, (("Server", "token-relay"),))
            else:
                comment = f": closed {code} {reason}".replace("\n", " ").encode() + b"\n\n"
                self._write(comment)
            data = self.http.end()
            if data:
                self.transport.write(data)
            if code == CloseCode.NORMAL_CLOSURE and self.completed is not None:
                # A whole response on a connection kept alive: it stays open.
                self._ended = True
                self._gone()
                self.completed(self)
                return
            self.transport.close()
        self._ended = True

    # ------------------------------------------------------------------ the socket

    def receive(self, data: bytes) -> None:
        """Bytes from the client after its request: its next request, pipelined. They wait
        in the parser's buffer for the stream to end; past a request head's worth, the socket is
        not read until then."""
        self.http.receive_data(data)
        self._held += len(data)
        if self._held > MAX_HELD_BYTES:
            self.transport.pause_reading()

    def receive_eof(self) -> None:
        """The client closed its side: the stream is over."""
        self.close_received = True
        self._ended = True
        self.transport.close()

    def lost(self) -> None:
        """The socket is gone."""
        self._ended = True
        self._gone()

    def __aiter__(self) -> SseStream:
        return self

    async def __anext__(self) -> str | bytes:
        """A stream receives nothing: this waits until it ends."""
        await asyncio.shield(self._closed)
        raise StopAsyncIteration
