"""Many cheap subscriber connections in a few processes, and the pool that drives them.

``python -m bench.subscribers`` holds ``--connections`` subscribers of one channel, each a
bare :class:`asyncio.Protocol`, and checks every message: its exact text (rebuilt from the
number in its id), its offset (no gap, no repeat), and with deltas, that they add up to it;
a frame is decoded once, then recognised by its bytes. It writes JSON lines: ``{"ready":
N}`` once all N are subscribed (again after each ``deltas 1`` or ``deltas 0`` on stdin);
``{"id": ID, "first": T, "last": T}`` once all hold message ``ID`` (``time.time()``);
``{"error": TEXT}`` before it exits with status 1. The end of stdin ends it.
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
from typing import Any, NoReturn, cast
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


def fail(text: str) -> NoReturn:
    """Report ``text`` and exit with status 1 (the operating system cuts every connection)."""
    _emit({"error": text})
    os._exit(1)


class Subscriber(asyncio.Protocol):
    """One connection: the handshake, then its text frames to :meth:`Subscribers.on_frame`."""

    __slots__ = ("handshake", "head", "offset", "opened", "owner", "parser", "parts", "transport")

    def __init__(self, owner: Subscribers, target: str) -> None:
        self.owner, self.head, self.offset = owner, b"", 0
        self.handshake = upgrade_request(owner.port, target)
        self.parser: FrameParser | None = None
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.parts: dict[str, list[str]] = {}
        """The deltas of the messages in progress."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.handshake[1])

    def data_received(self, data: bytes) -> None:
        now = time.time()
        try:
            if self.parser is None:
                head = self.head + data
                if (end := head.find(b"\r\n\r\n") + 4) < 4:
                    self.head = head
                    return
                check_upgrade(self.handshake[0], head[:end], "/subscribe")
                self.head, self.parser, data = b"", FrameParser(), head[end:]
                del self.handshake  # done with: thousands of them would add up
                self.opened.set_result(None)
            frames = self.parser.feed(data)
        except BenchError as exc:
            fail(str(exc))
        for opcode, payload in frames:
            if opcode == TEXT:
                self.owner.on_frame(self, now, payload)
            elif opcode == PING:
                self.send(payload, PONG)
            elif opcode == CLOSE:
                fail(f"the relay closed a subscriber connection: {payload[2:].decode()!r}")

    def send(self, payload: bytes, opcode: int = TEXT) -> None:
        """Write one frame, unless the connection is gone."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(client_frame(payload, opcode))

    def connection_lost(self, exc: Exception | None) -> None:
        fail("a subscriber connection was closed" + (f": {exc!r}" if exc else " by the relay"))


class Subscribers:
    """The connections of this process and what they received."""

    def __init__(self, port: int, channel: str, deltas_per_message: int) -> None:
        self.port, self.channel, self.deltas_per_message = port, channel, deltas_per_message
        self.connections: list[Subscriber] = []
        self.deltas, self.unconfirmed = False, 0
        self.confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._texts: dict[int, str] = {}
        self._known: dict[bytes, tuple[int, str, str, int]] = {}
        self._pending: dict[str, list[float]] = {}
        """Per message id: how many connections hold it, first and last arrival."""

    def expected(self, message_id: str) -> str:
        """The text of the message named by ``message_id``."""
        index = int(message_id.rpartition(":")[2])
        text = self._texts.get(index)
        if text is None:
            text = self._texts[index] = "".join(message_text(index, self.deltas_per_message))
        return text

    async def subscribe(self, deltas: bool, new: int = 0) -> None:
        """Open and subscribe ``new`` connections, or without, subscribe every one again."""
        self.deltas, self.unconfirmed = deltas, new or len(self.connections)
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
        await self.confirmed
        _emit({"ready": len(self.connections)})

    def on_frame(self, connection: Subscriber, now: float, payload: bytes) -> None:
        """Check and file one text frame."""
        known = self._known.get(payload)
        if known is None:
            try:
                known = self._decode(payload)
            except (ValueError, KeyError, TypeError, AttributeError):
                fail(f"a subscriber got a malformed frame: {payload[:300]!r}")
            if len(self._known) >= KNOWN_FRAMES:
                self._known.clear()
            self._known[payload] = known
        kind, message_id, value, offset = known
        if kind == DELTA:
            connection.parts.setdefault(message_id, []).append(value)
        elif kind == MESSAGE:
            if offset != connection.offset + 1:
                fail(f"{message_id!r} has offset {offset}, not {connection.offset + 1}")
            connection.offset = offset
            held = "".join(connection.parts.pop(message_id, ()))
            if self.deltas and held != value:
                fail(f"the deltas of {message_id!r} add up to {held!r}")
            record = self._pending.setdefault(message_id, [0.0, now, now])
            record[0] += 1
            record[2] = now
            if record[0] == len(self.connections):
                del self._pending[message_id]
                _emit({"id": message_id, "first": record[1], "last": record[2]})
        elif kind == SUBSCRIBED:
            connection.offset = offset
            self.unconfirmed -= 1
            if not self.unconfirmed:
                self.confirmed.set_result(None)
        else:
            connection.parts[message_id] = [value]

    def _decode(self, payload: bytes) -> tuple[int, str, str, int]:
        """A frame as ``(kind, id, text or delta, offset)``, its channel and text checked."""
        frame = json.loads(payload)
        kind = frame["type"]
        if frame["channel"] != self.channel:
            fail(f"a frame came on channel {frame['channel']!r}: {payload[:300]!r}")
        if kind == "delta":
            return DELTA, frame["id"], frame["delta"], 0
        if kind == "message" and frame["text"] == self.expected(frame["id"]):
            return MESSAGE, frame["id"], frame["text"], frame["offset"]
        if kind == "subscribed":
            return SUBSCRIBED, "", "", frame["offset"]
        if kind == "snapshot":
            return SNAPSHOT, frame["id"], frame["text"], 0
        fail(f"a subscriber got an unexpected frame or a wrong text: {payload[:300]!r}")


async def _run(args: argparse.Namespace) -> None:
    subscribers = Subscribers(args.port, args.channel, args.deltas_per_message)
    await subscribers.subscribe(False, args.connections)
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode():
        if line.split()[:1] != ["deltas"]:
            fail(f"unknown command {line.strip()!r}")
        await subscribers.subscribe(line.split()[1:] == ["1"])
    os._exit(0)  # the end of input: cut every connection at once


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
        fail(f"the open-file limit is too low for {args.connections} connections")
    run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop  # makes each read cheaper

        run = uvloop.run
    try:
        run(_run(args))
    except Exception as exc:
        fail(f"{type(exc).__name__}: {exc}")
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
