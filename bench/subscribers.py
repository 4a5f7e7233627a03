"""Many cheap subscriber connections in a few processes, and the pool that drives them.

``python -m bench.subscribers JSON`` holds bare asyncio protocols subscribed to one channel
and checks each message's text, offset and deltas. On stdout: ``{"ready": N}`` once all are
subscribed (again after ``deltas 1`` or ``deltas 0`` on stdin), ``{"id", "first", "last"}``
once all hold a message (``time.time()``), or ``{"error"}``; the end of stdin ends it.

The connections are WebSockets, or with ``sse`` SSE streams (``GET /sse?channel=C``): each
event's data is the frame a WebSocket would get, checked the same way. A stream cannot be
told to switch deltas on or off, so it is replaced by a new one that asks for them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, NoReturn, cast
from urllib.parse import quote

import h11

from . import wire

DELTA, MESSAGE, SUBSCRIBED, SNAPSHOT = range(4)
CACHE_ENTRIES = 4096
"""Frames, reads and events a subscriber process keeps checked, at most, of each (then it
starts afresh)."""


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        target = max(soft, 1 << 20) if hard == resource.RLIM_INFINITY else hard
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def fail(text: str) -> NoReturn:
    """Report ``text`` and exit with status 1 (the operating system cuts every connection)."""
    _emit({"error": text})
    os._exit(1)


class Connection(asyncio.Protocol):
    """What :meth:`Subscribers.on_frame` keeps of one subscriber connection, of either kind."""

    __slots__ = ("head", "offset", "opened", "owner", "parts", "transport")

    def __init__(self, owner: Subscribers) -> None:
        self.owner, self.head, self.offset = owner, b"", 0
        self.transport: asyncio.Transport
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.parts: dict[str, list[str]] = {}  # the deltas of the messages in progress


class Subscriber(Connection):
    """One WebSocket: the handshake, then its text frames to :meth:`Subscribers.on_frame`."""

    __slots__ = ("handshake", "parser")

    def __init__(self, owner: Subscribers, target: str) -> None:
        super().__init__(owner)
        self.handshake = wire.upgrade_request(owner.port, target)
        self.parser: wire.FrameParser | None = None

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
                wire.check_upgrade(self.handshake[0], head[:end], "/subscribe")
                self.head, self.parser, data = b"", wire.FrameParser(), head[end:]
                del self.handshake  # done with: thousands of them would add up
                self.opened.set_result(None)
            frames = self.parser.feed(data)
        except wire.BenchError as exc:
            fail(str(exc))
        for opcode, payload in frames:
            if opcode == wire.TEXT:
                self.owner.on_frame(self, now, payload)
            elif opcode == wire.PING:
                self.transport.write(wire.client_frame(payload, wire.PONG))
            elif opcode == wire.CLOSE:
                fail(f"the relay closed a subscriber connection: {payload[2:].decode()!r}")

    def connection_lost(self, exc: Exception | None) -> None:
        fail("a subscriber connection was closed" + (f": {exc!r}" if exc else " by the relay"))


class EventParser:
    """Splits an SSE response body, chunked or not, into the data of its events.

    What a feed yields from a clean start (no partial chunk or event held) depends on its
    bytes alone, and every stream of a process gets the same bytes: such feeds, and every
    event, are read once per process and looked up after that.
    """

    __slots__ = ("_body", "_chunked", "_raw")

    _feeds: dict[bytes, tuple[bytes, ...]] = {}  # noqa: RUF012 - shared on purpose
    _events: dict[bytes, bytes | None] = {}  # noqa: RUF012 - an event's data, or None

    def __init__(self, chunked: bool) -> None:
        self._chunked, self._raw, self._body = chunked, b"", b""

    def feed(self, data: bytes) -> tuple[bytes, ...]:
        """The data of every event ended by ``data``, in order; the rest waits for more."""
        clean = not self._raw and not self._body
        if clean and (known := self._feeds.get(data)) is not None:
            return known
        body = self._unchunk(data) if self._chunked else data
        if self._body:
            body = self._body + body
        if b"\r" in body:  # CRLF or CR line ends; a CR at the end may be half of a CRLF
            held = b"\r" if body.endswith(b"\r") else b""
            body = body[: len(body) - len(held)].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            body += held
        *blocks, self._body = body.split(b"\n\n")
        events = self._events
        found = [events[b] if b in events else self._event(b) for b in blocks]
        payloads = tuple(payload for payload in found if payload is not None)
        if clean and not self._raw and not self._body:
            if len(self._feeds) >= CACHE_ENTRIES:
                self._feeds.clear()  # bounded: a long run's old reads are not met again
            self._feeds[data] = payloads
        return payloads

    def _unchunk(self, data: bytes) -> bytes:
        """The chunks' bytes; a partial chunk waits in ``_raw``."""
        if self._raw:
            data = self._raw + data
        parts: list[bytes] = []
        position, end = 0, len(data)
        while (line := data.find(b"\r\n", position)) >= 0:
            try:
                size = int(data[position:line].partition(b";")[0], 16)
            except ValueError:
                raise wire.BenchError(f"a bad chunk size: {data[position:line][:40]!r}") from None
            if size == 0:
                seen = b"\n" + b"".join(parts)  # its last comment says why (": closed 1013")
                said = seen[seen.rfind(b"\n:") + 2 :].strip().decode(errors="replace")
                raise wire.BenchError(f"the relay ended an SSE stream: {said!r}")
            start = line + 2
            if (stop := start + size) + 2 > end:
                break
            if data[stop : stop + 2] != b"\r\n":
                raise wire.BenchError("a chunk of an SSE stream does not end with CRLF")
            parts.append(data[start:stop])
            position = stop + 2
        self._raw = data[position:]
        return b"".join(parts)

    def _event(self, block: bytes) -> bytes | None:
        """An event's data (None if it has none), its ``event:`` and ``id:`` checked."""
        fields: dict[bytes, bytes] = {}
        lines: list[bytes] = []
        for line in block.split(b"\n"):
            if line and not line.startswith(b":"):  # a blank line or a comment
                name, _, value = line.partition(b":")
                value = value[1:] if value.startswith(b" ") else value
                if name == b"data":
                    lines.append(value)
                else:
                    fields[name] = value
        payload = b"\n".join(lines) if lines else None
        if payload is not None:
            try:
                kind = str(json.loads(payload)["type"])
            except (ValueError, KeyError, TypeError):
                raise wire.BenchError(f"an SSE event's data is no frame: {block[:300]!r}") from None
            if fields.get(b"event", b"message").decode() != kind:
                raise wire.BenchError(f"an SSE event is not named for its frame: {block[:300]!r}")
            if kind in ("subscribed", "message", "aborted") and not fields.get(b"id"):
                raise wire.BenchError(f"an SSE {kind} event has no id: {block[:300]!r}")
        if len(self._events) >= CACHE_ENTRIES:
            self._events.clear()
        self._events[block] = payload
        return payload


