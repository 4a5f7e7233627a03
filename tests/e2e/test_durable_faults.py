"""Durable Streams appends whose connections are cut: each lands exactly once.

An idempotent producer (``Producer-Id``, ``-Epoch``, ``-Seq``) appends through a proxy that
cuts every connection at random moments, and retries what got no answer; a request whose
answer is lost after it was applied is played on purpose too (its socket reset once the
append is in the stream). On a stream in the relay's memory (answered with no task) and on
Redis, the stream must hold every append once, in order, and each retry of an applied
append must be answered as a duplicate.
"""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from ..conftest import start_relay
from ..harness import eventually
from ..harness.proxy import Proxy

APPENDS = 80
STREAM = "/v1/stream/cut"


def _headers(seq: int) -> dict[str, str]:
    return {
        "Content-Type": "text/plain",
        "Producer-Id": "writer",
        "Producer-Epoch": "0",
        "Producer-Seq": str(seq),
    }


def _request(seq: int) -> bytes:
    """One append of ``seq`` as raw HTTP/1.1."""
    body = f"{seq};".encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in _headers(seq).items())
    return (
        f"POST {STREAM} HTTP/1.1\r\nHost: relay\r\n{head}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@pytest.mark.parametrize("on_redis", [False, True], ids=["memory", "redis"])
async def test_appends_through_a_proxy_that_cuts_land_exactly_once(
    on_redis: bool, request: pytest.FixtureRequest
) -> None:
    overrides = {"broker": request.getfixturevalue("redis_url")} if on_redis else {}
    if on_redis:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(overrides["broker"])
        await client.flushall()
        await client.aclose()
    running, relay = await start_relay(**overrides)
    port = int(running.url.rsplit(":", 1)[1])
    direct = f"http://127.0.0.1:{port}"
    async with relay, Proxy(port) as proxy, httpx.AsyncClient(timeout=5) as http:
        made = await http.put(direct + STREAM, headers={"Content-Type": "text/plain"})
        assert made.status_code == 201
        done = asyncio.Event()

        async def cut() -> None:
            while not done.is_set():
                await asyncio.sleep(random.uniform(0.005, 0.03))
                proxy.cut()

        cutter = asyncio.create_task(cut())
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{proxy.port}") as cuts:
                for seq in range(APPENDS):
                    while True:
                        try:
                            sent = await cuts.post(
                                STREAM, headers=_headers(seq), content=f"{seq};".encode()
                            )
                        except httpx.TransportError:  # cut: sent again
                            continue
                        assert sent.status_code in (200, 204), sent.text
                        assert sent.headers["producer-seq"] == str(seq)
                        break
        finally:
            done.set()
            await cutter
        assert proxy.cuts > 0

        # An append applied whose answer never came (its socket reset once it landed):
        # its retry is a duplicate.
        expected = "".join(f"{seq};" for seq in range(APPENDS + 1))

        async def content() -> str:
            read = await http.get(direct + STREAM, params={"offset": "-1"})
            return read.text

        async def applied() -> bool:
            return await content() == expected

        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_request(APPENDS))
        await eventually(applied, timeout=10, what="the append whose answer is lost")
        writer.transport.abort()
        again = await http.post(
            direct + STREAM, headers=_headers(APPENDS), content=f"{APPENDS};".encode()
        )
        assert again.status_code == 204
        assert again.headers["producer-seq"] == str(APPENDS)
        assert await content() == expected
