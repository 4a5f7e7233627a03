"""``python -m bench.exactness``: count exactness failures where users deploy them.

Each check plays a fault many times against real relay processes and real redis-server
processes, and counts what went wrong:

* ``joins``: subscribers join with deltas at random moments while messages stream; a join is
  wrong if a message is not its snapshot plus the deltas that followed, or if a ``message`` at
  or below the subscribed offset arrives live;
* ``resume``: a subscriber whose connection is cut (no close frame) every 50-200 ms resumes
  with ``since`` on a random process; duplicates and gaps are counted over every offset;
* ``sessions``: producers whose connection is cut reconnect with ``?session=``; how many
  resumed;
* ``truncated``: replies a gateway sends with the client library of the installation under
  test, through a proxy that cuts every connection every 300 ms; a reply is truncated if its
  ``finish`` returned an ack but no ``message`` holds all of it;
* ``ready``: seconds until every relay is ready again after Redis is killed and restarted.

Topologies: ``memory`` (one process), ``redis1`` (one process on Redis), ``redis2`` (two
processes on one Redis) and ``workers2`` (``--workers 2`` on Redis). ``--relay-python`` and
``--relay-module`` run another installation's relay, to compare versions in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from tests.harness import Proxy, RedisServer, ServiceProcess

TOPOLOGIES = ("memory", "redis1", "redis2", "workers2")


@dataclass
class Cluster:
    """Relay processes (one URL each) and the redis-server they share, if any."""

    urls: list[str]
    relays: list[ServiceProcess]
    redis: RedisServer | None


@contextlib.asynccontextmanager
async def cluster(
    topology: str, python: str | None, module: str, *flags: str
) -> AsyncIterator[Cluster]:
    """Start the processes of ``topology`` and stop them on the way out."""
    redis = None
    if topology != "memory":
        redis = RedisServer(Path(tempfile.mkdtemp()))
        redis.start()
        flags = ("--broker", redis.url, *flags)
    count = 2 if topology == "redis2" else 1
    if topology == "workers2":
        flags = ("--workers", "2", *flags)
    base = ("--max-connections-per-ip", "100000", "--max-events-per-second", "1000000000")
    relays = [ServiceProcess(module, *base, *flags, python=python) for _ in range(count)]
    try:
        await asyncio.gather(*(relay.start() for relay in relays))
        yield Cluster([relay.url for relay in relays], relays, redis)
    finally:
        await asyncio.gather(*(relay.kill() for relay in relays))
        if redis is not None:
            redis.kill()


async def _frames(ws: ClientConnection, until: float) -> AsyncIterator[dict[str, Any]]:
    while (left := until - time.monotonic()) > 0:
        try:
            raw = await asyncio.wait_for(ws.recv(), left)
        except TimeoutError:
            return
        yield json.loads(raw)


async def _producer(url: str, query: str) -> ClientConnection:
    ws = await connect(f"{url}/produce?{query}", max_size=None, close_timeout=1)
    await ws.recv()  # the session frame
    return ws


# ------------------------------------------------------------------ joins


async def check_joins(c: Cluster, joiners: int, seed: int) -> int:
    """Wrong joins out of ``joiners``."""
    rng = random.Random(seed)
    channel = f"joins-{seed}"
    messages = {
        f"m{n}": [rng.choice(["é", "ab", "日本", " "]) for _ in range(150)] for n in range(3)
    }
    producer = await _producer(c.urls[0], f"channel={channel}")

    async def join(delay: float) -> bool:
        await asyncio.sleep(delay)
        url = rng.choice(c.urls)
        async with connect(
            f"{url}/subscribe?channel={channel}&deltas=1", max_size=None, close_timeout=1
        ) as ws:
            offset = None
            texts: dict[str, str] = {}
            done: set[str] = set()
            async for frame in _frames(ws, time.monotonic() + 20):
                kind = frame["type"]
                if kind == "subscribed":
                    offset = frame["offset"]
                elif kind == "snapshot":
                    texts[frame["id"]] = frame["text"]
                elif kind == "delta":
                    texts[frame["id"]] = texts.get(frame["id"], "") + frame["delta"]
                elif kind == "message":
                    if offset is None or frame["offset"] <= offset:
                        return False
                    if texts.get(frame["id"], "") != frame["text"]:
                        return False
                    done.add(frame["id"])
                # Offsets start at 1: a joiner at offset k is owed the other messages.
                if offset is not None and len(done) + offset >= len(messages):
                    return True
            return False  # a message it was owed never came

    async def stream() -> None:
        for step in range(150):
            for message_id, parts in messages.items():
                await producer.send(json.dumps({"id": message_id, "delta": parts[step]}))
            await asyncio.sleep(0.002)
        for message_id in messages:
            await producer.send(json.dumps({"id": message_id, "final": True}))

    streaming = asyncio.create_task(stream())
    results = await asyncio.gather(*(join(rng.uniform(0, 0.8)) for _ in range(joiners)))
    await streaming
    await producer.close()
    return results.count(False)


# ------------------------------------------------------------------ resume


async def check_resume(c: Cluster, offsets: int, seed: int) -> tuple[int, int]:
    """``(duplicates, gaps)`` over ``offsets`` messages seen by a subscriber cut again and again."""
    rng = random.Random(seed)
    channel = f"resume-{seed}"
    producer = await _producer(c.urls[0], f"channel={channel}")
    seen: list[int] = []
    position: tuple[int, str] | None = None
    finished = asyncio.Event()
    joined = asyncio.Event()

    async def publish() -> None:
        await joined.wait()
        for n in range(offsets):
            await producer.send(json.dumps({"id": f"r{n}", "delta": f"{n}", "final": True}))
            if n % 20 == 0:
                await asyncio.sleep(0.01)
        finished.set()

    async def subscribe() -> None:
        nonlocal position
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            url = rng.choice(c.urls)
            try:
                async with connect(f"{url}/subscribe", max_size=None, close_timeout=0.2) as ws:
                    request: dict[str, Any] = {"type": "subscribe", "channel": channel}
                    if position is not None:
                        request["since"] = {"offset": position[0], "epoch": position[1]}
                    await ws.send(json.dumps(request))
                    cut_at = time.monotonic() + rng.uniform(0.05, 0.2)
                    async for frame in _frames(ws, cut_at):
                        if frame["type"] == "subscribed" and position is None:
                            position = (frame["offset"], frame["epoch"])
                            joined.set()
                        elif frame["type"] == "message":
                            seen.append(frame["offset"])
                            position = (frame["offset"], frame["epoch"])
                    assert ws.transport is not None
                    ws.transport.abort()  # cut: no close frame
            except Exception:
                await asyncio.sleep(0.01)
            if finished.is_set() and len(set(seen)) >= offsets:
                return

    publisher = asyncio.create_task(publish())
    await asyncio.wait_for(subscribe(), 90)
    await publisher
    await producer.close()
    duplicates = len(seen) - len(set(seen))
    gaps = len(set(range(1, offsets + 1)) - set(seen))
    return duplicates, gaps


# ------------------------------------------------------------------ sessions, ready


async def check_session(url: str, other: str, n: int) -> str:
    """What went wrong when a producer cut mid-message on ``url`` resumed its session on
    ``other`` (another process, or the same port of ``--workers N``) to complete it, as the
    protocol says a gateway does: it sends again every event since its last ack (here,
    all of them, with their ``seq``). The message must be delivered once, whole. ""
    when nothing went wrong."""
    channel, message_id = f"sessions-{n}", f"s{n}"
    events = [
        {"id": message_id, "delta": "x", "seq": 1},
        {"id": message_id, "delta": "y", "seq": 2},
        {"id": message_id, "final": True, "seq": 3},
    ]
    async with connect(f"{other}/subscribe?channel={channel}", close_timeout=0.2) as subscriber:
        await subscriber.recv()  # subscribed
        async with connect(f"{url}/produce?channel={channel}", close_timeout=0.2) as first:
            hello = json.loads(await first.recv())
            await first.send(json.dumps(events[0]))
            await asyncio.sleep(0.05)
            assert first.transport is not None
            first.transport.abort()  # cut: no close frame, the session waits
        await asyncio.sleep(0.05)
        query = f"channel={channel}&session={hello['session']}"
        async with connect(f"{other}/produce?{query}", close_timeout=0.2) as second:
            again = json.loads(await second.recv())
            for event in events:  # everything since the last ack: the x may have landed
                await second.send(json.dumps(event))
            reply = json.loads(await asyncio.wait_for(second.recv(), 10))
        # The message, however late it comes, then a while for any second one.
        delivered: list[dict[str, Any]] = []
        until = time.monotonic() + 10
        async for frame in _frames(subscriber, until):
            if frame["type"] in ("message", "aborted"):
                delivered.append(frame)
                until = min(until, time.monotonic() + 0.3)
                break
        delivered += [
            frame
            async for frame in _frames(subscriber, until)
            if frame["type"] in ("message", "aborted")
        ]
    if again.get("resumed") is not True or reply.get("type") != "ack":
        return f"message {message_id}: resumed with {again}, then {reply}"
    texts = [(frame["type"], frame.get("text")) for frame in delivered]
    if texts != [("message", "xy")]:
        return f"message {message_id}: delivered as {texts}, not once as 'xy'"
    return ""


GATEWAY = """
import asyncio, sys
{module_import}

