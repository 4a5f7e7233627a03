"""``python -m bench.servers --port N {noop,socketio}``: the relay's side-by-side peers.

``noop``, the ceiling of websockets' asyncio connection (not of Python: ``bench.floor``
reads and applies frames faster by hand): a websockets server set up like the relay that
only reads frames and, to ``/?frames=N``, says ``done N`` once it has read N.
``socketio``, the peer: the relay's job done the way many users would, with python-socketio
on aiohttp and its defaults: ``event`` per delta event, ``message`` to the channel's room and
``ack`` at each final.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any
from urllib.parse import parse_qs, urlsplit

import socketio  # type: ignore[import-untyped]
from aiohttp import web
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
    parser.add_argument("kind", choices=("noop", "socketio"))
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.kind, args.port))
