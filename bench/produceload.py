"""``POST /produce`` under ``wrk``: 16 keep-alive connections for a few seconds, each request
one completed message as JSON (``{"id", "delta", "final": true}``, a new id each time), as a
serverless gateway posts a reply (``bench/durable/produce.lua``). Every answer is checked
(200, one ack, no error), and the channel's offset must have moved by the requests counted
(up to one more per connection, for those in flight when ``wrk`` stopped).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any
from urllib.parse import quote

from websockets.asyncio.client import connect

from . import durableprotocol as protocol
from .wire import BenchError

FAILURES = ("non2xx", "connect", "read", "write", "timeout", "unacked")


def wrk(url: str, seconds: float, prefix: str) -> dict[str, Any]:
    """One ``wrk`` run of ``produce.lua`` against ``url``; its summary and rate."""
    environment = {"APPEND_TEXT": protocol.APPEND_TEXT, "PRODUCE_PREFIX": prefix}
    return protocol.run_wrk("produce.lua", url, seconds, environment)


async def offset(port: int, channel: str) -> int:
    """The channel's latest offset, as a new subscriber is told it."""
    url = f"ws://127.0.0.1:{port}/subscribe?channel={quote(channel, safe='')}"
    async with connect(url, compression=None) as ws:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
    if frame.get("type") != "subscribed":
        raise BenchError(f"subscribing to {channel} got {frame}")
    latest: int = frame["offset"]
    return latest


async def produce_load(port: int, pid: int, channel: str, seconds: float) -> dict[str, Any]:
    """``POST /produce?channel=`` under ``wrk`` on the relay at ``port`` (process ``pid``)."""
    url = f"http://127.0.0.1:{port}/produce?channel={quote(channel, safe='')}"
    before, prefix = await offset(port, channel), secrets.token_hex(4)
    used, started = protocol.cpu([pid]), time.perf_counter()
    summary = await asyncio.to_thread(wrk, url, seconds, prefix)
    used, wall = protocol.cpu([pid]) - used, time.perf_counter() - started
    moved, count = await offset(port, channel) - before, summary["requests"]
    if any(summary[key] for key in FAILURES) or not count <= moved <= count + protocol.CONNECTIONS:
        raise BenchError(f"POST /produce under wrk: {summary}; the offset moved by {moved}")
    return {
        "posts_per_second": summary["per_second"],
        "posts": count,
        "server_cpu_percent": 100 * used / wall,
        "cpu_us_per_post": 1e6 * used / max(1, count),
    }


async def floor_count(port: int) -> int:
    """The messages the ``produce`` floor (:mod:`bench.servers`) has completed so far."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /count HTTP/1.1\r\nHost: floor\r\nContent-Length: 0\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return int(await asyncio.wait_for(reader.readexactly(length), 10))
    finally:
        writer.close()


async def floor_load(port: int, pid: int, seconds: float) -> dict[str, Any]:
    """The same load on the ``produce`` floor at ``port`` (process ``pid``), checked the
    same way: every answer acked, and the messages completed moved by the requests counted."""
    url, prefix = f"http://127.0.0.1:{port}/produce", secrets.token_hex(4)
    before = await floor_count(port)
    used, started = protocol.cpu([pid]), time.perf_counter()
    summary = await asyncio.to_thread(wrk, url, seconds, prefix)
    used, wall = protocol.cpu([pid]) - used, time.perf_counter() - started
    moved, count = await floor_count(port) - before, summary["requests"]
    if any(summary[key] for key in FAILURES) or not count <= moved <= count + protocol.CONNECTIONS:
        raise BenchError(f"the produce floor under wrk: {summary}; it completed {moved}")
    return {
        "posts_per_second": summary["per_second"],
        "posts": count,
        "server_cpu_percent": 100 * used / wall,
        "cpu_us_per_post": 1e6 * used / max(1, count),
    }