async def main():
    async with RelayProducer(sys.argv[1], channel=sys.argv[2], backoff=(0.05, 0.5)) as relay:
        async def reply(n):
            message_id = f"t{{n}}"
            for token in range(40):
                await relay.send(message_id, f"{{n}}.{{token}} ")
                await asyncio.sleep(0.03)
            try:
                await asyncio.wait_for(relay.finish(message_id), 30)
                print("acked", message_id, flush=True)
            except Exception as exc:
                print("failed", message_id, type(exc).__name__, flush=True)
        await asyncio.gather(*(reply(n) for n in range(int(sys.argv[3]))))

asyncio.run(main())
"""


async def check_truncation(
    c: Cluster, python: str | None, module: str, replies: int
) -> tuple[int, int]:
    """``(truncated, acked)``: acked replies out of ``replies`` that no ``message`` holds
    whole, and how many were acked."""
    channel = "truncation"
    expected = {f"t{n}": "".join(f"{n}.{token} " for token in range(40)) for n in range(replies)}
    texts: dict[str, list[str]] = {}
    async with (
        Proxy(int(c.urls[0].rsplit(":", 1)[1])) as proxy,
        connect(
            f"{c.urls[-1]}/subscribe?channel={channel}", max_size=None, close_timeout=1
        ) as subscriber,
    ):
        await subscriber.recv()
        code = GATEWAY.format(module_import=f"from {module}.client import RelayProducer")
        gateway = await asyncio.create_subprocess_exec(
            python or sys.executable, "-c", code, proxy.url, channel, str(replies),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip

        async def cut() -> None:
            while True:
                await asyncio.sleep(0.3)
                proxy.cut()

        async def collect() -> None:
            async for frame in _frames(subscriber, time.monotonic() + 60):
                if frame["type"] == "message":
                    texts.setdefault(frame["id"], []).append(frame["text"])

        cutter, collector = asyncio.create_task(cut()), asyncio.create_task(collect())
        out, _ = await asyncio.wait_for(gateway.communicate(), 90)
        cutter.cancel()
        acked = [line.split()[1] for line in out.decode().splitlines() if line.startswith("acked")]
        # Every acked reply is on its way: wait for them all (a reply truncated or lost
        # never comes, and is counted once the wait is over).
        until = time.monotonic() + 20
        while time.monotonic() < until and not collector.done():
            if all(expected[message_id] in texts.get(message_id, []) for message_id in acked):
                break
            await asyncio.sleep(0.05)
        collector.cancel()
    truncated = sum(expected[message_id] not in texts.get(message_id, []) for message_id in acked)
    return truncated, len(acked)


async def check_ready(c: Cluster) -> float:
    """Seconds from a Redis restart until every relay answers ``/readyz`` with 200."""
    assert c.redis is not None
    c.redis.kill()
    await asyncio.sleep(1.0)
    c.redis.start()
    started = time.monotonic()
    while time.monotonic() - started < 120:
        statuses = await asyncio.gather(
            *(relay.http_status("/readyz") for relay in c.relays), return_exceptions=True
        )
        if all(status == 200 for status in statuses):
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    return float("inf")


# ------------------------------------------------------------------ main


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every check on every topology asked for; the counts, by topology."""
    results: dict[str, Any] = {}
    for topology in args.topology:
        row: dict[str, Any] = {}
        async with cluster(topology, args.relay_python, args.relay_module) as c:
            row["wrong_joins"] = await check_joins(c, args.joiners, args.seed)
            row["duplicates"], row["gaps"] = await check_resume(c, args.offsets, args.seed)
            if topology != "memory":
                outcomes = [
                    await check_session(c.urls[0], c.urls[-1], n) for n in range(args.sessions)
                ]
                row["resumed_sessions"] = outcomes.count("")
                row["truncated_replies"], row["acked_replies"] = await check_truncation(
                    c, args.relay_python, args.relay_module, args.replies
                )
                row["ready_after_restart_s"] = round(await check_ready(c), 2)
        results[topology] = row
        print(f"{topology}: {json.dumps(row)}", flush=True)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks and print the counts."""
    parser = argparse.ArgumentParser(prog="python -m bench.exactness", description=__doc__)
    parser.add_argument("--topology", action="append", choices=TOPOLOGIES)
    parser.add_argument("--joiners", type=int, default=200)
    parser.add_argument("--offsets", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--replies", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--relay-python", help="the interpreter of the relay to check")
    parser.add_argument("--relay-module", default="token_relay", help="its module (-m)")
    parser.add_argument("--json", type=Path, help="write the counts as JSON")
    args = parser.parse_args(argv)
    args.topology = args.topology or list(TOPOLOGIES)
    results = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