class SseSubscriber(Connection):
    """One SSE stream: the request, then its events' data to :meth:`Subscribers.on_frame`."""

    __slots__ = ("http", "parser", "replaced", "request", "target")

    def __init__(self, owner: Subscribers, target: str) -> None:
        super().__init__(owner)
        self.target, self.http, self.replaced = target, h11.Connection(h11.CLIENT), False
        headers = [("Host", f"127.0.0.1:{owner.port}"), ("Accept", "text/event-stream")]
        request = h11.Request(method="GET", target=target, headers=headers)
        self.request = self.http.send(request) or b""
        self.http.send(h11.EndOfMessage())  # a GET has no body: nothing to send
        self.parser: EventParser | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.replaced:  # closed, but bytes already read may still come
            return
        now = time.time()
        try:
            if self.parser is None:
                head = self.head + data
                if (end := head.find(b"\r\n\r\n") + 4) < 4:
                    self.head = head
                    return
                self.head, self.parser, data = b"", EventParser(self._check(head[:end])), head[end:]
                del self.http, self.request  # done with: thousands of them would add up
                self.opened.set_result(None)
            payloads = self.parser.feed(data)
        except wire.BenchError as exc:
            fail(str(exc))
        for payload in payloads:
            self.owner.on_frame(self, now, payload)

    def _check(self, head: bytes) -> bool:
        """Fail unless ``head`` (through its blank line) starts an event stream; whether its
        body is chunked."""
        self.http.receive_data(head)
        try:
            response = self.http.next_event()
        except h11.RemoteProtocolError as exc:
            raise wire.BenchError(f"GET {self.target}: a malformed response ({exc})") from None
        if not isinstance(response, h11.Response):
            raise wire.BenchError(f"GET {self.target}: no response head but {response!r}")
        headers = dict(response.headers)  # h11 lowers the names
        kind = headers.get(b"content-type", b"").decode(errors="replace")
        if response.status_code != 200 or not kind.startswith("text/event-stream"):
            raise wire.BenchError(f"GET {self.target} answered {response.status_code} {kind!r}")
        return b"chunked" in headers.get(b"transfer-encoding", b"").lower()

    def retire(self) -> None:
        """Close this stream, which a new one replaces; it is no failure."""
        self.replaced = True
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.replaced:
            fail("an SSE stream was closed" + (f": {exc!r}" if exc else " by the relay"))


