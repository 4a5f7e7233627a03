"""The load generator: a producer connection driven by hand on a raw asyncio stream.

Its frames are built before the clock starts (:func:`bench.wire.client_frames`) and written
straight to the socket in big chunks, while a reader task takes every reply off the socket
as it comes, so the connection never stalls on unread acks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from urllib.parse import quote

from .errors import BenchError
from .wire import TEXT, FrameParser, close_frame, open_raw

__all__ = ["CHUNK_BYTES", "RawProducer", "Rejected"]

CHUNK_BYTES = 256 * 1024
"""Bytes handed to the socket per write."""
READ_BYTES = 256 * 1024
IGNORED = frozenset({"session"})
"""Producer frames that are neither acks nor errors: the session token sent on connecting."""


class Rejected(BenchError):
    """The relay answered an event with an error frame."""

    def __init__(self, frame: str) -> None:
        super().__init__(f"the relay answered with an error frame: {frame}")
        self.frame = frame


class RawProducer:
    """One producer connection: write pre-built bytes, count the acks that come back.

    ``ack`` frames count one each and ``acks`` frames (the answer to an array frame) one
    per entry; each must name ``channel``. A ``session`` frame is ignored; any other frame
    fails the connection, unless ``on_text`` is given, in which case every text frame goes
    to it instead.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        channel: str | None,
        on_text: Callable[[bytes], None] | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.channel = channel
        self.acks = 0
        self.frames_received = 0
        self._on_text = on_text or self._count_acks
        self._target = 0
        self._reached = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.failure: asyncio.Future[None] = loop.create_future()
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
        if target is None:
            if channel is None:
                raise ValueError("give a channel or a target")
            target = f"/produce?channel={quote(channel, safe='')}"
        reader, writer = await open_raw("127.0.0.1", port, target)
        return cls(reader, writer, channel, on_text)

    def _fail(self, exc: BenchError) -> None:
        if not self.failure.done():
            self.failure.set_exception(exc)
        self._reached.set()

    async def _read(self) -> None:
        parser = FrameParser()
        payload = b""
        try:
            while data := await self.reader.read(READ_BYTES):
                for opcode, payload in parser.feed(data):
                    self.frames_received += 1
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
        if kind == "ack":
            acks = [frame]
        elif kind == "acks":
            acks = frame.get("acks") or []
        elif kind in IGNORED:
            return
        else:
            raise Rejected(payload.decode(errors="replace")[:300])
        for ack in acks:
            if ack.get("channel") != self.channel:
                raise BenchError(f"an ack names another channel: {ack}")
        self.acks += len(acks)
        if self.acks >= self._target:
            self._reached.set()

    def reached(self) -> None:
        """Wake whoever waits in :meth:`acked` (for ``on_text`` handlers)."""
        self._reached.set()

    async def write(self, data: bytes, chunk: int = CHUNK_BYTES) -> None:
        """Write ``data`` in chunks of ``chunk`` bytes, waiting whenever the socket is full."""
        view = memoryview(data)
        writer = self.writer
        for start in range(0, len(view), chunk):
            if self.failure.done():
                self.failure.result()
            writer.write(view[start : start + chunk])
            await writer.drain()

    async def acked(self, count: int) -> None:
        """Wait until ``count`` acks have come; fail as soon as the connection fails."""
        self._target = count
        while self.acks < count:
            if self.failure.done():
                self.failure.result()
            self._reached.clear()
            if self.acks >= count:
                break
            await self._reached.wait()
        if self.failure.done() and self.acks < count:
            self.failure.result()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition()`` holds after a reply (see :meth:`reached`)."""
        while not condition():
            if self.failure.done():
                self.failure.result()
            self._reached.clear()
            if condition():
                break
            await self._reached.wait()

    async def close(self) -> None:
        """Send a close frame and drop the connection."""
        with contextlib.suppress(OSError, RuntimeError):
            self.writer.write(close_frame())
            await asyncio.wait_for(self.writer.drain(), 1)
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, BenchError, OSError):
            await self._reading
        self.writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(self.writer.wait_closed(), 1)
        if not self.failure.done():
            self.failure.cancel()
        elif not self.failure.cancelled():
            self.failure.exception()  # seen: the connection is over either way
