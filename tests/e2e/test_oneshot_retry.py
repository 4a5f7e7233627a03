"""A one-shot ``POST /produce`` whose answer was lost on the way, posted again, over real
sockets: through a proxy that cuts the connection after the relay published the message and
before its answer reached the gateway. The retry is a producer of its own (the id is held
by the first attempt's), on the same relay or, behind a balancer, on another process on one
Redis (one that runs ``--workers 2``); it is acked as the first post would have been, and
subscribers get the message once. Other text under the id is still refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ..conftest import assert_silent, connect, open_producer, recv_json, send_json, start_relay
from ..harness import Balancer, Proxy, RedisServer, relay_process

ANSWER = {"acks": [{"type": "ack", "id": "m", "channel": "c"}], "errors": [], "cancels": []}
"""The answer the first post would have had, and its retry gets."""


def _request(text: str) -> bytes:
    body = json.dumps({"id": "m", "delta": text, "final": True}).encode()
    head = "POST /produce?channel=c HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


async def _post(port: int, text: str) -> tuple[int, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request(text))
    response = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return int(response.split()[1]), json.loads(response.partition(b"\r\n\r\n")[2])


@contextlib.asynccontextmanager
async def _relays(broker: str, redis_server: Any) -> AsyncIterator[tuple[Proxy, str]]:
    """The proxy the gateway posts through, and a relay's URL to subscribe at."""
    if broker == "memory":
        running, relay = await start_relay()
        async with relay:
            port = int(running.url.rsplit(":", 1)[1])
            async with Proxy(port) as proxy:
                yield proxy, running.url
        return
    server: RedisServer = redis_server
    # Two relay processes on one Redis, the second with --workers 2, behind a balancer.
    a = relay_process("--broker", server.url)
    w = relay_process("--broker", server.url, "--workers", "2")
    await asyncio.gather(a.start(), w.start())
    try:
        async with Balancer([a.port, w.port]) as balancer:
            yield balancer, a.url
    finally:
        await asyncio.gather(a.stop(), w.stop())


@pytest.mark.parametrize("broker", ["memory", "redis"])
async def test_a_one_shot_post_sent_again_after_its_answer_was_lost_is_acked_and_delivered_once(
    broker: str, request: pytest.FixtureRequest
) -> None:
    redis_server = request.getfixturevalue("redis_server") if broker == "redis" else None
    async with _relays(broker, redis_server) as (proxy, url):
        async with connect(f"{url}/subscribe?channel=c") as sub:
            assert (await recv_json(sub))["type"] == "subscribed"
            proxy.lose_answers = True
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(_request("hello"))
            delivered = await recv_json(sub)
            assert (delivered["id"], delivered["text"]) == ("m", "hello")
            proxy.cut()  # the connection ends with no answer (if the relay's close has not)
            assert b"HTTP/1.1" not in await asyncio.wait_for(reader.read(), 10)
            writer.close()
            proxy.lose_answers = False
            # Sent again whole (behind the balancer, to the other process): acked as the
            # first post would have been; nothing more reaches the subscriber.
            assert await _post(proxy.port, "hello") == (200, ANSWER)
            assert await _post(proxy.port, "hello") == (200, ANSWER)
            # So is the same whole message from a WebSocket producer (a session of its own).
            async with open_producer(f"{url}/produce?channel=c") as producer:
                await send_json(producer, {"id": "m", "delta": "hello", "final": True})
                assert await recv_json(producer) == ANSWER["acks"][0]
            await assert_silent(sub, 0.5)
            # Other text under the held id is another message: refused, nothing published.
            status, answer = await _post(proxy.port, "hello!")
            assert status == 200 and answer["acks"] == [], answer
            assert [error["code"] for error in answer["errors"]] == ["id_in_use"]
            await assert_silent(sub, 0.3)
        async with connect(f"{url}/subscribe?channel=c&rewind=10") as late:
            assert (await recv_json(late))["replayed"] == 1
            assert await recv_json(late) == delivered
