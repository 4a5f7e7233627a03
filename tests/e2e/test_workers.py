"""``--workers N`` as operators see it: every scrape of /metrics reports every worker, and a
worker killed with SIGKILL is logged and started again while the others serve on."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection

from ..conftest import connect, open_producer, recv_json, send_json
from ..harness import RedisServer, ServiceProcess, eventually, relay_process

CONNECTIONS = re.compile(r'^relay_connections\{role="subscriber",worker="(\d)"\} (\S+)$', re.M)
HEALTHY = re.compile(r'^relay_broker_healthy\{worker="(\d)"\} 1\.0$', re.M)
PUBLISHED_SUBSCRIBERS = re.compile(r'^relay_connections\{role="subscriber"\} (\S+)$', re.M)
PUBLISHED_HEALTHY = re.compile(r"^relay_broker_healthy 1\.0$", re.M)


async def _scrape(relay: ServiceProcess) -> tuple[set[str], float]:
    """The workers one scrape of /metrics reports (healthy), and their subscribers in all."""
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
    text = (await asyncio.wait_for(reader.read(), 5)).decode()
    writer.close()
    assert text.startswith("HTTP/1.1 200 ")
    return set(HEALTHY.findall(text)), sum(float(n) for _, n in CONNECTIONS.findall(text))


async def _subscribers_of(relay: ServiceProcess, worker: str) -> float:
    """The subscribers one worker has, as one scrape of /metrics reports them."""
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
    text = (await asyncio.wait_for(reader.read(), 5)).decode()
    writer.close()
    (count,) = [float(n) for number, n in CONNECTIONS.findall(text) if number == worker]
    return count


def _pids(relay: ServiceProcess) -> dict[int, int]:
    found = re.findall(r"worker (\d+) started \(pid (\d+)\)", relay.log)
    return {int(number): int(pid) for number, pid in found}  # the latest start of each


async def _subscribe(relay: ServiceProcess) -> ClientConnection:
    ws = await connect(f"{relay.url}/subscribe?channel=w")
    assert (await recv_json(ws))["type"] == "subscribed"
    return ws


def _published(folder: Path) -> tuple[int, float]:
    """The metrics each worker last wrote for the others (in the folder their supervisor
    made under ``folder``, its TMPDIR): how many healthy workers wrote them, and the
    subscribers they counted in all."""
    healthy, subscribers = 0, 0.0
    for path in folder.glob("token-relay-metrics-*/worker-*.prom"):
        text = path.read_text()  # replaced by a rename: whole
        healthy += bool(PUBLISHED_HEALTHY.search(text))
        subscribers += sum(float(n) for n in PUBLISHED_SUBSCRIBERS.findall(text))
    return healthy, subscribers


async def test_every_scrape_reports_every_worker_and_a_killed_worker_comes_back(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the workers share their metrics
    relay = await relay_process("--workers", "2", "--broker", redis_server.url).start()
    subscribers: list[ClientConnection] = []
    try:
        subscribers = [await _subscribe(relay) for _ in range(12)]
        # Every worker has published its metrics since the last subscriber joined: each
        # counts no more than it has, so together they count all 12 only then.
        await eventually(
            lambda: _published(tmp_path) == (2, 12), 15, what="both workers published 12"
        )

        async def both_report_twelve() -> bool:
            return await _scrape(relay) == ({"0", "1"}, 12)

        for _ in range(8):  # each scrape lands on either worker, and reports both
            assert await _scrape(relay) == ({"0", "1"}, 12)
        on_worker_1 = await _subscribers_of(relay, "1")
        first = _pids(relay)
        assert set(first) == {0, 1}
        os.kill(first[1], signal.SIGKILL)
        await eventually(lambda: _pids(relay).get(1, first[1]) != first[1], 10)
        assert re.search(r"worker 1 \(pid \d+\) exited with SIGKILL; starting it again", relay.log)
        # The killed worker's subscribers see their connections closed, and reconnect;
        # everyone is served, on both workers.
        await eventually(
            lambda: sum(ws.close_code is not None for ws in subscribers) == on_worker_1,
            10,
            what=f"the killed worker's {on_worker_1:g} subscribers closed",
        )
        alive = [ws for ws in subscribers if ws.close_code is None]
        subscribers = alive + [await _subscribe(relay) for _ in range(12 - len(alive))]
        await eventually(both_report_twelve, 10)
        async with open_producer(f"{relay.url}/produce?channel=w") as producer:
            await send_json(producer, {"id": "m", "delta": "after the kill", "final": True})
            assert (await recv_json(producer))["type"] == "ack"
        for ws in subscribers:
            assert (await recv_json(ws))["text"] == "after the kill"
    finally:
        await asyncio.gather(*(ws.close() for ws in subscribers))
        await relay.stop()