class Subscribers:
    """The connections of this process and what they received."""

    def __init__(self, port: int, channel: str, deltas_per_message: int, sse: bool) -> None:
        self.port, self.channel, self.per, self.sse = port, channel, deltas_per_message, sse
        self.connections: list[Connection] = []
        self.deltas, self.unconfirmed = False, 0
        self.confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._known: dict[bytes, tuple[int, str, str, int]] = {}  # checked frames, by bytes
        self._pending: dict[str, list[float]] = {}  # id: connections holding it, first, last

    async def subscribe(self, deltas: bool, new: int = 0) -> None:
        """Open and subscribe ``new`` connections (25 handshakes at a time), or without,
        subscribe every one again: a WebSocket with a subscribe frame, an SSE stream by
        closing it and opening a new one in its place."""
        self.deltas, self.unconfirmed = deltas, new or len(self.connections)
        self.confirmed = asyncio.get_running_loop().create_future()
        kind, path = (SseSubscriber, "/sse") if self.sse else (Subscriber, "/subscribe")
        target = f"{path}?channel={quote(self.channel, safe='')}" + "&deltas=1" * deltas
        gate, frame = asyncio.Semaphore(25), {"type": "subscribe", "channel": self.channel}

        async def one(replacing: int | None = None) -> None:
            def connection() -> Connection:
                # Frames can arrive before create_connection() returns: keep it from here.
                made = kind(self, target)
                if replacing is None:
                    self.connections.append(made)
                else:
                    self.connections[replacing] = made
                return made

            async with gate:
                if replacing is not None:
                    cast(SseSubscriber, self.connections[replacing]).retire()
                loop = asyncio.get_running_loop()
                _, protocol = await loop.create_connection(connection, "127.0.0.1", self.port)
                await protocol.opened

        if self.sse and not new:
            await asyncio.gather(*(one(n) for n in range(len(self.connections))))
        await asyncio.gather(*(one() for _ in range(new)))
        for each in self.connections if not new and not self.sse else ():
            each.transport.write(wire.client_frame(json.dumps(frame | {"deltas": deltas}).encode()))
        await self.confirmed
        _emit({"ready": len(self.connections)})

    def on_frame(self, connection: Connection, now: float, payload: bytes) -> None:
        """Check and file one text frame."""
        if (known := self._known.get(payload)) is None:
            try:
                known = self._decode(json.loads(payload))
            except (ValueError, KeyError, TypeError, AttributeError):
                fail(f"a subscriber got a malformed frame: {payload[:300]!r}")
            if len(self._known) >= CACHE_ENTRIES:
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
            record[0], record[2] = record[0] + 1, now
            if record[0] == len(self.connections):
                del self._pending[message_id]
                _emit({"id": message_id, "first": record[1], "last": record[2]})
        elif kind == SUBSCRIBED:
            connection.offset, self.unconfirmed = offset, self.unconfirmed - 1
            if not self.unconfirmed:
                self.confirmed.set_result(None)
        else:
            connection.parts[message_id] = [value]

    def _decode(self, frame: dict[str, Any]) -> tuple[int, str, str, int]:
        """A frame as ``(kind, id, text or delta, offset)``, its channel and text checked."""
        kind = frame["type"]
        if frame["channel"] != self.channel:
            fail(f"a frame came on another channel: {frame}")
        if kind == "delta":
            return DELTA, frame["id"], frame["delta"], 0
        index = int(frame.get("id", ":0").rpartition(":")[2])
        if kind == "message" and frame["text"] == "".join(wire.message_text(index, self.per)):
            return MESSAGE, frame["id"], frame["text"], frame["offset"]
        if kind == "subscribed":
            return SUBSCRIBED, "", "", frame["offset"]
        if kind == "snapshot":
            return SNAPSHOT, frame["id"], frame["text"], 0
        fail(f"a subscriber got an unexpected frame or a wrong text: {frame}")


