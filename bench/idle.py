"""RSS per idle subscriber, WebSocket and SSE, in one run: ``python -m bench.idle``.

For each kind, a fresh relay process takes 100 warm-up subscribers, then ``--count`` more,
each on its own channel and then silent; the figure is the growth of the relay's settled RSS
divided by ``--count``. WebSocket subscribers and SSE streams are raw sockets opened by this
process (a WebSocket handshake and a subscribe, or a ``GET /sse``), so the client costs
nothing on the relay's side.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
from collections.abc import Sequence

from token_relay.testing import relay_process

from .cases import settled_rss


async def _open(port: int, kind: str, channel: str) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if kind == "sse":
        writer.write(f"GET /sse?channel={channel} HTTP/1.1\r\nHost: r\r\n\r\n".encode())
        await reader.readuntil(b"event: subscribed")
        return writer
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /subscribe?channel={channel} HTTP/1.1\r\nHost: r\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    try:
        await reader.readuntil(b"subscribed")
    except asyncio.IncompleteReadError as exc:
        raise RuntimeError(f"{head!r} then {exc.partial!r}") from None
    return writer


async def _measure(kind: str, count: int) -> float:
    relay = relay_process(
        "--max-connections-per-ip",
        str(count + 1000),
        "--max-handshakes-per-ip",
        "1000",
        name=f"idle-{kind}",
    )
    await relay.start()
    writers: list[asyncio.StreamWriter] = []
    try:
        for n in range(100):
            writers.append(await _open(relay.port, kind, f"warm-{n}"))
        before = await settled_rss(relay)
        for start in range(0, count, 200):
            batch = [_open(relay.port, kind, f"idle-{n}") for n in range(start, start + 200)]
            writers += await asyncio.gather(*batch)
        after = await settled_rss(relay)
    finally:
        for writer in writers:
            writer.close()
        await relay.stop()
    return (after - before) / count


async def run(count: int) -> dict[str, float]:
    results: dict[str, float] = {}
    for kind in ("websocket", "sse"):
        results[f"{kind}_kib_per_idle_subscriber"] = round(await _measure(kind, count) / 1024, 1)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idle", description=__doc__)
    parser.add_argument("--count", type=int, default=2000)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args.count)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
