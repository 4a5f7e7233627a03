"""What goes over the wire: the messages, their frames, and a raw producer connection.

Texts hold accented letters and an emoji, so that splitting or re-encoding text wrongly is
caught. Client frames are masked with a zero key, which leaves the payload as it is, so a
run's frames are built once, before the clock starts. The opening handshake is websockets'
sans-I/O ``ClientProtocol``; the frames after it are :class:`FrameParser`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri

PIECES = ("The ", "quic", "k br", "own ", "fox ", "jump", "s ov", "er é", "🚀 la", "zy d", "og. ")
TEXT, CLOSE, PING, PONG = 0x1, 0x8, 0x9, 0xA
CHUNK_BYTES = 256 * 1024
"""Bytes handed to the socket per write, and read from it per read."""


class BenchError(Exception):
    """A process did not start, a message was wrong or missing, or a case timed out."""


@dataclass(frozen=True, slots=True)
class Message:
    """One message to send: its id, its events (deltas, then a final), their JSON frames."""

    id: str
    events: tuple[dict[str, Any], ...]
    frames: tuple[str, ...]
    text: str


def message_text(index: int, deltas: int) -> list[str]:
    """The deltas of message number ``index``; the first (``#NNN``) tells neighbours apart."""
    pieces = [f"#{index % 1000:03d}"]
    pieces += [PIECES[(index + n) % len(PIECES)] for n in range(1, deltas)]
    return pieces[:deltas]


def build_messages(count: int, deltas: int, prefix: str = "m") -> list[Message]:
    """``count`` messages of ``deltas`` deltas and a final; number ``n`` has id ``prefix + n``."""
    messages = []
    for index in range(count):
        message_id, pieces = f"{prefix}{index}", message_text(index, deltas)
        events: list[dict[str, Any]] = [{"id": message_id, "delta": piece} for piece in pieces]
        events.append({"id": message_id, "final": True})
        # Compact JSON, as a gateway would send it.
        frames = tuple(json.dumps(e, ensure_ascii=False, separators=(",", ":")) for e in events)
        messages.append(Message(message_id, tuple(events), frames, "".join(pieces)))
    return messages


def client_frame(payload: bytes, opcode: int = TEXT) -> bytes:
    """One final client frame carrying ``payload``, masked with a zero key."""
    size = len(payload)
    if size < 126:
        header = bytes((0x80 | opcode, 0x80 | size))
    elif size < 1 << 16:
        header = bytes((0x80 | opcode, 0x80 | 126)) + size.to_bytes(2, "big")
    else:
        header = bytes((0x80 | opcode, 0x80 | 127)) + size.to_bytes(8, "big")
    return header + b"\x00\x00\x00\x00" + payload


def upgrade_request(port: int, target: str) -> tuple[ClientProtocol, bytes]:
    """A client protocol for ``target`` (path and query) and its upgrade request's bytes."""
    protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}{target}"))
    protocol.send_request(protocol.connect())
    return protocol, b"".join(protocol.data_to_send())


def check_upgrade(protocol: ClientProtocol, head: bytes, target: str) -> None:
    """Fail unless ``head``, the response through its blank line (only it, so that the
    protocol parses no frame), accepts the upgrade."""
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
    try:
        async with asyncio.TaskGroup() as group:
            for coroutine in coroutines:
                group.create_task(coroutine)
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None


class RawProducer:
    """A producer connection on an asyncio stream: pre-built bytes out, and a reader task
    that counts acks (``acks`` frames one per entry, the no-op server's ``done N`` N) as they
    come, skips ``session`` and fails on anything else."""

    def __init__(self, port: int, channel: str, target: str = "") -> None:
        self.port, self.channel, self.acks, self._target = port, channel, 0, 0
        self.target = target or f"/produce?channel={quote(channel, safe='')}"
        self.error: BenchError | None = None
        self.last_ack = 0.0
        """When the last ack came, ``time.perf_counter()``."""
        self._reached = asyncio.Event()

    async def __aenter__(self) -> RawProducer:
        """Connect to ``target``, by default ``/produce?channel=CHANNEL``."""
        port, target = self.port, self.target
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        protocol, request = upgrade_request(port, target)
        try:
            self.writer.write(request)
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 30)
            check_upgrade(protocol, head, target)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            self.writer.close()
            raise BenchError(f"upgrade of {target} on port {port} failed") from None
        except BenchError:
            self.writer.close()
            raise
        self._reading = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        parser, payload = FrameParser(), b""
        try:
            while data := await self.reader.read(CHUNK_BYTES):
                for opcode, payload in parser.feed(data):
                    if opcode == TEXT:
                        self._count_acks(payload)
            raise BenchError(f"producer connection closed after {self.acks} acks")
        except BenchError as exc:
            self.error = exc
        except (ValueError, AttributeError, TypeError):
            self.error = BenchError(f"the producer got a malformed frame: {payload[:300]!r}")
        except OSError as exc:
            self.error = BenchError(f"producer connection failed: {exc}")
        self._reached.set()

    def _count_acks(self, payload: bytes) -> None:
        if payload.startswith(b"done "):
            self.acks = int(payload[5:])
        elif (frame := json.loads(payload)).get("type") in ("ack", "acks"):
            acks = [frame] if frame["type"] == "ack" else frame["acks"]
            if any(ack.get("channel") != self.channel for ack in acks):
                raise BenchError(f"an ack names another channel: {frame}")
            self.acks += len(acks)
        elif frame.get("type") != "session":
            text = payload.decode(errors="replace")[:300]
            raise BenchError(f"the relay answered with an error frame: {text}")
        self.last_ack = time.perf_counter()
        if self.acks >= self._target:
            self._reached.set()

    async def write(self, data: bytes) -> None:
        """Write ``data`` in :data:`CHUNK_BYTES` chunks, waiting whenever the socket is full."""
        view = memoryview(data)
        for start in range(0, len(view), CHUNK_BYTES):
            if self.error:
                raise self.error
            self.writer.write(view[start : start + CHUNK_BYTES])
            await self.writer.drain()

    async def acked(self, count: int) -> None:
        """Wait until ``count`` acks have come; fail as soon as the connection does."""
        self._target = count
        while self.acks < count:
            if self.error:
                raise self.error
            self._reached.clear()
            if self.acks < count:
                await self._reached.wait()

    async def __aexit__(self, *exc_info: object) -> None:
        """Send a close frame and drop the connection."""
        with contextlib.suppress(OSError, RuntimeError):
            self.writer.write(client_frame((1000).to_bytes(2, "big"), CLOSE))
            await asyncio.wait_for(self.writer.drain(), 1)
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reading
        self.writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 1)
