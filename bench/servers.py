"""``python -m bench.servers --port N {noop,socketio,produce}``: the relay's side-by-side peers.

``noop``, the ceiling: a websockets server set up like the relay that only reads frames and,
to ``/?frames=N``, says ``done N`` once it has read N. ``socketio``, the peer: the relay's job
done the way many users would, with python-socketio on aiohttp and its defaults: ``event``
per delta event, ``message`` to the channel's room and ``ack`` at each final.

``produce``, the floor of ``POST /produce`` in Python: the least a Python server can do for
each request and still do the job. An asyncio protocol reads just enough HTTP/1.1 (a head
up to its blank line, its ``Content-Length``, keep-alive), decodes the body as one event,
applies it to the seed's assembler (the relay's :class:`TokenAssembler`), keeps a completed
message in a bounded history with its offset, and answers as the relay does
(``{"acks": [{"type": "ack", ...}], "errors": [], "cancels": []}``). Nothing else: no
validation, limits, sessions, rate limits, metrics, broker or subscribers; the assembler
keeps every completed text for the run, where the relay bounds them. ``GET /count``
answers the messages completed so far, and ``GET /last`` the last one kept.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import signal
import sys
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import socketio  # type: ignore[import-untyped]
from aiohttp import web
from token_relay.core.assembler import TokenAssembler
from websockets.asyncio.server import ServerConnection, serve

MAX_FRAME_BYTES = 1024 * 1024
"""The relay's default ``--max-frame-bytes``."""


async def _read(connection: ServerConnection) -> None:
    assert connection.request is not None
    query = parse_qs(urlsplit(connection.request.path).query)
    wanted = int(query.get("frames", ["0"])[0])
    count = 0
    async for _ in connection:
        count += 1
        if count == wanted:
            await connection.send(f"done {count}")


def build_socketio() -> socketio.AsyncServer:
    """The socket.io server with its events."""
    sio = socketio.AsyncServer(async_mode="aiohttp")
    producers: dict[str, tuple[str, dict[str, list[str]]]] = {}

    @sio.event  # type: ignore[untyped-decorator]
    async def connect(sid: str, environ: dict[str, Any], auth: Any = None) -> None:
        channel = auth.get("channel") if isinstance(auth, dict) else None
        if isinstance(channel, str):
            producers[sid] = (channel, {})

    @sio.event  # type: ignore[untyped-decorator]
    async def disconnect(sid: str, reason: Any = None) -> None:
        producers.pop(sid, None)

    @sio.event  # type: ignore[untyped-decorator]
    async def subscribe(sid: str, channel: str) -> dict[str, str]:
        await sio.enter_room(sid, channel)
        return {"type": "subscribed", "channel": channel}

    @sio.event  # type: ignore[untyped-decorator]
    async def event(sid: str, data: dict[str, Any]) -> None:
        channel, messages = producers[sid]
        message_id = data["id"]
        parts = messages.get(message_id)
        if parts is None:
            parts = messages[message_id] = []
        delta = data.get("delta")
        if delta is not None:
            parts.append(delta)
        if data.get("final"):
            text = "".join(messages.pop(message_id))
            await sio.emit(
                "message", {"channel": channel, "id": message_id, "text": text}, room=channel
            )
            await sio.emit("ack", {"id": message_id, "channel": channel}, to=sid)

    return sio


FLOOR_HISTORY = 1000
"""Completed messages the ``produce`` floor keeps (the relay's default ``--history-size``)."""


class ProduceFloor(asyncio.Protocol):
    """One socket of the ``produce`` floor (see the module's docstring)."""

    assembler: ClassVar[TokenAssembler] = TokenAssembler()
    history: ClassVar[collections.deque[bytes]] = collections.deque(maxlen=FLOOR_HISTORY)
    offset: ClassVar[int] = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        buffer, out = self.buffer + data, []
        while (end := buffer.find(b"\r\n\r\n")) >= 0:
            head = buffer[:end].lower()
            at = head.find(b"\r\ncontent-length:")
            length = 0
            if at >= 0:
                line_end = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : line_end if line_end >= 0 else end])
            if len(buffer) < end + 4 + length:
                break
            body, buffer = buffer[end + 4 : end + 4 + length], buffer[end + 4 + length :]
            if head.startswith(b"get /count "):
                out.append(_response(str(ProduceFloor.offset).encode()))
                continue
            if head.startswith(b"get /last "):
                out.append(_response(ProduceFloor.history[-1] if ProduceFloor.history else b""))
                continue
            out.append(_response(b'{"acks":[%b],"errors":[],"cancels":[]}' % self.apply(body)))
        self.buffer = buffer
        if out:
            self.transport.write(b"".join(out))

    @staticmethod
    def apply(body: bytes) -> bytes:
        """One event: the ack of the message it completes, or nothing."""
        event = json.loads(body)
        message_id, delta = event["id"], event.get("delta")
        final = bool(event.get("final"))
        text = ProduceFloor.assembler.feed(message_id, delta, final)
        if text is None or not final:
            return b""
        ProduceFloor.offset += 1
        record = {"type": "message", "id": message_id, "text": text, "offset": ProduceFloor.offset}
        ProduceFloor.history.append(json.dumps(record).encode())
        ack = {"type": "ack", "id": message_id, "offset": ProduceFloor.offset}
        return json.dumps(ack, separators=(",", ":")).encode()


def _response(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (
        len(body),
        body,
    )


async def _serve(kind: str, port: int) -> None:
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stopping.set)
    async with contextlib.AsyncExitStack() as stack:
        if kind == "noop":
            server = await stack.enter_async_context(
                serve(_read, "127.0.0.1", port, compression=None, max_size=MAX_FRAME_BYTES)
            )
            bound = server.sockets[0].getsockname()[1]
            name, url = "no-op websockets server", f"ws://127.0.0.1:{bound}/"
        elif kind == "produce":
            loop = asyncio.get_running_loop()
            listening = await loop.create_server(ProduceFloor, "127.0.0.1", port)
            stack.callback(listening.close)
            bound = listening.sockets[0].getsockname()[1]
            name, url = "POST /produce floor", f"http://127.0.0.1:{bound}/produce"
        else:
            app = web.Application()
            build_socketio().attach(app)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            stack.push_async_callback(runner.cleanup)
            await web.TCPSite(runner, "127.0.0.1", port).start()
            bound = runner.addresses[0][1]
            name, url = "python-socketio relay", f"http://127.0.0.1:{bound}/socket.io/"
        print(f"{name} listening on port {bound}: {url}", file=sys.stderr, flush=True)
        await stopping.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.servers")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("kind", choices=("noop", "socketio", "produce"))
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.kind, args.port))
