"""``python -m bench.subscribers``: one process holding many cheap subscriber connections.

Each connection is a :class:`~bench.wire.RawSubscriber` (a bare asyncio protocol after a
hand-made upgrade handshake) subscribed to one channel through the URL. The fan-out and
memory cases start a few of these processes, so that the clients share the work and are not
what is measured.

Every ``message`` frame is checked: its text must be exactly that of the message the id
names (ids are ``ROUND:N``, texts :func:`bench.messages.message_text`), its offset must
follow the connection's last one (no gap, no repeat), and on connections that take deltas,
the deltas received for it must add up to that same text. Every connection gets the same
bytes for a frame, so a frame is decoded and its text checked once, then recognised by its
bytes. The process runs on uvloop when it is installed (``--loop``), which makes each read
cheaper, and can lower its own priority (``--nice``).

Lines written to stdout, one JSON object each:

* ``{"ready": N}``: all N connections are subscribed (again after each ``deltas`` command).
* ``{"id": ID, "first": T, "last": T}``: every connection holds message ``ID``; ``T`` are
  the first and last arrival times, ``time.time()``, so comparable across processes.
* ``{"error": TEXT}``: something was wrong; the process exits with status 1.

Commands read from stdin, one a line: ``deltas 1`` or ``deltas 0`` subscribes every
connection again with or without live deltas; end of input closes every connection and
exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any
from urllib.parse import quote

from .errors import BenchError
from .messages import message_text
from .wire import RawSubscriber

__all__ = ["main", "raise_fd_limit"]


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


DELTA, MESSAGE, SUBSCRIBED, SNAPSHOT = range(4)
KNOWN_FRAMES = 10_000
"""Decoded frames remembered by their bytes."""


class _State:
    """Per connection: the last offset and the deltas of messages in progress."""

    __slots__ = ("offset", "parts")

    def __init__(self) -> None:
        self.offset = 0
        self.parts: dict[str, list[str]] = {}


def _event_loop_runner(loop: str) -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop's runner when asked for and installed (it makes each read cheaper), else asyncio's."""
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            runner: Callable[[Coroutine[Any, Any, None]], None] = uvloop.run
            return runner
    return asyncio.run


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


