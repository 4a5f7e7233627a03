"""``python -m bench.floor --port N``: the Python floor of the relay's job, for fan-out and
ingest: a bare ``os.write`` per socket.

It speaks as much of the relay's protocol as the fan-out and ingest cases use, and does
nothing else: subscribers of ``/subscribe?channel=`` get ``subscribed`` (and again for a
``subscribe`` frame, with or without deltas); a producer of ``/produce?channel=`` gets
``session``, and sends events one per frame or in array frames. Frames are read by hand
(websockets' sans-I/O protocol takes only the handshake) and decoded with msgspec, the
relay's own decoder. Each message's deltas are joined by the seed's rules, with the Node ws
relay's bounds (``bench/wsrelay``): empty deltas count, a repeated final is acked again and
not sent again, an unseen id completes as "". At each final the ``message`` frame is built
once for every subscriber, and deltas go the same way to the subscribers that asked for
them. Everything one read of the producer's socket brings a subscriber goes to it in one
``os.write``, in a plain loop, and its acks to the producer in one write after it. What the
relay does beyond this (validation, limits, history, backpressure, the event loop's
transports) is what the fan-out and ingest ratios against the floor charge it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from msgspec.json import decode, encode
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.speedups import apply_mask

MAX_STREAMING = 10_000
"""Unfinished messages per producer; past it, the connection is closed."""
MAX_COMPLETED = 10_000
"""Completed ids remembered per producer, the oldest dropped first."""


def _frame(payload: dict[str, object]) -> bytes:
    data = encode(payload)
    return Frame(Opcode.TEXT, data).serialize(mask=False)


class Channel:
    """A channel's subscribers' sockets, by descriptor, and its offset."""

    def __init__(self) -> None:
        self.plain: dict[int, None] = {}
        self.deltas: dict[int, None] = {}
        self.offset = 0


class Connection(asyncio.Protocol):
    """One socket: the handshake with websockets' sans-I/O protocol, then frames."""

    def __init__(self, channels: dict[str, Channel]) -> None:
        self.channels = channels
        self.handshake: ServerProtocol | None = ServerProtocol()
        self.buffer = b""
        self.channel = ""
        self.producer = False
        self.parts: dict[str, list[str]] = {}
        self.completed: dict[str, str] = {}
        """A producer's completed messages' texts, by id, oldest first."""
        self.acks: list[bytes] = []
        """The producer's acks from the read being handled."""
        self.fd = -1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.fd = transport.get_extra_info("socket").fileno()

    def data_received(self, data: bytes) -> None:
        if self.handshake is not None:
            self._handshake(data)
            return
        data, at = self.buffer + data, 0
        while len(data) - at >= 6:
            length, head = data[at + 1] & 0x7F, 6
            if length == 126:
                length, head = int.from_bytes(data[at + 2 : at + 4]), 8
            elif length == 127:
                length, head = int.from_bytes(data[at + 2 : at + 10]), 14
            if len(data) - at < head + length:
                break
            opcode, mask, stop = (
                data[at] & 0x0F,
                data[at + head - 4 : at + head],
                at + head + length,
            )
            payload = apply_mask(data[at + head : stop], mask)
            at = stop
            if opcode == Opcode.TEXT.value:
                self._text(payload)
            elif opcode == Opcode.CLOSE.value:
                self.transport.close()
                return
        self.buffer = data[at:]
        _flush()
        if self.acks:
            self.transport.write(b"".join(self.acks))
            self.acks.clear()

    def _handshake(self, data: bytes) -> None:
        handshake = self.handshake
        assert handshake is not None
        handshake.receive_data(data)
        requests = [event for event in handshake.events_received() if isinstance(event, Request)]
        if not requests:
            return
        request = requests[0]
        handshake.send_response(handshake.accept(request))
        self.transport.write(b"".join(handshake.data_to_send()))
        self.handshake = None
        target = urlsplit(request.path)
        self.channel = parse_qs(target.query).get("channel", [""])[0]
        channel = self.channels.setdefault(self.channel, Channel())
        if target.path == "/produce":
            self.producer = True
            self.transport.write(_frame({"type": "session", "session": "s", "resumed": False}))
        else:
            self._subscribe(channel, "deltas=1" in target.query)

    def _subscribe(self, channel: Channel, deltas: bool) -> None:
        channel.plain[self.fd] = None
        if deltas:
            channel.deltas[self.fd] = None
        else:
            channel.deltas.pop(self.fd, None)
        subscribed = {"type": "subscribed", "channel": self.channel, "offset": channel.offset}
        self.transport.write(_frame(subscribed | {"epoch": "floor"}))

    def _text(self, payload: bytes) -> None:
        frame = decode(payload)
        channel = self.channels[self.channel]
        if not self.producer:
            if frame.get("type") == "subscribe":
                self._subscribe(channel, bool(frame.get("deltas")))
            return
        for event in frame if isinstance(frame, list) else (frame,):
            self._event(channel, event)

    def _event(self, channel: Channel, event: dict[str, Any]) -> None:
        """One event, by the seed's rules and the Node ws relay's bounds."""
        message_id = event["id"]
        text = self.completed.get(message_id)
        if text is None:
            parts = self.parts.get(message_id)
            if parts is None:
                if len(self.parts) >= MAX_STREAMING:
                    self.transport.close()
                    return
                parts = self.parts[message_id] = []
            delta = event.get("delta")
            if type(delta) is str:
                parts.append(delta)
                if channel.deltas:
                    out = {"type": "delta", "channel": self.channel, "id": message_id}
                    _write_all(channel.deltas, _frame(out | {"delta": delta}))
            if not event.get("final"):
                return
            text = "".join(parts)
            del self.parts[message_id]
            completed = self.completed
            if len(completed) >= MAX_COMPLETED:
                del completed[next(iter(completed))]
            completed[message_id] = text
            channel.offset += 1
            message = {"type": "message", "channel": self.channel, "id": message_id}
            message |= {"text": text, "offset": channel.offset, "epoch": "floor"}
            _write_all(channel.plain, _frame(message))
        elif not event.get("final"):
            return
        self.acks.append(_frame({"type": "ack", "id": message_id, "channel": self.channel}))

    def connection_lost(self, exc: Exception | None) -> None:
        channel = self.channels.get(self.channel)
        if channel is not None:
            channel.plain.pop(self.fd, None)
            channel.deltas.pop(self.fd, None)


_pending: dict[int, list[bytes]] = {}
"""Each subscriber socket's frames from the read being handled, by descriptor."""


def _write_all(descriptors: dict[int, None], frame: bytes) -> None:
    """Queue ``frame`` for each socket, until the read is handled."""
    for fd in descriptors:
        queued = _pending.get(fd)
        if queued is None:
            _pending[fd] = [frame]
        else:
            queued.append(frame)


def _flush() -> None:
    """The floor itself: one system call per socket for everything a read brought it (small
    frames fit a socket's buffer)."""
    write = os.write
    for fd, frames in _pending.items():
        with contextlib.suppress(BlockingIOError, OSError):
            write(fd, frames[0] if len(frames) == 1 else b"".join(frames))
    _pending.clear()


async def _serve(port: int) -> None:
    stopping, loop = asyncio.Event(), asyncio.get_running_loop()
    channels: dict[str, Channel] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    server = await loop.create_server(lambda: Connection(channels), "127.0.0.1", port, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    print(f"os.write floor listening on port {bound}: ws://127.0.0.1:{bound}/", file=sys.stderr)
    sys.stderr.flush()
    async with server:
        await stopping.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.floor")
    parser.add_argument("--port", type=int, default=0)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(parser.parse_args().port))
