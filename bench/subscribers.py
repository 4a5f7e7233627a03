"""Many cheap subscriber connections in a few processes, and the pool that drives them.

``python -m bench.subscribers`` holds ``--connections`` subscribers of one channel, each a
bare :class:`asyncio.Protocol` (no task, stream or websockets object after the handshake),
on uvloop when it is installed. Every ``message`` frame is checked: exactly the text of the
message its id names (ids are ``ROUND:N``, texts :func:`bench.messages.message_text`), the
offset after the connection's last one, and with deltas, the deltas adding up to it. Every
connection gets the same bytes for a frame, so a frame is decoded and checked once, then
recognised by its bytes.

It writes JSON lines to stdout: ``{"ready": N}`` once all N connections are subscribed
(again after each ``deltas 1`` or ``deltas 0`` line on stdin, which subscribes them again
with or without live deltas); ``{"id": ID, "first": T, "last": T}`` once every connection
holds message ``ID`` (``time.time()``, comparable across processes); ``{"error": TEXT}``
before it exits with status 1. The end of stdin closes every connection.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any, cast
from urllib.parse import quote

from .wire import (
    CLOSE,
    PING,
    PONG,
    TEXT,
    BenchError,
    FrameParser,
    check_upgrade,
    client_frame,
    message_text,
    upgrade_request,
)

DELTA, MESSAGE, SUBSCRIBED, SNAPSHOT = range(4)
KNOWN_FRAMES = 10_000
"""Decoded frames remembered by their bytes."""
HANDSHAKES_AT_ONCE = 25
MAX_RESPONSE_HEAD = 16 * 1024
READY_WITHIN = 120.0


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


class Subscriber(asyncio.Protocol):
    """One connection: the handshake, then its text frames to :meth:`Subscribers.on_frame`."""

    __slots__ = ("handshake", "head", "offset", "opened", "owner", "parser", "parts", "transport")

    def __init__(self, owner: Subscribers, target: str) -> None:
        self.owner = owner
        self.handshake = upgrade_request(owner.port, target)
        self.head = b""
        self.parser: FrameParser | None = None
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.offset = 0
        self.parts: dict[str, list[str]] = {}
        """The deltas of the messages in progress."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.handshake[1])

    def data_received(self, data: bytes) -> None:
        now = time.time()
        if self.parser is None:
            head = self.head + data
            end = head.find(b"\r\n\r\n") + 4
            try:
                if end < 4 and len(head) > MAX_RESPONSE_HEAD:
                    raise BenchError("the upgrade response is too long")
                if end < 4:
                    self.head = head
                    return
                check_upgrade(self.handshake[0], head[:end], "/subscribe")
            except BenchError as exc:
                self.opened.set_exception(exc)
                self.abort()
                return
            self.head, self.parser = b"", FrameParser()
            del self.handshake  # done with: thousands of them would add up
            self.opened.set_result(None)
            data = head[end:]
        try:
            frames = self.parser.feed(data)
        except BenchError as exc:
            self.owner.fail(str(exc))
            return
        for opcode, payload in frames:
            if opcode == TEXT:
                self.owner.on_frame(self, now, payload)
            elif opcode == PING:
                self.send(payload, PONG)
            elif opcode == CLOSE:
                self.send(payload[:2], CLOSE)
                self.abort()

    def send(self, payload: bytes, opcode: int = TEXT) -> None:
        """Write one frame, unless the connection is gone."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(client_frame(payload, opcode))

    def abort(self) -> None:
        """Cut the connection."""
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.opened.done():
            self.opened.set_exception(BenchError("a connection was lost in the upgrade"))
        elif not self.owner.closing:
            reason = f": {type(exc).__name__}: {exc}" if exc else " by the relay"
            self.owner.fail("a subscriber connection was closed" + reason)


class Subscribers:
    """The connections of this process and what they received."""

    def __init__(self, port: int, channel: str, deltas_per_message: int) -> None:
        self.port, self.channel, self.deltas_per_message = port, channel, deltas_per_message
        self.connections: list[Subscriber] = []
        self.deltas = False
        self.unconfirmed = 0
        loop = asyncio.get_running_loop()
        self.confirmed: asyncio.Future[None] = loop.create_future()
        self.failure: asyncio.Future[str] = loop.create_future()
        self.closing = False
        self._texts: dict[int, str] = {}
        self._known: dict[bytes, tuple[int, str, str, int]] = {}
        self._pending: dict[str, list[float]] = {}
        """Per message id: how many connections hold it, first and last arrival."""

    def fail(self, text: str) -> None:
        """Fail the process with ``text`` (the first failure wins)."""
        if not self.failure.done():
            self.failure.set_result(text)

    def expected(self, message_id: str) -> str:
        """The text of the message named by ``message_id``."""
        index = int(message_id.rpartition(":")[2])
        text = self._texts.get(index)
        if text is None:
            text = self._texts[index] = "".join(message_text(index, self.deltas_per_message))
        return text

    async def subscribe(self, deltas: bool, new: int = 0) -> None:
        """Open and subscribe ``new`` connections, or without, subscribe every one again."""
        self.deltas = deltas
        self.unconfirmed = new or len(self.connections)
        self.confirmed = asyncio.get_running_loop().create_future()
        if new:
            target = f"/subscribe?channel={quote(self.channel, safe='')}" + "&deltas=1" * deltas
            gate = asyncio.Semaphore(HANDSHAKES_AT_ONCE)

            def connection() -> Subscriber:
                # Frames can arrive before create_connection() returns: keep it from here.
                self.connections.append(Subscriber(self, target))
                return self.connections[-1]

            async def one() -> None:
                async with gate:
                    loop = asyncio.get_running_loop()
                    _, protocol = await loop.create_connection(connection, "127.0.0.1", self.port)
                    await protocol.opened

            await asyncio.gather(*(one() for _ in range(new)))
        else:
            frame = {"type": "subscribe", "channel": self.channel, "deltas": deltas}
            for each in self.connections:
                each.send(json.dumps(frame).encode())
        waiting: list[asyncio.Future[Any]] = [self.confirmed, self.failure]
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if self.failure.done():
            raise BenchError(self.failure.result())
        _emit({"ready": len(self.connections)})

    def on_frame(self, connection: Subscriber, now: float, payload: bytes) -> None:
        """Check and file one text frame."""
        known = self._known.get(payload)
        if known is None:
            try:
                known = self._decode(payload)
            except (ValueError, KeyError, TypeError, AttributeError):
                known = None
                self.fail(f"a subscriber got a malformed frame: {payload[:300]!r}")
            if known is None:
                return
            if len(self._known) >= KNOWN_FRAMES:
                self._known.clear()
            self._known[payload] = known
        kind, message_id, value, offset = known
        if kind == DELTA:
            connection.parts.setdefault(message_id, []).append(value)
        elif kind == MESSAGE:
            self._on_message(connection, now, message_id, value, offset)
        elif kind == SUBSCRIBED:
            connection.offset = offset
            self.unconfirmed -= 1
            if not self.unconfirmed:
                self.confirmed.set_result(None)
        else:
            connection.parts[message_id] = [value]

    def _decode(self, payload: bytes) -> tuple[int, str, str, int] | None:
        """A frame as ``(kind, id, text or delta, offset)``, its text checked; None if bad."""
        frame = json.loads(payload)
        kind = frame["type"]
        if frame["channel"] != self.channel:
            self.fail(f"a frame came on channel {frame['channel']!r}: {payload[:300]!r}")
        elif kind == "delta":
            return DELTA, frame["id"], frame["delta"], 0
        elif kind == "message":
            if frame["text"] == self.expected(frame["id"]):
                return MESSAGE, frame["id"], frame["text"], frame["offset"]
            self.fail(f"message {frame['id']!r} arrived with the wrong text: {frame['text']!r}")
        elif kind == "subscribed":
            return SUBSCRIBED, "", "", frame["offset"]
        elif kind == "snapshot":
            return SNAPSHOT, frame["id"], frame["text"], 0
        else:
            self.fail(f"a subscriber got an unexpected frame: {payload[:300]!r}")
        return None

    def _on_message(
        self, connection: Subscriber, now: float, message_id: str, text: str, offset: int
    ) -> None:
        if offset != connection.offset + 1:
            expected = connection.offset + 1
            return self.fail(f"{message_id!r} has offset {offset}, not {expected}: a gap or repeat")
        connection.offset = offset
        held = "".join(connection.parts.pop(message_id, ()))
        if self.deltas and held != text:
            return self.fail(f"the deltas of {message_id!r} add up to {held!r}")
        record = self._pending.get(message_id)
        if record is None:
            record = self._pending[message_id] = [0.0, now, now]
        record[0] += 1
        record[2] = now
        if record[0] == len(self.connections):
            del self._pending[message_id]
            _emit({"id": message_id, "first": record[1], "last": record[2]})


async def _run(args: argparse.Namespace) -> None:
    subscribers = Subscribers(args.port, args.channel, args.deltas_per_message)

    async def commands() -> None:
        reader = asyncio.StreamReader()
        await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
        )
        while line := (await reader.readline()).decode():
            if line.split()[:1] != ["deltas"]:
                raise BenchError(f"unknown command {line.strip()!r}")
            await subscribers.subscribe(line.split()[1:] == ["1"])

    try:
        await subscribers.subscribe(False, args.connections)
        reading = asyncio.ensure_future(commands())
        waiting: list[asyncio.Future[Any]] = [reading, subscribers.failure]
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if subscribers.failure.done():
            reading.cancel()
            raise BenchError(subscribers.failure.result())
        reading.result()
    finally:
        subscribers.closing = True
        for connection in subscribers.connections:
            connection.abort()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.subscribers")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--channel", required=True)
    parser.add_argument("--connections", type=int, required=True)
    parser.add_argument("--deltas-per-message", type=int, default=10)
    parser.add_argument("--nice", type=int, default=0, help="lower this process's priority")
    args = parser.parse_args(argv)
    os.nice(args.nice)
    if raise_fd_limit() < args.connections + 64:
        _emit({"error": f"the open-file limit is too low for {args.connections} connections"})
        return 1
    run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop  # makes each read cheaper

        run = uvloop.run
    try:
        run(_run(args))
    except (BenchError, OSError, ValueError, KeyError, TypeError) as exc:
        _emit(
            {"error": str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"}
        )
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


class SubscriberPool:
    """``connections`` subscribers of one channel, spread over a few processes."""

    def __init__(self, processes: Sequence[asyncio.subprocess.Process], connections: int) -> None:
        self.processes = processes
        self.connections = connections
        self.pids = [process.pid for process in processes]
        self._errors: collections.deque[str] = collections.deque(maxlen=20)

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, port: int, channel: str, connections: int, processes: int, **options: int
    ) -> AsyncIterator[SubscriberPool]:
        """Start the processes (``options``: ``deltas_per_message``, ``nice``) and wait until
        every connection is subscribed; on the way out, close their input and wait."""
        shares = [
            connections // processes + (n < connections % processes) for n in range(processes)
        ]
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in options.items()]
        started: list[asyncio.subprocess.Process] = []
        try:
            for share in filter(None, shares):
                started.append(
                    await asyncio.create_subprocess_exec(
                        *(sys.executable, "-m", "bench.subscribers", f"--port={port}"),
                        *(f"--channel={channel}", f"--connections={share}", *flags),
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                    )
                )
            pool = cls(started, connections)
            await pool.ready()
            yield pool
        finally:
            for process in started:
                if process.stdin is not None:
                    process.stdin.close()
            for process in started:
                try:
                    await asyncio.wait_for(process.wait(), 5)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()

    async def _lines(self, seconds: float, what: str) -> list[dict[str, Any]]:
        """Every process's next JSON line; an ``error`` line, an exit or a timeout fails."""
        lines = []
        try:
            async with asyncio.timeout(seconds):
                for process in self.processes:
                    assert process.stdout is not None  # stderr comes the same way
                    while raw := await process.stdout.readline():
                        with contextlib.suppress(ValueError):
                            lines.append(json.loads(raw))
                            break
                        self._errors.append(raw.decode(errors="replace"))
                    else:
                        status, detail = await process.wait(), "".join(self._errors).strip()
                        raise BenchError(f"a subscriber process exited ({status}): {detail}")
                    if "error" in lines[-1]:
                        raise BenchError(f"subscriber process: {lines[-1]['error']}")
        except TimeoutError:
            raise BenchError(f"{what} within {seconds:g} s") from None
        return lines

    async def ready(self, deltas: bool | None = None) -> None:
        """Wait until every connection is subscribed; first, with ``deltas``, subscribe every
        connection again with or without live deltas."""
        for process in self.processes if deltas is not None else ():
            assert process.stdin is not None
            process.stdin.write(b"deltas 1\n" if deltas else b"deltas 0\n")
        what = f"{self.connections} subscribers were not all subscribed"
        for line in await self._lines(READY_WITHIN, what):
            if "ready" not in line:
                raise BenchError(f"subscriber process: unexpected line {line}")

    async def delivered(self, message_id: str, seconds: float) -> tuple[float, float]:
        """Wait until every connection holds ``message_id``; its first and last arrival."""
        what = f"message {message_id!r} did not reach all {self.connections} subscribers"
        lines = await self._lines(seconds, what)
        for line in lines:
            if line.get("id") != message_id:
                raise BenchError(f"expected message {message_id!r}, a client got {line}")
        return min(line["first"] for line in lines), max(line["last"] for line in lines)


if __name__ == "__main__":
    raise SystemExit(main())