class Subscribers:
    """The connections of this process and what they received."""

    def __init__(self, host: str, port: int, channel: str, deltas_per_message: int) -> None:
        self.host = host
        self.port = port
        self.channel = channel
        self.deltas_per_message = deltas_per_message
        self.connections: list[RawSubscriber] = []
        self.deltas = False
        self.confirmed = 0
        self.confirmations_wanted = 0
        self.all_confirmed = asyncio.Event()
        self.failure: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.closing = False
        self._texts: dict[int, str] = {}
        self._known: dict[bytes, tuple[int, str, str, int]] = {}
        self._pending: dict[str, list[float]] = {}
        """Per message id: how many connections hold it, first and last arrival."""

    def _fail(self, text: str) -> None:
        if not self.failure.done():
            self.failure.set_result(text)

    def expected(self, message_id: str) -> str:
        """The text of the message named by ``message_id``."""
        index = int(message_id.rpartition(":")[2])
        text = self._texts.get(index)
        if text is None:
            text = self._texts[index] = "".join(message_text(index, self.deltas_per_message))
        return text

    async def open(self, count: int, concurrency: int, deltas: bool) -> None:
        """Open and subscribe ``count`` connections, ``concurrency`` handshakes at a time."""
        self.deltas = deltas
        target = f"/subscribe?channel={quote(self.channel, safe='')}" + (
            "&deltas=1" if deltas else ""
        )
        self.confirmed = 0
        self.confirmations_wanted = count
        self.all_confirmed.clear()
        loop = asyncio.get_running_loop()
        gate = asyncio.Semaphore(concurrency)

        def connection() -> RawSubscriber:
            # Frames can arrive before create_connection() returns: set the state up here.
            protocol = RawSubscriber(
                self.host, self.port, target, self.on_frame, time.time, self.on_lost
            )
            protocol.state = _State()
            self.connections.append(protocol)
            return protocol

        async def one() -> None:
            async with gate:
                _, protocol = await loop.create_connection(connection, self.host, self.port)
                await protocol.opened

        await asyncio.gather(*(one() for _ in range(count)))
        await self._confirmed()

    async def resubscribe(self, deltas: bool) -> None:
        """Subscribe every connection again, with or without deltas."""
        self.deltas = deltas
        frame = json.dumps({"type": "subscribe", "channel": self.channel, "deltas": deltas})
        payload = frame.encode()
        self.confirmed = 0
        self.confirmations_wanted = len(self.connections)
        self.all_confirmed.clear()
        for connection in self.connections:
            connection.send(payload)
        await self._confirmed()

    async def _confirmed(self) -> None:
        waiter = asyncio.ensure_future(self.all_confirmed.wait())
        pending: list[asyncio.Future[Any]] = [waiter, self.failure]
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self.failure.done():
            raise BenchError(self.failure.result())
        _emit({"ready": len(self.connections)})

    def on_lost(self, connection: RawSubscriber) -> None:
        if not self.closing:
            reason = connection.lost_reason
            self._fail(
                "a subscriber connection was closed"
                + (f": {type(reason).__name__}: {reason}" if reason else " by the relay")
            )

    def on_frame(self, connection: RawSubscriber, now: float, payload: bytes) -> None:
        # Every subscriber gets the same bytes for a frame: decode and check them once.
        known = self._known.get(payload)
        if known is None:
            try:
                known = self._decode(payload)
            except (ValueError, KeyError, TypeError, AttributeError):
                self._fail(f"a subscriber got a malformed frame: {payload[:300]!r}")
                return
            if known is None:
                return
            if len(self._known) >= KNOWN_FRAMES:
                self._known.clear()
            self._known[payload] = known
        kind, message_id, value, offset = known
        state: _State = connection.state  # type: ignore[assignment]
        if kind == DELTA:
            held = state.parts.get(message_id)
            if held is None:
                state.parts[message_id] = [value]
            else:
                held.append(value)
        elif kind == MESSAGE:
            self._on_message(state, now, message_id, value, offset)
        elif kind == SUBSCRIBED:
            state.offset = offset
            self.confirmed += 1
            if self.confirmed == self.confirmations_wanted:
                self.all_confirmed.set()
        else:
            state.parts[message_id] = [value]

    def _decode(self, payload: bytes) -> tuple[int, str, str, int] | None:
        """A frame as ``(kind, id, text or delta, offset)``, its text checked; None if bad."""
        frame = json.loads(payload)
        kind = frame["type"]
        if frame["channel"] != self.channel:
            self._fail(f"a frame came on channel {frame['channel']!r}: {payload[:300]!r}")
            return None
        if kind == "delta":
            return DELTA, frame["id"], frame["delta"], 0
        if kind == "message":
            message_id = frame["id"]
            if frame["text"] != self.expected(message_id):
                self._fail(f"message {message_id!r} arrived with the wrong text: {frame['text']!r}")
                return None
            return MESSAGE, message_id, frame["text"], frame["offset"]
        if kind == "subscribed":
            return SUBSCRIBED, "", "", frame["offset"]
        if kind == "snapshot":
            return SNAPSHOT, frame["id"], frame["text"], 0
        self._fail(f"a subscriber got an unexpected frame: {payload[:300]!r}")
        return None

    def _on_message(
        self, state: _State, now: float, message_id: str, text: str, offset: int
    ) -> None:
        if offset != state.offset + 1:
            self._fail(
                f"message {message_id!r} has offset {offset}, expected {state.offset + 1} "
                "(a gap, a repeat or reordering)"
            )
            return
        state.offset = offset
        held = state.parts.pop(message_id, None)
        if self.deltas and "".join(held or ()) != text:
            self._fail(f"the deltas of {message_id!r} add up to {''.join(held or ())!r}")
            return
        record = self._pending.get(message_id)
        if record is None:
            record = self._pending[message_id] = [0.0, now, now]
        record[0] += 1
        record[2] = now
        if record[0] == len(self.connections):
            del self._pending[message_id]
            _emit({"id": message_id, "first": record[1], "last": record[2]})

    def close(self) -> None:
        """Cut every connection at once."""
        self.closing = True
        for connection in self.connections:
            if connection.transport is not None:
                connection.transport.abort()


async def _commands(subscribers: Subscribers) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        words = line.decode().split()
        if words[:1] == ["deltas"] and len(words) == 2:
            await subscribers.resubscribe(words[1] == "1")
        elif words:
            raise BenchError(f"unknown command {line.decode().strip()!r}")


async def run(args: argparse.Namespace) -> None:
    subscribers = Subscribers(args.host, args.port, args.channel, args.deltas_per_message)
    try:
        await subscribers.open(args.connections, args.concurrency, args.deltas)
        commands = asyncio.ensure_future(_commands(subscribers))
        pending: list[asyncio.Future[Any]] = [commands, subscribers.failure]
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if subscribers.failure.done():
            commands.cancel()
            raise BenchError(subscribers.failure.result())
        commands.result()
    finally:
        subscribers.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.subscribers")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--channel", required=True)
    parser.add_argument("--connections", type=int, required=True)
    parser.add_argument("--deltas", action="store_true", help="subscribe with live deltas")
    parser.add_argument("--deltas-per-message", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=25, help="handshakes at a time")
    parser.add_argument(
        "--loop", choices=("uvloop", "asyncio"), default="uvloop", help="uvloop if installed"
    )
    parser.add_argument("--nice", type=int, default=0, help="lower this process's priority")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    if raise_fd_limit() < args.connections + 64:
        _emit({"error": f"the open-file limit is too low for {args.connections} connections"})
        return 1
    try:
        _event_loop_runner(args.loop)(run(args))
    except BenchError as exc:
        _emit({"error": str(exc)})
        return 1
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _emit({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
