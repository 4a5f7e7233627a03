"""``python -m bench.noop_server``: the ceiling of the ingest cases.

A websockets server configured like the relay (no compression, the same 1 MiB frame limit)
that only reads frames: the most a Python websockets process can take in on one connection.
A client connects to ``/?frames=N``; once the server has read N frames it answers one text
frame, ``done N``, which is how the load generator times it. Nothing else is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection, serve

__all__ = ["main"]

MAX_FRAME_BYTES = 1024 * 1024
"""The relay's default ``--max-frame-bytes``."""


async def _read(connection: ServerConnection) -> None:
    request = connection.request
    assert request is not None
    query = parse_qs(urlsplit(request.path).query)
    wanted = int(query.get("frames", ["0"])[0])
    count = 0
    async for _ in connection:
        count += 1
        if count == wanted:
            await connection.send(f"done {count}")


async def _serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    async with serve(
        _read, "127.0.0.1", port, compression=None, max_size=MAX_FRAME_BYTES
    ) as server:
        bound = server.sockets[0].getsockname()[1]
        print(
            f"no-op websockets server listening on port {bound}: ws://127.0.0.1:{bound}/",
            file=sys.stderr,
            flush=True,
        )
        await stopping.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.noop_server")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
