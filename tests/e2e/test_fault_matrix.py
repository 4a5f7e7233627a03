"""The fault matrix, played over real sockets: two relay processes on one real redis-server
behind a balancer, gateways streaming replies with ``RelayProducer`` through it, and one
reader of every kind following the channel through it at once:

* a WebSocket subscriber resuming by offset (``RelaySubscriber``),
* an SSE subscriber resuming with ``Last-Event-ID``,
* a Durable Streams reader of ``/v1/stream/__channel/C`` following it live by SSE, reading
  on from the last ``streamNextOffset`` of a ``control`` event,
* a Durable Streams reader following it by long-poll, reading on from ``Stream-Next-Offset``.

while a relay process is killed (SIGKILL) or stopped (SIGTERM, a rolling restart) mid-stream
and started again, each process in turn, several rounds. Each reader must end with every
completed message exactly once, with its exact text: never silent loss or duplication.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from token_relay.client import RelayProducer, RelaySubscriber
from token_relay.core.protocol import Aborted, MessageFrame, Subscribed

from ..harness import Balancer, RedisServer, ServiceProcess, SseReader, eventually, relay_process

GATEWAYS = 6
TOKENS = 25


@dataclass
class Seen:
    """What one reader got: terminal frames as ``(type, id, text)``, in order, and the
    signals that history was lost."""

    name: str
    frames: list[tuple[str, str, str]] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    reconnects: int = 0

    def ids(self) -> set[str]:
        return {frame[1] for frame in self.frames}


def _flags(redis: RedisServer) -> tuple[str, ...]:
    return (
        "--broker", redis.url, "--session-grace", "15", "--lease-seconds", "2",
        "--max-connections-per-ip", "100000", "--long-poll-timeout", "2",
    )  # fmt: skip


async def _ws_reader(url: str, channel: str, seen: Seen, ready: asyncio.Event) -> None:
    async with RelaySubscriber(url, [channel], deltas=False, backoff=(0.02, 0.3)) as feed:
        async for frame in feed:
            seen.reconnects = feed.reconnects
            if isinstance(frame, Subscribed):
                ready.set()
                if frame.recovered is False:
                    seen.lost.append(f"recovered:false epoch {frame.epoch}")
            elif isinstance(frame, MessageFrame):
                seen.frames.append(("message", frame.id, frame.text))
            elif isinstance(frame, Aborted):
                seen.frames.append(("aborted", frame.id, f"[{frame.reason}] {frame.text}"))


async def _sse_reader(port: int, channel: str, seen: Seen, ready: asyncio.Event) -> None:
    last: str | None = None
    while True:
        headers = [("Last-Event-ID", last)] if last else []
        try:
            async with SseReader(port, f"/sse?channel={channel}", headers) as stream:
                if stream.status != 200:
                    await asyncio.sleep(0.05)
                    continue
                while True:
                    event = await stream.next(30)
                    if event.event == "subscribed":
                        frame = event.json()
                        if frame.get("recovered") is False:
                            seen.lost.append(f"recovered:false epoch {frame['epoch']}")
                        ready.set()
                    elif event.event in ("message", "aborted"):
                        frame = event.json()
                        seen.frames.append((frame["type"], frame["id"], frame["text"]))
                    if event.id:
                        last = event.id
        except Exception:  # a cut, an answer not 200, a stream ended: read on
            seen.reconnects += 1
            await asyncio.sleep(0.05)


async def _stream_sse_reader(port: int, channel: str, seen: Seen, ready: asyncio.Event) -> None:
    offset = "-1"
    while True:
        path = f"/v1/stream/__channel/{channel}?offset={offset}&live=sse"
        try:
            async with SseReader(port, path) as stream:
                if stream.status == 410:
                    seen.lost.append(f"410 at {offset}")
                    offset = "-1"
                    continue
                if stream.status != 200:
                    await asyncio.sleep(0.05)
                    continue
                pending: list[dict[str, Any]] = []
                while True:
                    event = await stream.next(90)
                    if event.event == "data":
                        pending.extend(event.json())
                    elif event.event == "control":
                        # Items count once their control event says where to read on.
                        for frame in pending:
                            seen.frames.append((frame["type"], frame["id"], frame["text"]))
                        pending = []
                        offset = event.json()["streamNextOffset"]
                        ready.set()
        except Exception:  # a cut, an answer not 200, a stream ended: read on
            seen.reconnects += 1
            await asyncio.sleep(0.05)


async def _long_poll_reader(port: int, channel: str, seen: Seen, ready: asyncio.Event) -> None:
    offset = "-1"
    base = f"http://127.0.0.1:{port}/v1/stream/__channel/{channel}"
    async with httpx.AsyncClient(timeout=10) as http:
        while True:
            try:
                answer = await http.get(base, params={"offset": offset, "live": "long-poll"})
            except httpx.HTTPError:
                seen.reconnects += 1
                await asyncio.sleep(0.05)
                continue
            if answer.status_code == 410:
                seen.lost.append(f"410 at {offset}")
                offset = "-1"
                continue
            if answer.status_code not in (200, 204):
                await asyncio.sleep(0.05)
                continue
            if answer.status_code == 200:
                for frame in answer.json():
                    seen.frames.append((frame["type"], frame["id"], frame["text"]))
            offset = answer.headers["stream-next-offset"]
            ready.set()


@contextlib.asynccontextmanager
async def _cluster(redis: RedisServer) -> AsyncIterator[tuple[list[ServiceProcess], Balancer]]:
    relays = [relay_process(*_flags(redis)), relay_process(*_flags(redis))]
    await asyncio.gather(*(relay.start() for relay in relays))
    balancer = Balancer([relay.port for relay in relays])
    try:
        async with balancer:
            yield relays, balancer
    finally:
        await asyncio.gather(*(relay.stop() for relay in relays))


def _text(message_id: str) -> str:
    return "".join(f"{message_id}.{t} " for t in range(TOKENS))


async def _gateway(
    url: str, channel: str, number: int, until: list[float], acked: dict[str, float]
) -> None:
    """Replies one after the other until the time in ``until`` (set once the faults are
    done) has passed."""
    loop = asyncio.get_running_loop()
    async with RelayProducer(url, channel=channel, backoff=(0.02, 0.3)) as producer:
        reply = 0
        while not until or loop.time() < until[0]:
            message_id = f"g{number}-r{reply}"
            for token in _text(message_id).split(" ")[:-1]:
                await producer.send(message_id, token + " ")
                await asyncio.sleep(0.01)
            ack = await asyncio.wait_for(producer.finish(message_id), 60)
            assert ack.id == message_id
            acked[message_id] = loop.time()
            reply += 1


def _judge(seen: Seen, acked: dict[str, float]) -> list[str]:
    """What is wrong with what one reader got."""
    wrong = []
    counts: dict[str, int] = {}
    for kind, message_id, text in seen.frames:
        counts[message_id] = counts.get(message_id, 0) + 1
        if kind != "message":
            wrong.append(f"{seen.name}: {message_id} {kind} with {text!r}")
        elif text != _text(message_id) or message_id not in acked:
            wrong.append(f"{seen.name}: {message_id} text {text!r}")
    doubled = sorted(m for m, n in counts.items() if n > 1)
    if doubled:
        wrong.append(f"{seen.name}: delivered more than once: {doubled}")
    missing = sorted(set(acked) - set(counts))
    if missing:
        wrong.append(f"{seen.name}: missing with no signal: {missing} (lost: {seen.lost})")
    return wrong


Gateway = Callable[[int, list[float], dict[str, float], list[str]], Awaitable[None]]
"""``gateway(number, until, acked, problems)``: replies one after the other until the time
in ``until`` has passed, each acked reply's id in ``acked`` with when, and what the relay
answered that a gateway could not take in ``problems``."""


async def _readers(
    url: str, port: int, channel: str
) -> tuple[list[Seen], list[asyncio.Task[None]]]:
    """The four readers of :mod:`.test_fault_matrix`, each following ``channel``."""
    kinds: list[tuple[str, Any, Any]] = [
        ("websocket", _ws_reader, url),
        ("sse", _sse_reader, port),
        ("stream-sse", _stream_sse_reader, port),
        ("stream-long-poll", _long_poll_reader, port),
    ]
    seen, tasks = [], []
    for name, reader, where in kinds:
        seen.append(Seen(name))
        ready = asyncio.Event()
        tasks.append(asyncio.create_task(reader(where, channel, seen[-1], ready)))
        await asyncio.wait_for(ready.wait(), 15)
    return seen, tasks


async def _exactly_once(
    url: str, port: int, channel: str, gateway: Gateway, faults: Callable[[], Awaitable[int]],
    gateways: int = GATEWAYS,
) -> tuple[list[str], str]:  # fmt: skip
    """Readers follow ``channel`` while ``gateways`` gateways reply and ``faults()`` plays;
    what went wrong, and a summary."""
    loop = asyncio.get_running_loop()
    acked: dict[str, float] = {}
    until: list[float] = []
    problems: list[str] = []
    readers, tasks = await _readers(url, port, channel)
    replying = asyncio.gather(*(gateway(n, until, acked, problems) for n in range(gateways)))
    try:
        count = await faults()
        until.append(loop.time() + 0.5)
        await asyncio.wait_for(replying, 60)

        def all_read() -> bool:
            return all(set(acked) <= seen.ids() for seen in readers)

        with contextlib.suppress(AssertionError):
            await eventually(all_read, 20, interval=0.05, what="every reader caught up")
        await asyncio.sleep(0.5)  # anything more (a duplicate) would come now
    finally:
        until.append(0.0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if not replying.done():
            replying.cancel()
            await asyncio.gather(replying, return_exceptions=True)
    wrong = list(problems)
    for seen in readers:
        wrong += _judge(seen, acked)
    summary = f"{count} faults, {len(acked)} replies, " + ", ".join(
        f"{seen.name}: {len(seen.frames)} frames, {seen.reconnects} reconnects" for seen in readers
    )
    return wrong, summary


async def _restarts(
    redis: RedisServer, relays: list[ServiceProcess], balancer: Balancer, fault: str,
    stopped: list[ServiceProcess], rounds: int = 2,
) -> int:  # fmt: skip
    """Each process in turn killed or stopped mid-stream and started again, ``rounds``
    times; the balancer sends new connections to the processes running."""
    faults = 0
    for _ in range(rounds):
        for index in range(len(relays)):
            await asyncio.sleep(0.3 + 0.1 * (faults % 3))
            faults += 1
            if fault == "sigkill":
                await relays[index].kill()
            else:
                assert await relays[index].terminate(15) == 0, relays[index].log
            stopped.append(relays[index])
            relays[index] = relay_process(*_flags(redis))
            await relays[index].start()
            balancer.backends = [relay.port for relay in relays]
    return faults


def _report(wrong: list[str], summary: str, stopped: list[ServiceProcess]) -> None:
    print(summary)
    if wrong:  # the stopped processes' logs, to read beside what went wrong
        for relay in stopped:
            print("----", relay.pid, relay.log[-6000:])
    assert wrong == []


@pytest.mark.parametrize("fault", ["sigkill", "sigterm"])
async def test_every_reader_gets_every_reply_once_across_relay_processes_killed_or_restarted(
    fault: str, redis_server: RedisServer
) -> None:
    channel, stopped = f"matrix-{fault}", []
    async with _cluster(redis_server) as (relays, balancer):

        async def gateway(
            number: int, until: list[float], acked: dict[str, float], problems: list[str]
        ) -> None:
            await _gateway(balancer.url, channel, number, until, acked)

        async def faults() -> int:
            return await _restarts(redis_server, relays, balancer, fault, stopped)

        wrong, summary = await _exactly_once(balancer.url, balancer.port, channel, gateway, faults)
    _report(wrong, summary, stopped)
