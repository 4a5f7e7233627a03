"""Webhooks measured: ``python -m bench.webhooks`` (from the repository root).

In one run, against real relay processes (``python -m token_relay --port 0``):

1. **Ingest without webhooks** (the baseline): ``--producers`` producers stream ``--messages``
   messages in all, each of ``--deltas`` deltas and a final, spread over ``--channels``
   channels, as fast as the relay acknowledges them. Figure: events per second.
2. **Ingest with ``--webhook``** to a local receiver that answers 204 at once (aiohttp, in a
   process of its own): the same load. Figures: events per second, and its ratio to (1), the
   webhooks' cost to ingest; webhook throughput, messages per second from the first final's
   ack to the last message's arrival at the receiver; the lag from each final's ack to its
   webhook's arrival, p50 and p99.

The receiver runs ``python -m bench.webhooks --receiver PORT`` and prints every arrival
(webhook id, message id, Unix time) as JSON when it is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from websockets.asyncio.client import connect

from tests.harness import ServiceProcess, free_port, relay_process

from .cases import percentile


async def _receive(port: int) -> None:
    from aiohttp import web

    arrivals: list[tuple[str, str, float]] = []

    async def hook(request: web.Request) -> web.Response:
        body = await request.json()
        arrivals.append((request.headers["webhook-id"], body["id"], time.time()))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()
    print(json.dumps(arrivals), flush=True)


async def _ingest(url: str, args: argparse.Namespace) -> tuple[float, dict[str, float]]:
    """Stream the load; returns events per second and each message's ack time."""
    acked: dict[str, float] = {}
    per_producer = args.messages // args.producers

    async def produce(p: int) -> None:
        async with connect(f"{url}/produce", max_size=None) as ws:
            await ws.recv()  # session
            for n in range(per_producer):
                message_id = f"p{p}-{n}"
                channel = f"ch{(p * per_producer + n) % args.channels}"
                for d in range(args.deltas):
                    frame = {"id": message_id, "delta": f"token {d} ", "channel": channel}
                    await ws.send(json.dumps(frame))
                await ws.send(json.dumps({"id": message_id, "final": True, "channel": channel}))
                answer = json.loads(await ws.recv())
                assert answer["type"] == "ack", answer
                acked[message_id] = time.time()

    started = time.perf_counter()
    await asyncio.gather(*(produce(p) for p in range(args.producers)))
    elapsed = time.perf_counter() - started
    events = per_producer * args.producers * (args.deltas + 1)
    return events / elapsed, acked


async def _relay(*flags: str) -> ServiceProcess:
    relay = relay_process("--max-events-per-second", "1000000000", *flags)
    await relay.start()
    return relay


async def run(args: argparse.Namespace) -> dict[str, Any]:
    baseline = await _relay()
    try:
        base_rate, _ = await _ingest(baseline.url, args)
    finally:
        await baseline.stop()
    port = free_port()
    receiver = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.webhooks", "--receiver", str(port),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert receiver.stdout is not None
    assert (await receiver.stdout.readline()).strip() == b"ready"
    relay = await _relay(
        "--webhook", f"http://127.0.0.1:{port}/hook",
        "--webhook-concurrency", str(args.concurrency),
        "--webhook-max-pending", str(max(10_000, args.messages)),
    )  # fmt: skip
    try:
        rate, acked = await _ingest(relay.url, args)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            outbox = await _metric(relay.port, "relay_webhook_outbox")
            if outbox == 0:
                break
            await asyncio.sleep(0.05)
    finally:
        await relay.stop()
        receiver.send_signal(signal.SIGTERM)
        output, _ = await receiver.communicate()
    arrivals = json.loads(output.decode().strip().splitlines()[-1])
    first_arrival: dict[str, float] = {}
    for _hook_id, message_id, at in arrivals:
        first_arrival.setdefault(message_id, at)
    lags = [first_arrival[m] - acked[m] for m in acked if m in first_arrival]
    span = max(first_arrival.values()) - min(acked.values())
    ingest_end = max(acked.values())
    after = sorted(at for at in first_arrival.values() if at > ingest_end)
    drain_rate = (len(after) - 1) / (after[-1] - after[0]) if len(after) > 1 else None
    return {
        "messages": len(acked),
        "received": len(first_arrival),
        "ingest_events_per_s_without": round(base_rate),
        "ingest_events_per_s_with": round(rate),
        "ingest_ratio_with_to_without": round(rate / base_rate, 3),
        "webhook_messages_per_s": round(len(first_arrival) / span),
        "webhook_messages_per_s_after_ingest": drain_rate and round(drain_rate),
        "lag_p50_ms": round(percentile(lags, 50) * 1000, 1),
        "lag_p99_ms": round(percentile(lags, 99) * 1000, 1),
    }


async def _metric(port: int, name: str) -> float | None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = (await reader.read()).decode()
    writer.close()
    for line in data.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.webhooks", description=__doc__)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--deltas", type=int, default=20)
    parser.add_argument("--producers", type=int, default=10)
    parser.add_argument("--channels", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--receiver", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.receiver:
        asyncio.run(_receive(args.receiver))
        return 0
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
