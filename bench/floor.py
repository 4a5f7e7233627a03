"""``python -m bench.floor --port N``: the fan-out floor, a bare ``os.write`` per socket.

It speaks as much of the relay's protocol as the fan-out case uses, and does nothing
else: subscribers of ``/subscribe?channel=`` get ``subscribed`` (and again for a
``subscribe`` frame, with or without deltas); a producer of ``/produce?channel=`` gets
``session``; its deltas are joined with a list per message, and at each final the
``message`` frame is built once and written to every subscriber's socket with one
``os.write`` each, in a plain loop, before the ``ack``. Deltas go the same way to the
subscribers that asked for them. What the relay does beyond this (validation, rules,
history, backpressure, the event loop's transports) is what the fan-out ratio charges it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from typing import cast
from urllib.parse import parse_qs, urlsplit

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.speedups import apply_mask


def _frame(payload: dict[str, object]) -> bytes:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
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
        frame = json.loads(payload)
        channel = self.channels[self.channel]
        if not self.producer:
            if frame.get("type") == "subscribe":
                self._subscribe(channel, bool(frame.get("deltas")))
            return
        message_id, delta = frame["id"], frame.get("delta")
        parts = self.parts.setdefault(message_id, [])
        if delta:
            parts.append(delta)
            if channel.deltas:
                out = {"type": "delta", "channel": self.channel, "id": message_id, "delta": delta}
                _write_all(channel.deltas, _frame(out))
        if frame.get("final"):
            channel.offset += 1
            text = "".join(self.parts.pop(message_id))
            message = {"type": "message", "channel": self.channel, "id": message_id}
            message |= {"text": text, "offset": channel.offset, "epoch": "floor"}
            _write_all(channel.plain, _frame(message))
            ack = {"type": "ack", "id": message_id, "channel": self.channel}
            self.transport.write(_frame(ack))

    def connection_lost(self, exc: Exception | None) -> None:
        channel = self.channels.get(self.channel)
        if channel is not None:
            channel.plain.pop(self.fd, None)
            channel.deltas.pop(self.fd, None)


def _write_all(descriptors: dict[int, None], frame: bytes) -> None:
    """The floor itself: one system call per socket (small frames fit a socket's buffer)."""
    write = os.write
    for fd in descriptors:
        with contextlib.suppress(BlockingIOError, OSError):
            write(fd, frame)


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
