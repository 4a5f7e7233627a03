"""Raw WebSocket client plumbing, so that the load generator is never the bottleneck.

Client frames must be masked; a zero masking key leaves the payload unchanged, so a frame
is its header, four zero bytes and the JSON text (:func:`client_frame`), and a run's frames
are built before the clock starts and written as one ``bytes`` object in big chunks. The
opening handshake is websockets' sans-I/O :class:`~websockets.client.ClientProtocol`; the
frames after it are :class:`FrameParser`'s (server frames are never masked).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Coroutine, Iterable
from typing import Any
from urllib.parse import quote

from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri

TEXT, CLOSE, PING, PONG = 0x1, 0x8, 0x9, 0xA
ZERO_MASK = b"\x00\x00\x00\x00"
HANDSHAKE_TIMEOUT = 30.0
CHUNK_BYTES = 256 * 1024
"""Bytes handed to the socket per write, and read from it per read."""


class BenchError(Exception):
    """A process did not start, a message was wrong or missing, or a case timed out."""


class Rejected(BenchError):
    """The relay answered an event with an error frame."""

    def __init__(self, frame: str) -> None:
        super().__init__(f"the relay answered with an error frame: {frame}")
        self.frame = frame


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


def upgrade_request(host: str, port: int, target: str) -> tuple[ClientProtocol, bytes]:
    """A client protocol for ``target`` (path and query) and its upgrade request's bytes."""
    protocol = ClientProtocol(parse_uri(f"ws://{host}:{port}{target}"))
    protocol.send_request(protocol.connect())
    return protocol, b"".join(protocol.data_to_send())


def check_upgrade(protocol: ClientProtocol, head: bytes, target: str) -> None:
    """Fail unless ``head``, the response through its blank line, accepts the upgrade.

    Only the head goes to ``protocol``, so that it parses none of the frames after it.
    """
    protocol.receive_data(head)
    if protocol.state is not State.OPEN:
        reason = protocol.handshake_exc or head.partition(b"\r\n")[0].decode(errors="replace")
        raise BenchError(f"upgrade of {target} refused: {reason}")


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
        position, end = 0, len(data)
        while end - position >= 2:
            first, size = data[position], data[position + 1]
            if size & 0x80 or not first & 0x80:
                raise BenchError("the server sent a masked or fragmented frame")
            header = 2
            if size >= 126:
                header = 4 if size == 126 else 10
                if end - position < header:
                    break
                size = int.from_bytes(data[position + 2 : position + header], "big")
            stop = position + header + size
            if stop > end:
                break
            frames.append((first & 0x0F, data[position + header : stop]))
            position = stop
        self._pending = data[position:]
        return frames


async def all_or_first_failure(*coroutines: Coroutine[Any, Any, None]) -> None:
    """Run the coroutines together; on the first failure cancel the rest and re-raise it."""
    tasks = [asyncio.create_task(coroutine) for coroutine in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class RawProducer:
    """A producer connection on an asyncio stream: pre-built bytes out, acks counted.

    A reader task takes every reply off the socket as it comes, so the connection never
    stalls on unread acks. ``ack`` frames count one each and ``acks`` frames (the answer to
    an array frame) one per entry, each naming ``channel``; the ``session`` frame is skipped
    and any other frame fails, unless ``on_text`` is given: it gets every text frame instead.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        channel: str | None,
        on_text: Callable[[bytes], None] | None,
    ) -> None:
        self.reader, self.writer, self.channel = reader, writer, channel
        self.acks = 0
        self._on_text = on_text or self._count_acks
        self._target = 0
        self._reached = asyncio.Event()
        self.error: BenchError | None = None
        self._reading = asyncio.create_task(self._read())

    @classmethod
    async def open(
        cls,
        port: int,
        channel: str | None = None,
        *,
        target: str | None = None,
        on_text: Callable[[bytes], None] | None = None,
    ) -> RawProducer:
        """Connect to ``/produce?channel=CHANNEL``, or to ``target`` when given."""
        target = target or f"/produce?channel={quote(channel or '', safe='')}"
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        protocol, request = upgrade_request("127.0.0.1", port, target)
        try:
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HANDSHAKE_TIMEOUT)
            check_upgrade(protocol, head, target)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            raise BenchError(f"upgrade of {target} on port {port} failed") from None
        except BenchError:
            writer.close()
            raise
        return cls(reader, writer, channel, on_text)

    def _fail(self, exc: BenchError) -> None:
        self.error = self.error or exc
        self._reached.set()

    async def _read(self) -> None:
        parser = FrameParser()
        payload = b""
        try:
            while data := await self.reader.read(CHUNK_BYTES):
                for opcode, payload in parser.feed(data):
                    if opcode == TEXT:
                        self._on_text(payload)
        except BenchError as exc:
            self._fail(exc)
        except (ValueError, AttributeError, TypeError):
            self._fail(BenchError(f"the producer got a malformed frame: {payload[:300]!r}"))
        except OSError as exc:
            self._fail(BenchError(f"producer connection failed: {exc}"))
        else:
            self._fail(BenchError(f"producer connection closed after {self.acks} acks"))

    def _count_acks(self, payload: bytes) -> None:
        frame = json.loads(payload)
        kind = frame.get("type") if isinstance(frame, dict) else None
        if kind == "session":
            return
        if kind not in ("ack", "acks"):
            raise Rejected(payload.decode(errors="replace")[:300])
        acks = [frame] if kind == "ack" else frame.get("acks") or []
        for ack in acks:
            if ack.get("channel") != self.channel:
                raise BenchError(f"an ack names another channel: {ack}")
        self.acks += len(acks)
        if self.acks >= self._target:
            self._reached.set()

    def reached(self) -> None:
        """Wake whoever waits in :meth:`wait_for` (for ``on_text`` handlers)."""
        self._reached.set()

    async def write(self, data: bytes) -> None:
        """Write ``data`` in :data:`CHUNK_BYTES` chunks, waiting whenever the socket is full."""
        view = memoryview(data)
        for start in range(0, len(view), CHUNK_BYTES):
            if self.error:
                raise self.error
            self.writer.write(view[start : start + CHUNK_BYTES])
            await self.writer.drain()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition()`` holds after a reply; fail as soon as the connection does."""
        while not condition():
            if self.error:
                raise self.error
            self._reached.clear()
            if condition():
                break
            await self._reached.wait()

    async def acked(self, count: int) -> None:
        """Wait until ``count`` acks have come."""
        self._target = count
        await self.wait_for(lambda: self.acks >= count)

    async def close(self) -> None:
        """Send a close frame and drop the connection."""
        with contextlib.suppress(OSError, RuntimeError):
            self.writer.write(client_frame((1000).to_bytes(2, "big"), CLOSE))
            await asyncio.wait_for(self.writer.drain(), 1)
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, BenchError, OSError):
            await self._reading
        self.writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 1)
