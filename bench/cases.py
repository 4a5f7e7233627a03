"""The measured cases over real connections, and the processes they run against."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import socketio  # type: ignore[import-untyped]
from token_relay.testing import RedisServer, ServiceProcess, cpu_seconds, relay_process, rss_bytes
from websockets.asyncio.client import ClientConnection, connect

from . import wire
from .report import percentile
from .subscribers import SubscriberPool, raise_fd_limit
from .wire import BenchError, Message, RawProducer, all_or_first_failure, client_frame

RELAY_FLAGS = (
    *("--max-events-per-second", "1000000000"),  # one producer is saturated on purpose
    *("--max-connections-per-ip", "100000"),  # thousands of subscribers from 127.0.0.1
)
"""Flags every benchmarked relay gets; otherwise they run with their defaults."""
TIMEOUT_MARGIN = 30.0
"""Seconds a case may run beyond what its load should take before it is declared stuck."""
DELTA_GAP = 0.02
"""Seconds between a fan-out message's events: 50 tokens per second, a typical model."""
FANOUT_PAUSE = 0.05
"""Seconds between one message being everywhere and the next one starting."""
IN_FLIGHT_CHARS = 10_000


def relay(name: str, *args: str) -> ServiceProcess:
    """A relay process with :data:`RELAY_FLAGS` and ``args``."""
    return relay_process(*RELAY_FLAGS, *args, name=name)


def check_alive(*services: ServiceProcess) -> None:
    """Fail if a process has exited."""
    for service in services:
        if not service.alive:
            raise BenchError(f"{service.name} exited:\n{service.log}")


