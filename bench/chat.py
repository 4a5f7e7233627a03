"""``python -m bench.chat``: a chat request's round trip through ``/ai-sdk/ws``, on one relay
process and across two processes on Redis.

A transport client (a raw WebSocket speaking ``WebSocketChatTransport``'s frames, one
connection) sends ``--requests`` requests one after another; a gateway (the Python
client's ``RelayProducer``, connected with ``channel=``) answers each with a three-word
reply and its final. Each request is timed from its ``send`` frame to its ``end`` frame,
and the figure is the median and p99, in milliseconds (the relays lift
``--max-subscribes-per-second``, which requests count against), for:

* ``one process``: the gateway and the transport on one relay (``memory://``);
* ``one process, Redis``: both on one relay on Redis (the request is handed in-process,
  the reply goes through Redis);
* ``two processes, Redis``: the gateway on relay A, the transport on relay B (the request
  goes through Redis to A's inbox, and A's answer back).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from token_relay.client import RelayProducer
from websockets.asyncio.client import connect

from tests.harness import RedisServer, ServiceProcess

from .cases import check_alive, percentile, relay, started

CHAT = "bench-chat"
LIFTED = ("--max-subscribes-per-second", "100000")
"""Requests count as subscribes: the bench sends more than the default allows."""
REGISTER_SECONDS = 5.0
"""How long a request refused with ``no_producer`` is sent again: the gateway may not be
registered yet. Past it the figure is "refused"."""
QUESTION = {"id": "u", "role": "user", "parts": [{"type": "text", "text": "Hi"}]}


async def _gateway(producer: RelayProducer) -> None:
    async for request in producer.requests():
        for word in ("Hello", ", ", "world"):
            await producer.send(request.id, word, channel=request.channel)
        await producer.finish(request.id, channel=request.channel)


async def round_trips(
    gateway_at: ServiceProcess, transport_at: ServiceProcess, count: int
) -> list[float]:
    """Seconds from each ``send`` to its ``end``."""
    seconds: list[float] = []
    async with RelayProducer(gateway_at.url, channel=CHAT) as producer:
        answering = asyncio.create_task(_gateway(producer))
        try:
            async with connect(transport_at.url + "/ai-sdk/ws") as ws:
                for index in range(-10, count):  # 10 to warm up
                    send = {
                        "type": "send", "requestId": f"r{index}", "id": CHAT,
                        "trigger": "submit-message", "messages": [QUESTION],
                    }  # fmt: skip
                    began = time.perf_counter()
                    await ws.send(json.dumps(send))
                    while True:
                        frame = json.loads(await ws.recv())
                        if frame["type"] == "error" and "no_producer" in frame["errorText"]:
                            if time.perf_counter() - began > REGISTER_SECONDS:
                                return []  # no gateway took it: refused
                            await asyncio.sleep(0.05)  # the gateway is not registered yet
                            await ws.send(json.dumps(send))
                            continue
                        if frame["type"] in ("end", "error"):
                            break
                    if frame["type"] == "error":
                        raise RuntimeError(frame["errorText"])
                    if index >= 0:
                        seconds.append(time.perf_counter() - began)
        finally:
            answering.cancel()
    return seconds


async def run(count: int) -> list[tuple[str, list[float]]]:
    notable: list[str] = []
    rows: list[tuple[str, list[float]]] = []
    with tempfile.TemporaryDirectory(prefix="token-relay-bench-") as directory:
        redis = RedisServer(Path(directory))
        redis.start()
        try:
            single = relay("S", *LIFTED)
            first = relay("A", "--broker", redis.url, *LIFTED)
            second = relay("B", "--broker", redis.url, *LIFTED)
            async with started(single, first, second, notable=notable):
                rows.append(("one process", await round_trips(single, single, count)))
                rows.append(("one process, Redis", await round_trips(first, first, count)))
                rows.append(("two processes, Redis", await round_trips(first, second, count)))
                check_alive(single, first, second)
        finally:
            redis.kill()
    for line in notable:
        print("note:", line)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chat", description=__doc__)
    parser.add_argument("--requests", type=int, default=300, help="requests per figure (300)")
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args.requests))
    print(f"{'send to end, ' + str(args.requests) + ' requests':<28} {'p50':>9} {'p99':>9}")
    for what, seconds in rows:
        if not seconds:
            print(f"{what:<28} refused (no_producer)")
            continue
        p50 = statistics.median(seconds) * 1000
        p99 = percentile(seconds, 99) * 1000
        print(f"{what:<28} {p50:6.2f} ms {p99:6.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
