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
from collections.abc import Awaitable, Callable
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
    return await _loaded(url, pid, seconds, lambda: offset(port, channel), "POST /produce")


async def floor_get(port: int, path: str) -> bytes:
    """The body of ``GET path`` from the ``produce`` floor (:mod:`bench.producefloor`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET %b HTTP/1.1\r\nHost: floor\r\nContent-Length: 0\r\n\r\n" % path.encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        return await asyncio.wait_for(reader.readexactly(length), 10)
    finally:
        writer.close()


async def floor_count(port: int) -> int:
    """The messages the ``produce`` floor has completed so far."""
    return int(await floor_get(port, "/count"))


async def floor_load(port: int, pid: int, seconds: float) -> dict[str, Any]:
    """The same load on the ``produce`` floor at ``port`` (process ``pid``), checked the
    same way: every answer acked, and the messages completed moved by the requests counted."""
    url = f"http://127.0.0.1:{port}/produce"
    return await _loaded(url, pid, seconds, lambda: floor_count(port), "the produce floor")


async def edge_load(port: int, pid: int, seconds: float) -> dict[str, Any]:
    """``GET /healthz`` of the relay at ``port`` (process ``pid``) under the same ``wrk`` load:
    its HTTP edge alone, with no relay work, which bounds every request through it. Every
    answer must be 200."""
    url = f"http://127.0.0.1:{port}/healthz"
    used, started = protocol.cpu([pid]), time.perf_counter()
    summary = await asyncio.to_thread(protocol.wrk, url, seconds, False)
    used, wall = protocol.cpu([pid]) - used, time.perf_counter() - started
    if any(summary[key] for key in FAILURES if key in summary) or not summary["requests"]:
        raise BenchError(f"GET /healthz under wrk: {summary}")
    return {
        "requests_per_second": summary["per_second"],
        "requests": summary["requests"],
        "server_cpu_percent": 100 * used / wall,
        "cpu_us_per_request": 1e6 * used / max(1, summary["requests"]),
    }


async def _loaded(
    url: str, pid: int, seconds: float, count: Callable[[], Awaitable[int]], what: str
) -> dict[str, Any]:
    """``wrk`` posting to ``url``: every answer must ack its message, and ``count()`` (the
    messages stored) must move by the requests ``wrk`` counted, and at most one more per
    connection (those in flight when it stopped)."""
    before, prefix = await count(), secrets.token_hex(4)
    used, started = protocol.cpu([pid]), time.perf_counter()
    summary = await asyncio.to_thread(wrk, url, seconds, prefix)
    used, wall = protocol.cpu([pid]) - used, time.perf_counter() - started
    moved, posts = await count() - before, summary["requests"]
    if any(summary[key] for key in FAILURES) or not posts <= moved <= posts + protocol.CONNECTIONS:
        raise BenchError(f"{what} under wrk: {summary}; {moved} messages were stored")
    return {
        "posts_per_second": summary["per_second"],
        "posts": posts,
        "server_cpu_percent": 100 * used / wall,
        "cpu_us_per_post": 1e6 * used / max(1, posts),
    }
