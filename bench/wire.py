"""Raw WebSocket client plumbing, so that the load generator is never the bottleneck.

* :func:`client_frame` builds a client frame once, ahead of time. Client frames must be
  masked; a zero masking key leaves the payload bytes unchanged, so a frame is its header,
  four zero bytes and the JSON text, and a whole run's frames are one ``bytes`` object
  written to the socket in big chunks.
* :func:`open_raw` does the HTTP upgrade handshake on a plain asyncio stream.
* :class:`FrameParser` splits the server's byte stream (server frames are never masked)
  into ``(opcode, payload)`` pairs.
* :class:`RawSubscriber` is a subscriber as an :class:`asyncio.Protocol`: no task, no
  stream, no websockets object per connection, so a process holds thousands of them.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from collections.abc import Callable, Iterable
from typing import cast

from .errors import BenchError

__all__ = [
    "CLOSE",
    "PING",
    "TEXT",
    "FrameParser",
    "RawSubscriber",
    "client_frame",
    "client_frames",
    "close_frame",
    "handshake_request",
    "open_raw",
]

TEXT = 0x1
CLOSE = 0x8
PING = 0x9
PONG = 0xA
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
ZERO_MASK = b"\x00\x00\x00\x00"
HANDSHAKE_TIMEOUT = 30.0
MAX_RESPONSE_HEAD = 16 * 1024


def client_frame(payload: bytes, opcode: int = TEXT) -> bytes:
    """One final client frame carrying ``payload``, masked with a zero key."""
    size = len(payload)
    if size < 126:
        header = bytes((0x80 | opcode, 0x80 | size))
    elif size < 1 << 16:
        header = bytes((0x80 | opcode, 0x80 | 126)) + size.to_bytes(2, "big")
    else:
        header = bytes((0x80 | opcode, 0x80 | 127)) + size.to_bytes(8, "big")
    return header + ZERO_MASK + payload


def client_frames(texts: Iterable[str]) -> bytes:
    """Text frames for every string, concatenated: ready to write as they are."""
    return b"".join(client_frame(text.encode()) for text in texts)


def close_frame(code: int = 1000) -> bytes:
    """A client close frame with ``code`` and no reason."""
    return client_frame(code.to_bytes(2, "big"), CLOSE)


def handshake_request(host: str, port: int, target: str) -> tuple[bytes, bytes]:
    """The upgrade request for ``target`` (path and query) and the accept value it must get."""
    key = base64.b64encode(os.urandom(16))
    accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
    request = (
        f"GET {target} HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        "Upgrade: websocket\r\n"
        "Connection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key.decode()}\r\n"
        "Sec-WebSocket-Version: 13\r\n"
        "\r\n"
    ).encode()
    return request, accept


def check_response(head: bytes, accept: bytes, target: str) -> None:
    """Fail unless ``head`` (the response up to its blank line) accepts the upgrade."""
    status, _, rest = head.partition(b"\r\n")
    if not status.startswith(b"HTTP/1.1 101"):
        raise BenchError(f"upgrade of {target} refused: {status.decode(errors='replace')}")
    for line in rest.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"sec-websocket-accept":
            if value.strip() != accept:
                raise BenchError(f"upgrade of {target}: wrong Sec-WebSocket-Accept")
            return
    raise BenchError(f"upgrade of {target}: no Sec-WebSocket-Accept")


async def open_raw(
    host: str, port: int, target: str, limit: int = 1 << 20
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection upgraded to WebSocket by hand; frames are the caller's business."""
    reader, writer = await asyncio.open_connection(host, port, limit=limit)
    request, accept = handshake_request(host, port, target)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANDSHAKE_TIMEOUT)
        check_response(head, accept, target)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        writer.close()
        raise BenchError(f"upgrade of {target} on port {port} failed") from None
    except BenchError:
        writer.close()
        raise
    return reader, writer


class FrameParser:
    """Splits a server's byte stream into ``(opcode, payload)`` frames."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Every frame completed by ``data``, in order; a partial one waits for more."""
        if self._pending:
            data = self._pending + data
        frames: list[tuple[int, bytes]] = []
        position = 0
        end = len(data)
        while end - position >= 2:
            first = data[position]
            size = data[position + 1]
            if size & 0x80:
                raise BenchError("the server sent a masked frame")
            if not first & 0x80:
                raise BenchError("the server sent a fragmented frame")
            header = 2
            if size == 126:
                if end - position < 4:
                    break
                size = int.from_bytes(data[position + 2 : position + 4], "big")
                header = 4
            elif size == 127:
                if end - position < 10:
                    break
                size = int.from_bytes(data[position + 2 : position + 10], "big")
                header = 10
            stop = position + header + size
            if stop > end:
                break
            frames.append((first & 0x0F, data[position + header : stop]))
            position = stop
        self._pending = data[position:]
        return frames


FrameHandler = Callable[["RawSubscriber", float, bytes], None]
"""Called with the connection, the arrival time (``time.time()``) and a text frame's payload."""


class RawSubscriber(asyncio.Protocol):
    """One subscriber connection: handshake, then text frames to a callback; pings answered."""

    __slots__ = (
        "_accept",
        "_clock",
        "_head",
        "_on_frame",
        "_on_lost",
        "_parser",
        "_request",
        "_target",
        "closed",
        "lost_reason",
        "opened",
        "state",
        "transport",
    )

    def __init__(
        self,
        host: str,
        port: int,
        target: str,
        on_frame: FrameHandler,
        clock: Callable[[], float],
        on_lost: Callable[[RawSubscriber], None] | None = None,
    ) -> None:
        self._request, self._accept = handshake_request(host, port, target)
        self._target = target
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._clock = clock
        self._head = b""
        self._parser: FrameParser | None = None
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False
        self.lost_reason: Exception | None = None
        self.state: object = None
        """Whatever the owner keeps per connection."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        now = self._clock()
        parser = self._parser
        if parser is None:
            head = self._head + data
            end = head.find(b"\r\n\r\n")
            if end < 0:
                if len(head) > MAX_RESPONSE_HEAD:
                    self._fail(BenchError(f"upgrade of {self._target}: response too long"))
                self._head = head
                return
            try:
                check_response(head[:end], self._accept, self._target)
            except BenchError as exc:
                self._fail(exc)
                return
            self._head = b""
            parser = self._parser = FrameParser()
            self.opened.set_result(None)
            data = head[end + 4 :]
            if not data:
                return
        try:
            frames = parser.feed(data)
        except BenchError as exc:
            self._fail(exc)
            return
        for opcode, payload in frames:
            if opcode == TEXT:
                self._on_frame(self, now, payload)
            elif opcode == PING:
                self.send(payload, PONG)
            elif opcode == CLOSE:
                self.closed = True
                self.send(payload[:2], CLOSE)
                if self.transport is not None:
                    self.transport.close()

    def send(self, payload: bytes, opcode: int = TEXT) -> None:
        """Write one frame, unless the connection is gone."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(client_frame(payload, opcode))

    def _fail(self, exc: BenchError) -> None:
        if not self.opened.done():
            self.opened.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost_reason = exc
        self.closed = True
        self.transport = None
        if not self.opened.done():
            self.opened.set_exception(BenchError(f"{self._target}: connection lost in upgrade"))
        elif self._on_lost is not None:
            self._on_lost(self)
