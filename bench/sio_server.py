"""``python -m bench.sio_server``: the same relay job done the way many users would, with
python-socketio (served by aiohttp), as the peer of the ingest case.

Events (socket.io events on the default namespace):

* a producer connects with ``auth={"channel": C}`` and emits one ``event`` per delta event,
  the same ``{"id", "delta"?, "final"?}`` objects the relay takes;
* the server assembles per connection with a dict of lists (append each delta, join at the
  final) and, at each final, emits ``message`` ``{"channel", "id", "text"}`` to the room
  named after the channel and ``ack`` ``{"id", "channel"}`` back to the producer;
* a subscriber calls ``subscribe`` with a channel name, which joins it to that room.

The server runs python-socketio's defaults (one task per incoming event, JSON with the
standard library); it validates nothing, keeps no history and numbers nothing, so it does
less than the relay per event. How the benchmark drives it is in :mod:`bench.ingest`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

import socketio  # type: ignore[import-untyped]
from aiohttp import web

__all__ = ["build", "main"]


def build() -> socketio.AsyncServer:
    """The socket.io server with its three events."""
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


async def _serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    app = web.Application()
    build().attach(app)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    bound = listener.getsockname()[1]
    try:
        await web.SockSite(runner, listener).start()
        print(
            f"python-socketio relay listening on port {bound}: http://127.0.0.1:{bound}/socket.io/",
            file=sys.stderr,
            flush=True,
        )
        await stopping.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sio_server")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
