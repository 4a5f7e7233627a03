"""--max-memory-bytes over real sockets: past it new messages get ``overloaded``, messages
under way go on, the metrics say so, and a producer client's message gets through once
memory is free again, whole and once."""

from __future__ import annotations

import asyncio
import time

from token_relay.client import RelayProducer
from token_relay.core.durable import ENTRY_OVERHEAD

from ..conftest import recv_json, send_json, start_relay
from ..harness import eventually


async def _metric(port: int, name: str) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
    text = (await asyncio.wait_for(reader.read(), 5)).decode()
    writer.close()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} in /metrics")


async def test_past_the_memory_limit_new_messages_wait_and_old_ones_go_on() -> None:
    running, relay = await start_relay(max_memory_bytes=10_000, history_ttl=1.0)
    port = int(running.url.rsplit(":", 1)[1])
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        async with running.connect("/produce?channel=c") as producer:
            chunk = "0123456789" * 100
            for _ in range(11):  # 11,000 characters under way
                await send_json(producer, {"id": "big", "delta": chunk})
            await eventually(lambda: relay.producers.memory_in_use() > 10_000, 5)
            await asyncio.sleep(0.15)  # the count is at most 0.1 s old
            await send_json(producer, {"id": "new", "delta": "hello"})
            refused = await recv_json(producer)
            assert (refused["type"], refused["code"], refused["id"]) == (
                "error",
                "overloaded",
                "new",
            )
            assert refused["expected"] == 1
            # The message under way goes on to its end.
            await send_json(producer, {"id": "big", "delta": "!", "final": True})
            assert (await recv_json(producer))["type"] == "ack"
            assert (await recv_json(sub))["text"] == chunk * 11 + "!"
            assert await _metric(port, "relay_overloaded_total") == 1
            assert await _metric(port, "relay_memory_bytes") > 10_000
            assert await _metric(port, "relay_memory_limit_bytes") == 10_000
            assert await _metric(port, "relay_parked_sessions") == 0
            assert await _metric(port, "relay_broker_healthy") == 1
        # A client's message waits while the relay is full, and arrives once memory frees:
        # the producer's session ended, and the history outlives its ttl.
        async with RelayProducer(running.url, channel="c", backoff=(0.05, 0.3)) as gateway:
            await gateway.send("later", "patient ")
            await gateway.send("later", "text")
            ack = await asyncio.wait_for(gateway.finish("later"), 15)
            assert ack.id == "later"
        frame = await recv_json(sub)
        assert (frame["id"], frame["text"]) == ("later", "patient text")
        assert await _metric(port, "relay_memory_bytes") < 10_000
        assert await _metric(port, "relay_overloaded_total") >= 2  # it was refused, and waited


async def test_durable_stream_data_counts_against_the_limit_for_new_messages() -> None:
    running, relay = await start_relay(max_memory_bytes=10_000)
    http = running.url.replace("ws://", "http://")
    async with relay, running.connect("/produce?channel=c") as producer:
        await send_json(producer, {"id": "under-way", "delta": "x" * 20})
        await eventually(lambda: relay.producers.memory_in_use() == 20, 5)
        # The stream takes what the message leaves; the two together reach the limit.
        assert await _http(http, "PUT", "/v1/stream/big", b"x" * (9_990 - ENTRY_OVERHEAD)) == 201
        await eventually(lambda: relay.producers.overloaded(time.monotonic()), 5)
        await send_json(producer, {"id": "after", "delta": "hello"})
        refused = await recv_json(producer)
        assert (refused["type"], refused["code"], refused["id"]) == ("error", "overloaded", "after")
        # Freed by the stream's delete, it is taken again.
        assert await _http(http, "DELETE", "/v1/stream/big") == 204
        await eventually(lambda: not relay.producers.overloaded(time.monotonic()), 5)
        await send_json(producer, {"id": "after", "delta": "hello", "final": True})
        assert (await recv_json(producer))["type"] == "ack"


async def _http(base: str, method: str, path: str, body: bytes = b"") -> int:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: relay\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + body
    )
    status_line = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    return int(status_line.split()[1])