@contextlib.asynccontextmanager
async def started(*services: ServiceProcess, notable: list[str]) -> AsyncIterator[None]:
    """Start the services; stop them all on the way out, their warnings to ``notable``."""
    try:
        for outcome in await asyncio.gather(*(s.start() for s in services), return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise BenchError(str(outcome))
        yield
    finally:
        await asyncio.gather(*(s.terminate() for s in services), return_exceptions=True)
        notable.extend(f"{s.name}: {line}" for s in services for line in s.warnings)


@contextlib.asynccontextmanager
async def running_cluster(
    relay_args: Sequence[str], notable: list[str]
) -> AsyncIterator[dict[str, ServiceProcess]]:
    """redis-server, relays S, F, and A and B through Redis, and the peers, by name."""
    raise_fd_limit()  # inherited by every child: the fan-out relay holds 10,000 sockets
    with tempfile.TemporaryDirectory(prefix="token-relay-bench-") as directory:
        redis = RedisServer(Path(directory))
        try:
            try:
                redis.start()
            except RuntimeError as exc:
                raise BenchError(str(exc)) from None
            cluster = {
                "S": relay("S", *relay_args),
                "A": relay("A", "--broker", redis.url, *relay_args),
                "B": relay("B", "--broker", redis.url, *relay_args),
                "F": relay("F", *relay_args),
                "noop": ServiceProcess("bench.servers", "noop", name="no-op server"),
                "socketio": ServiceProcess("bench.servers", "socketio", name="socketio relay"),
            }
            async with started(*cluster.values(), notable=notable):
                yield cluster
        finally:
            redis.kill()


def short(frame: object) -> str:
    """``frame`` as JSON, cut to 300 characters."""
    return json.dumps(frame, ensure_ascii=False)[:300]


async def check_messages(
    ws: ClientConnection, channel: str, messages: Sequence[Message], arrivals: dict[str, float]
) -> None:
    """Read ``ws`` until every message has arrived once, in order, with exactly its text;
    file each arrival time (``time.perf_counter()``) in ``arrivals``."""
    expected = {message.id: message.text for message in messages}
    async for raw in ws:
        now, frame = time.perf_counter(), json.loads(raw)
        message_id, offset = frame.get("id"), frame.get("offset")
        if frame.get("type") != "message" or frame.get("channel") != channel:
            raise BenchError(f"subscriber got an unexpected frame: {short(frame)}")
        if message_id not in expected or message_id in arrivals:
            raise BenchError(f"subscriber got a message never sent or twice: {short(frame)}")
        if frame.get("text") != expected[message_id]:
            raise BenchError(f"message {message_id!r} arrived with the wrong text: {short(frame)}")
        if offset != len(arrivals) + 1:
            raise BenchError(f"{message_id!r} has offset {offset}, not {len(arrivals) + 1}")
        arrivals[message_id] = now
        if len(arrivals) == len(expected):
            return
    raise BenchError(f"subscriber closed with {len(arrivals)} of {len(expected)} messages")


def _spread(samples: Sequence[float], digits: int) -> dict[str, Any]:
    """The p50 and p99 of ``samples`` (seconds) and the samples themselves, in ms."""
    p50, p99 = percentile(samples, 50) * 1000, percentile(samples, 99) * 1000
    return {"p50_ms": p50, "p99_ms": p99, "samples_ms": [round(x * 1000, digits) for x in samples]}


def _record(events: int, frames: int, seconds: float, cpu: float) -> dict[str, Any]:
    record = {
        "events": events,
        "frames": frames,
        "seconds": seconds,
        "events_per_second": events / seconds,
        "frames_per_second": frames / seconds,
        "server_cpu_seconds": cpu,
    }
    if seconds >= 0.5:  # CPU time comes in 10 ms ticks: too coarse for shorter runs
        record["server_busy"] = cpu / seconds
    return record


def frame_texts(messages: Sequence[Message], batch: int | None = None) -> list[str]:
    """Every event as one frame each, or ``batch`` events per JSON array frame."""
    texts = [frame for message in messages for frame in message.frames]
    if batch is None:
        return texts
    return ["[" + ",".join(texts[at : at + batch]) + "]" for at in range(0, len(texts), batch)]


async def stream(
    producer_at: ServiceProcess,
    subscriber_at: ServiceProcess | None,
    channel: str,
    messages: Sequence[Message],
    *,
    batch: int | None = None,
    rate: float | None = None,
    copies: int = 1,
) -> dict[str, Any]:
    """One producer on ``producer_at`` to one subscriber on ``subscriber_at``: every frame
    at once in big writes (``batch`` events per array frame, if given), or ``rate`` messages
    per second with their events spread evenly. Without ``subscriber_at``, ``producer_at`` is
    the no-op server, fed the frames ``copies`` times over (to make a blink timeable) until it
    says ``done``. The record of :func:`_record`, and with ``rate``, ``latency``: from
    writing each final to its arrival."""
    texts = frame_texts(messages, batch)
    frames = [client_frame(text.encode()) for text in texts]
    data, events = b"".join(frames) * copies, sum(len(m.frames) for m in messages) * copies
    ends = itertools.accumulate(len(message.frames) for message in messages)
    finals = {end - 1: message.id for end, message in zip(ends, messages, strict=True)}
    arrivals: dict[str, float] = {}
    sent: dict[str, float] = {}

    async def send() -> None:
        if not rate:
            return await producer.write(data)
        for index, frame in enumerate(frames):
            # Behind schedule, still yield, so the readers timestamp arrivals promptly.
            await asyncio.sleep(
                max(start + index / (rate * len(frames) / len(messages)) - time.perf_counter(), 0)
            )
            if index in finals:
                sent[finals[index]] = time.perf_counter()
            producer.writer.write(frame)

    async with contextlib.AsyncExitStack() as stack:
        if subscriber_at is None:
            target, count = f"/?frames={len(frames) * copies}", len(frames) * copies
            producer = await stack.enter_async_context(RawProducer(producer_at.port, "", target))
            waits = [producer.acked(count)]
        else:
            url = f"{subscriber_at.url}/subscribe?channel={quote(channel, safe='')}"
            ws = await stack.enter_async_context(connect(url, compression=None))
            confirmation = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if confirmation.get("type") != "subscribed" or confirmation.get("channel") != channel:
                raise BenchError(f"subscribing got {short(confirmation)}")
            producer = await stack.enter_async_context(RawProducer(producer_at.port, channel))
            waits = [check_messages(ws, channel, messages, arrivals), producer.acked(len(messages))]
        try:
            cpu, start = cpu_seconds(producer_at.pid), time.perf_counter()
            async with asyncio.timeout(TIMEOUT_MARGIN + len(messages) * copies / (rate or 500)):
                await all_or_first_failure(send(), *waits)
            cpu = cpu_seconds(producer_at.pid) - cpu
        except TimeoutError:
            raise BenchError(
                f"{producer_at.name} timed out with {len(arrivals)} of {len(messages)} messages "
                f"delivered and {producer.acks} acks"
            ) from None
    end = max(arrivals.values()) if subscriber_at else producer.last_ack
    record = _record(events, len(texts) * copies, end - start, cpu)
    if rate:
        samples = [arrivals[message_id] - at for message_id, at in sent.items()]
        record["latency"] = {**_spread(samples, 4), "max_ms": max(samples) * 1000}
    return record


async def socketio_ingest(
    server: ServiceProcess, channel: str, messages: Sequence[Message]
) -> dict[str, Any]:
    """The same events through the python-socketio relay, with its own client: a producer
    emitting one ``event`` per delta event, yielding every 100 emits, and a subscriber in the
    channel's room; the record of :func:`_record`."""
    url, events = f"http://127.0.0.1:{server.port}", [e for m in messages for e in m.events]
    received: list[dict[str, Any]] = []
    acks, last, complete = 0, 0.0, asyncio.Event()
    # No reconnecting behind the benchmark's back, and Ctrl-C stays the harness's business
    # (by default the client takes over SIGINT and stops the event loop).
    subscriber = socketio.AsyncClient(reconnection=False, handle_sigint=False)
    producer = socketio.AsyncClient(reconnection=False, handle_sigint=False)

    @subscriber.on("message")  # type: ignore[untyped-decorator]
    @producer.on("ack")  # type: ignore[untyped-decorator]
    def on_frame(frame: dict[str, Any]) -> None:
        nonlocal acks, last
        if "text" in frame:
            received.append(frame)
            last = time.perf_counter()
        else:
            acks += 1
        if len(received) >= len(messages) and acks >= len(messages):
            complete.set()

    try:
        await subscriber.connect(url, transports=["websocket"])
        reply = await subscriber.call("subscribe", channel, timeout=10)
        if reply != {"type": "subscribed", "channel": channel}:
            raise BenchError(f"socketio subscribe answered {reply!r}")
        await producer.connect(url, transports=["websocket"], auth={"channel": channel})
        cpu, start = cpu_seconds(server.pid), time.perf_counter()
        async with asyncio.timeout(TIMEOUT_MARGIN + len(events) / 2_000):
            for index, event in enumerate(events, 1):
                await producer.emit("event", event)
                if index % 100 == 0:
                    await asyncio.sleep(0)  # emit() only queues: let the writer task run
            await complete.wait()
        cpu = cpu_seconds(server.pid) - cpu
    except TimeoutError:
        raise BenchError(f"socketio timed out with {len(received)} of {len(messages)}") from None
    except socketio.exceptions.SocketIOError as exc:
        raise BenchError(f"socketio client: {exc}") from None
    finally:
        await asyncio.gather(producer.disconnect(), subscriber.disconnect(), return_exceptions=True)
    got = sorted((frame.get("channel"), frame.get("id"), frame.get("text")) for frame in received)
    if got != sorted((channel, message.id, message.text) for message in messages):
        raise BenchError("the socketio relay lost, repeated or changed a message")
    return _record(len(events), len(events), last - start, cpu)


async def measure_fanout(
    relay: ServiceProcess, pool: SubscriberPool, channel: str, messages: Sequence[Message]
) -> dict[str, Any]:
    """Send ``messages`` one by one, deltas :data:`DELTA_GAP` apart like a model, to
    ``pool``'s channel; per message, the ms from writing the final to the last
    (``samples_ms``) and first (``first_arrival_ms``) arrival, and the relay's and the
    clients' CPU time over that span."""
    samples, first, relay_cpu, client_cpu = [], [], [], []
    async with RawProducer(relay.port, channel) as producer:
        for number, message in enumerate(messages, 1):
            frames = [client_frame(text.encode()) for text in message.frames]
            for frame in frames[:-1]:
                producer.writer.write(frame)
                await asyncio.sleep(DELTA_GAP)
            cpu, clients = cpu_seconds(relay.pid), sum(map(cpu_seconds, pool.pids))
            sent = time.time()
            producer.writer.write(frames[-1])
            earliest, latest = await pool.delivered(message.id, 60)
            relay_cpu.append(cpu_seconds(relay.pid) - cpu)
            client_cpu.append(sum(map(cpu_seconds, pool.pids)) - clients)
            await asyncio.wait_for(producer.acked(number), 60)
            samples.append(latest - sent)
            first.append(earliest - sent)
            await asyncio.sleep(FANOUT_PAUSE)
    return {
        **_spread(samples, 3),
        "first_arrival_ms": [round(x * 1000, 3) for x in first],
        "relay_cpu_ms": [round(x * 1000, 1) for x in relay_cpu],
        "client_cpu_ms": [round(x * 1000, 1) for x in client_cpu],
        "relay_busy": sum(relay_cpu) / sum(samples),
        "clients_busy": sum(client_cpu) / sum(samples),
    }


async def settled_rss(process: ServiceProcess) -> int:
    """The process's RSS once two reads 100 ms apart agree within 16 KiB (or after 3 s)."""
    deadline, previous = time.monotonic() + 3, rss_bytes(process.pid)
    while True:
        await asyncio.sleep(0.1)
        current = rss_bytes(process.pid)
        if abs(current - previous) <= 16 * 1024 or time.monotonic() > deadline:
            return current
        previous = current


async def idle_subscriber_bytes(
    count: int, notable: list[str], relay_args: Sequence[str] = (), processes: int = 2
) -> dict[str, int]:
    """The RSS of a fresh relay with 100 subscribers (``before``), then ``count`` more."""
    server = relay("M1", *relay_args)
    async with (
        started(server, notable=notable),
        SubscriberPool.running(server.port, "memory-warm", 100, 1),
    ):
        before = await settled_rss(server)
        async with SubscriberPool.running(server.port, "memory-idle", count, processes):
            after = await settled_rss(server)
            check_alive(server)
    return {"count": count, "before": before, "after": after}


async def in_flight_bytes(
    count: int, notable: list[str], relay_args: Sequence[str] = ()
) -> dict[str, int]:
    """The RSS of a fresh relay with a fifth as many (at least ten) unfinished 10,000-char
    messages (``before``), then ``count`` more; each batch ends with the final of one more
    message, acked once the relay has applied everything before it."""
    deltas, warm = IN_FLIGHT_CHARS // 4, max(10, count // 5)
    messages = wire.build_messages(warm + count + 2, deltas, prefix="memory-")
    server = relay("M2", "--max-streaming-per-producer", str(warm + count + 10), *relay_args)

    def unfinished(batch: Sequence[Message], marker: Message) -> bytes:
        return wire.client_frames([*(f for m in batch for f in m.frames[:-1]), marker.frames[-1]])

    async with (
        started(server, notable=notable),
        RawProducer(server.port, "memory-in-flight") as producer,
    ):
        await producer.write(unfinished(messages[:warm], messages[-2]))
        await asyncio.wait_for(producer.acked(1), 60 + warm * deltas / 10_000)
        before = await settled_rss(server)
        await producer.write(unfinished(messages[warm:-2], messages[-1]))
        await asyncio.wait_for(producer.acked(2), 60 + count * deltas / 10_000)
        after = await settled_rss(server)
        check_alive(server)
    return {"count": count, "before": before, "after": after}