async def _run(args: argparse.Namespace) -> None:
    subscribers = Subscribers(args.port, args.channel, args.deltas_per_message, bool(args.sse))
    await subscribers.subscribe(False, args.connections)
    reader, loop = asyncio.StreamReader(), asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode():
        if line.split()[:1] != ["deltas"]:
            fail(f"unknown command {line.strip()!r}")
        await subscribers.subscribe(line.split()[1:] == ["1"])
    os._exit(0)  # the end of input: cut every connection at once


def main(arguments: str) -> None:
    """Run with ``arguments`` as JSON: ``port``, ``channel``, ``connections``,
    ``deltas_per_message`` (10), ``nice``, how much to lower this process's priority (0), and
    ``sse``, 1 for SSE streams rather than WebSockets (0)."""
    defaults = {"deltas_per_message": 10, "nice": 0, "sse": 0}
    args = argparse.Namespace(**defaults | json.loads(arguments))
    os.nice(args.nice)
    raise_fd_limit()
    run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop  # makes each read cheaper

        run = uvloop.run
    try:
        run(_run(args))
    except Exception as exc:
        fail(f"{type(exc).__name__}: {exc}")


class SubscriberPool:
    """``connections`` subscribers of one channel, spread over a few processes."""

    def __init__(self, connections: int) -> None:
        self.connections = connections
        self.processes: list[asyncio.subprocess.Process] = []

    @property
    def pids(self) -> list[int]:
        """The processes' ids."""
        return [process.pid for process in self.processes]

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, port: int, channel: str, connections: int, processes: int, **options: int
    ) -> AsyncIterator[SubscriberPool]:
        """Start the processes (``options``: ``deltas_per_message``, ``nice``, ``sse``) and
        wait until every connection is subscribed; on the way out, end their input and wait."""
        pool, pipe = cls(connections), subprocess.PIPE
        try:
            for n in range(processes):
                if share := connections // processes + (n < connections % processes):
                    arguments = {"port": port, "channel": channel, "connections": share}
                    command = ["-m", "bench.subscribers", json.dumps(arguments | options)]
                    process = await asyncio.create_subprocess_exec(
                        sys.executable, *command, stdin=pipe, stdout=pipe
                    )
                    pool.processes.append(process)
            await pool.ready()
            yield pool
        finally:
            for process in pool.processes:
                cast(asyncio.StreamWriter, process.stdin).close()
            for process in pool.processes:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), 5)
                if process.returncode is None:
                    process.kill()
                    await process.wait()

    async def _lines(self, seconds: float, what: str) -> list[dict[str, Any]]:
        """Every process's next JSON line; an ``error`` line, an exit or a timeout fails."""
        lines = []
        try:
            async with asyncio.timeout(seconds):
                for process in self.processes:
                    if not (raw := await cast(asyncio.StreamReader, process.stdout).readline()):
                        status = await process.wait()
                        raise wire.BenchError(f"a subscriber process exited with status {status}")
                    if "error" in (line := json.loads(raw)):
                        raise wire.BenchError(f"subscriber process: {line['error']}")
                    lines.append(line)
        except TimeoutError:
            raise wire.BenchError(f"{what} within {seconds:g} s") from None
        return lines

    async def ready(self, deltas: bool | None = None) -> None:
        """Wait until every connection is subscribed; first, with ``deltas``, subscribe every
        connection again with or without live deltas."""
        for process in self.processes if deltas is not None else ():
            command = b"deltas 1\n" if deltas else b"deltas 0\n"
            cast(asyncio.StreamWriter, process.stdin).write(command)
        for line in await self._lines(120, f"{self.connections} were not all subscribed"):
            if "ready" not in line:
                raise wire.BenchError(f"subscriber process: unexpected line {line}")

    async def delivered(self, message_id: str, seconds: float) -> tuple[float, float]:
        """Wait until every connection holds ``message_id``; its first and last arrival."""
        lines = await self._lines(seconds, f"{message_id!r} did not reach every subscriber")
        if any(line.get("id") != message_id for line in lines):
            raise wire.BenchError(f"expected message {message_id!r}, the clients got {lines}")
        return min(line["first"] for line in lines), max(line["last"] for line in lines)


if __name__ == "__main__":
    main(sys.argv[1])
