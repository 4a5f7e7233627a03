"""Soak: many producers and subscribers for a bounded time against a relay process.

Every acknowledged message must reach every subscriber exactly once with its
exact text, and the relay's resident memory must stay flat after warm-up.

Duration: by default a short smoke of :data:`SMOKE_SECONDS` that makes the same checks;
``pytest --soak-seconds N`` runs it for N seconds instead (release checks use 20 or more).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection

from ..conftest import connect
from ..harness import relay_process

SMOKE_SECONDS = 1.0
PRODUCERS = 8
SUBSCRIBERS = 40
CHANNELS = 4


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def produce(
    url: str, number: int, stop: asyncio.Event, sent: dict[str, tuple[str, str]]
) -> int:
    """Stream messages, interleaved, until ``stop``; record each acked message."""
    rng = random.Random(number)
    acked = 0
    async with connect(f"{url}/produce", max_queue=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session"
        serial = 0
        while not stop.is_set():
            channel = f"soak-{rng.randrange(CHANNELS)}"
            ids = [f"p{number}-{serial + k}" for k in range(3)]
            serial += 3
            texts = {mid: "" for mid in ids}
            for _ in range(rng.randint(5, 30)):
                mid = rng.choice(ids)
                delta = rng.choice(["tok", " ", "é", "🚀", "", "word ", "\n"]) * rng.randint(1, 3)
                texts[mid] += delta
                await ws.send(json.dumps({"id": mid, "delta": delta, "channel": channel}))
            for mid in ids:
                await ws.send(json.dumps({"id": mid, "final": True, "channel": channel}))
            for _ in ids:
                reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
                assert reply["type"] == "ack", reply
                sent[reply["id"]] = (reply["channel"], texts[reply["id"]])
                acked += 1
            await asyncio.sleep(rng.uniform(0, 0.01))
    return acked


async def subscribe(url: str, channel: str, deltas: bool) -> ClientConnection:
    ws = await connect(f"{url}/subscribe?channel={channel}&deltas={int(deltas)}", max_queue=None)
    assert json.loads(await ws.recv())["type"] == "subscribed"
    return ws


async def collect(ws: ClientConnection, got: dict[str, str], duplicates: list[str]) -> None:
    async for raw in ws:
        frame = json.loads(raw)
        if frame["type"] == "message":
            if frame["id"] in got:
                duplicates.append(frame["id"])
            got[frame["id"]] = frame["text"]


async def test_soak_many_producers_and_subscribers(request: pytest.FixtureRequest) -> None:
    option: float | None = request.config.getoption("--soak-seconds")
    seconds = SMOKE_SECONDS if option is None else option
    relay = await relay_process().start()
    assert relay.process is not None
    try:
        received: list[dict[str, str]] = []
        duplicates: list[str] = []
        subscribers = []
        channels_of = []
        for n in range(SUBSCRIBERS):
            channel = f"soak-{n % CHANNELS}"
            got: dict[str, str] = {}
            ws = await subscribe(relay.url, channel, n % 2 == 0)
            subscribers.append(ws)
            received.append(got)
            channels_of.append(channel)
        readers = [
            asyncio.create_task(collect(ws, got, duplicates))
            for ws, got in zip(subscribers, received, strict=True)
        ]
        stop = asyncio.Event()
        sent: dict[str, tuple[str, str]] = {}
        producers = [
            asyncio.create_task(produce(relay.url, n, stop, sent)) for n in range(PRODUCERS)
        ]
        await asyncio.sleep(seconds / 3)
        warm = rss_bytes(relay.process.pid)
        await asyncio.sleep(seconds * 2 / 3)
        stop.set()
        acked = sum(await asyncio.gather(*producers))
        late = rss_bytes(relay.process.pid)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            counts = [
                sum(1 for channel, _ in sent.values() if channel == channels_of[n])
                for n in range(SUBSCRIBERS)
            ]
            if all(len(got) >= count for got, count in zip(received, counts, strict=True)):
                break
            await asyncio.sleep(0.1)
        for ws in subscribers:
            await ws.close()
        await asyncio.gather(*readers, return_exceptions=True)
    finally:
        await relay.stop()
    assert acked == len(sent) > 0
    assert duplicates == []
    for n, got in enumerate(received):
        expected = {mid: text for mid, (channel, text) in sent.items() if channel == channels_of[n]}
        assert got == expected
    print(
        f"soak: {seconds:g}s, {PRODUCERS} producers, {SUBSCRIBERS} subscribers, "
        f"{acked} messages, {sum(len(g) for g in received)} deliveries, "
        f"RSS {warm / 2**20:.1f} MiB after warm-up, {late / 2**20:.1f} MiB at the end"
    )
    # Flat after warm-up: some allocator slack, no growth with the traffic.
    assert late < warm * 1.25 + 8 * 2**20
