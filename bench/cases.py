"""The measured cases, and the processes they run against. The assembler case runs here:
``TokenAssembler.apply()``, the same rules with ``text += delta``, and the floor, a bare loop
appending to a dict of lists, over the same events; the rest go over real connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import math
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from token_relay import TokenAssembler
from websockets.asyncio.client import ClientConnection, connect

from tests.harness import RedisServer, ServiceProcess, cpu_seconds, relay_process, rss_bytes

from . import wire
from .subscribers import SubscriberPool, raise_fd_limit
from .wire import BenchError, Message, RawProducer, all_or_first_failure, client_frame

# Every relay runs with its defaults but for these: one producer is saturated on purpose,
# thousands of subscribers come from 127.0.0.1, and the NDJSON case posts all of its
# messages (3.2 MB for 10,000) in one chunked body.
COMPARE_FLAGS = (
    *("--max-events-per-second", "1000000000", "--max-connections-per-ip", "100000"),
    *("--max-handshakes-per-ip", "100000", "--max-body-bytes", "67108864"),
)
"""The limits lifted on a relay from ``--compare-python`` (an earlier version)."""
RELAY_FLAGS = COMPARE_FLAGS
"""The same limits, lifted on every relay of this version: the load comes from one address."""
TIMEOUT_MARGIN = 30.0  # seconds beyond what a case's load should take: it is stuck
DELTA_GAP = 0.02  # seconds between a fan-out message's events: 50 tokens/s, a typical model
FANOUT_PAUSE = 0.05  # seconds between one message being everywhere and the next one
IN_FLIGHT_CHARS = 10_000
ROUTES = {
    "single": ("single instance (S->S)", "S", "S"),
    "redis-same": ("same instance via Redis (A->A)", "A", "A"),
    "redis-cross": ("cross-instance via Redis (A->B)", "A", "B"),
}
"""The paths of the Redis case, baseline first: label, producer's relay, subscriber's relay."""


def tree_cpu_seconds(pid: int) -> float:
    """The CPU time of a process and of its live children (a relay's ``--workers``)."""
    total = cpu_seconds(pid)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[1]) == pid:
                total += cpu_seconds(int(stat.parent.name))
    return total


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, interpolating between closest ranks."""
    if not values:
        return math.nan
    ordered, rank = sorted(values), (len(values) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class NaiveAssembler:
    """The seed rules with ``str +=``: each delta copies the message's text so far."""

    __slots__ = ("_completed", "_texts")

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}
        self._completed: dict[str, str] = {}

    def apply(self, event: Mapping[str, Any]) -> str | None:
        """Like :meth:`token_relay.TokenAssembler.apply`."""
        message_id = event["id"]
        completed = self._completed.get(message_id)
        if completed is not None:
            return completed if event.get("final") else None
        text = self._texts.get(message_id, "")
        delta = event.get("delta")
        if delta is not None:
            text += delta
        if event.get("final"):
            self._texts.pop(message_id, None)
            self._completed[message_id] = text
            return text
        self._texts[message_id] = text
        return None


def _through(apply: Callable[[Mapping[str, Any]], str | None], events: Sequence[Any]) -> list[str]:
    texts: list[str] = []
    keep = texts.append
    for event in events:
        text = apply(event)
        if text is not None:
            keep(text)
    return texts


def floor_run(events: Sequence[dict[str, Any]]) -> list[str]:
    """The floor: a dict of lists, appended to inline, joined at each final."""
    texts: list[str] = []
    keep = texts.append
    streaming: dict[str, list[str]] = {}
    for event in events:
        message_id = event["id"]
        parts = streaming.get(message_id)
        if parts is None:
            parts = streaming[message_id] = []
        delta = event.get("delta")
        if delta is not None:
            parts.append(delta)
        if event.get("final"):
            keep("".join(streaming.pop(message_id)))
    return texts


ASSEMBLERS: dict[str, tuple[str, Callable[[Sequence[dict[str, Any]]], list[str]]]] = {
    "token": ("TokenAssembler.apply()", lambda events: _through(TokenAssembler().apply, events)),
    "naive": ("naive str += assembler", lambda events: _through(NaiveAssembler().apply, events)),
    "floor": ("dict + list append loop (floor)", floor_run),
}
"""Key: label, and a function that runs a fresh assembler over the events."""


def run_assembler(key: str, messages: Sequence[Message]) -> tuple[int, float]:
    """Time one assembler over every event of ``messages``, check every completed text;
    return the events and the seconds."""
    events = [event for message in messages for event in message.events]
    gc.collect()
    start = time.perf_counter()
    texts = ASSEMBLERS[key][1](events)
    seconds = time.perf_counter() - start
    if texts != [message.text for message in messages]:
        raise BenchError(f"assembler {key!r} got a message wrong or missing")
    return len(events), seconds


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
    relay_args: Sequence[str], notable: list[str], compare: str = ""
) -> AsyncIterator[dict[str, ServiceProcess]]:
    """redis-server, relays S, F, A and B through Redis, W (``--workers 2`` on Redis), the
    peers (the Node ws relay installed beforehand) and the ``os.write`` floor, by name;
    with ``compare`` (another installation's python), its relays S0 and F0 too."""
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
                "pyproduce": ServiceProcess("bench.producefloor", name="produce floor"),
                "floor": ServiceProcess("bench.floor", name="os.write floor"),
                "wsrelay": ServiceProcess("bench.wsrelay", name="Node ws relay"),
                "W": relay("W", "--broker", redis.url, "--workers", "2", *relay_args),
            }
            for name in ("S0", "F0") if compare else ():
                flags = (*COMPARE_FLAGS, *relay_args)
                cluster[name] = ServiceProcess("token_relay", *flags, name=name, python=compare)
            async with started(*cluster.values(), notable=notable):
                yield cluster
        finally:
            redis.kill()


async def check_messages(
    ws: ClientConnection, channel: str, messages: Sequence[Message], arrivals: dict[str, float]
) -> None:
    """Read ``ws`` until every message has arrived once, in order, with exactly its text;
    file each arrival time (``time.perf_counter()``) in ``arrivals``."""
    expected = {message.id: message.text for message in messages}
    async for raw in ws:
        now, frame = time.perf_counter(), json.loads(raw)
        message_id, offset = frame.get("id"), frame.get("offset")
        got = (frame.get("type"), frame.get("channel"), frame.get("text"), message_id in arrivals)
        if got != ("message", channel, expected.get(message_id), False):
            raise BenchError(f"a wrong, unsent or repeated message: {str(frame)[:300]}")
        if offset != len(arrivals) + 1:
            raise BenchError(f"{message_id!r} has offset {offset}, not {len(arrivals) + 1}")
        arrivals[message_id] = now
        if len(arrivals) == len(expected):
            return
    raise BenchError(f"subscriber closed with {len(arrivals)} of {len(expected)} messages")


def _spread(samples: Sequence[float], digits: int) -> dict[str, Any]:
    """The p50 and p99 of ``samples`` (seconds) and the samples themselves, in ms."""
    p50, p99 = percentile(samples, 50) * 1000, percentile(samples, 99) * 1000
    return {"p50_ms": p50, "p99_ms": p99, "samples_ms": _ms(samples, digits)}


def _ms(seconds: Sequence[float], digits: int) -> list[float]:
    return [round(value * 1000, digits) for value in seconds]


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
    """One producer on ``producer_at`` to one subscriber on ``subscriber_at``, or to the no-op
    server (``subscriber_at`` None): all frames at once in big writes, ``copies`` times over, or
    ``rate`` messages per second; the record, with ``rate`` also from each final to arrival."""
    texts = [frame for message in messages for frame in message.frames]
    if batch:
        texts = ["[" + ",".join(texts[at : at + batch]) + "]" for at in range(0, len(texts), batch)]
    frames = [client_frame(text.encode()) for text in texts]
    data, events = b"".join(frames) * copies, sum(len(m.frames) for m in messages) * copies
    ends = itertools.accumulate(len(message.frames) for message in messages)
    finals = {end - 1: message.id for end, message in zip(ends, messages, strict=True)}
    arrivals: dict[str, float] = {}
    sent: dict[str, float] = {}
    interval = len(messages) / (rate * len(frames)) if rate else 0.0

    async def send() -> None:
        if not rate:
            return await producer.write(data)
        for index, frame in enumerate(frames):
            # Behind schedule, still yield, so the readers timestamp arrivals promptly.
            await asyncio.sleep(max(start + index * interval - time.perf_counter(), 0))
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
                raise BenchError(f"subscribing got {confirmation}")
            producer = await stack.enter_async_context(RawProducer(producer_at.port, channel))
            waits = [check_messages(ws, channel, messages, arrivals), producer.acked(len(messages))]
        try:
            cpu, start = cpu_seconds(producer_at.pid), time.perf_counter()
            async with asyncio.timeout(TIMEOUT_MARGIN + len(messages) * copies / (rate or 500)):
                await all_or_first_failure(send(), *waits)
            cpu = cpu_seconds(producer_at.pid) - cpu
        except TimeoutError:
            got = f"{len(arrivals)} of {len(messages)} messages and {producer.acks} acks"
            raise BenchError(f"{producer_at.name} timed out with {got}") from None
    end = max(arrivals.values()) if subscriber_at else producer.last_ack
    record = _record(events, len(texts) * copies, end - start, cpu)
    if rate:
        samples = [arrivals[message_id] - at for message_id, at in sent.items()]
        record["latency"] = {**_spread(samples, 4), "max_ms": max(samples) * 1000}
    return record


async def http_ingest(
    relay: ServiceProcess, channel: str, messages: Sequence[Message]
) -> dict[str, Any]:
    """The same events as NDJSON lines in one chunked ``POST /produce``, written at once, to
    one WebSocket subscriber on the same relay; the record of :func:`_record`, timed from the
    request's first byte to the subscriber holding the last message."""
    lines = b"".join(f"{frame}\n".encode() for m in messages for frame in m.frames)
    events = sum(len(m.frames) for m in messages)
    size = wire.CHUNK_BYTES
    body = b"".join(
        b"%x\r\n%b\r\n" % (len(part), part)
        for part in (lines[at : at + size] for at in range(0, len(lines), size))
    )
    head = (
        f"POST /produce?channel={quote(channel, safe='')} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    arrivals: dict[str, float] = {}
    url = f"{relay.url}/subscribe?channel={quote(channel, safe='')}"
    async with connect(url, compression=None) as ws:
        confirmation = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if confirmation.get("type") != "subscribed":
            raise BenchError(f"subscribing got {confirmation}")
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)

        async def post() -> None:
            writer.write(head + body + b"0\r\n\r\n")
            status = await reader.readuntil(b"\r\n\r\n")
            length = int(status.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            answer = json.loads(await reader.readexactly(length))
            if not status.startswith(b"HTTP/1.1 200") or answer["errors"]:
                raise BenchError(f"the NDJSON post was answered {status[:40]!r} {answer['errors']}")
            if len(answer["acks"]) != len(messages):
                raise BenchError(f"{len(answer['acks'])} acks for {len(messages)} messages")

        try:
            cpu, start = cpu_seconds(relay.pid), time.perf_counter()
            async with asyncio.timeout(TIMEOUT_MARGIN + len(messages) / 500):
                await all_or_first_failure(post(), check_messages(ws, channel, messages, arrivals))
            cpu = cpu_seconds(relay.pid) - cpu
        except TimeoutError:
            raise BenchError(f"NDJSON ingest timed out with {len(arrivals)} messages") from None
        finally:
            writer.close()
    return _record(events, events, max(arrivals.values()) - start, cpu)


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
    # (by default the client takes over SIGINT and stops the event loop). socketio is the
    # bench extra's: imported here, so the tests of the other cases run without it.
    import socketio  # type: ignore[import-untyped]

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
    """Send ``messages`` one by one, deltas :data:`DELTA_GAP` apart like a model; per
    message, from writing the final to its last and first arrival, and the CPU time spent."""
    samples, first, relay_cpu, client_cpu = [], [], [], []
    async with RawProducer(relay.port, channel) as producer:
        for number, message in enumerate(messages, 1):
            frames = [client_frame(text.encode()) for text in message.frames]
            for frame in frames[:-1]:
                producer.writer.write(frame)
                await asyncio.sleep(DELTA_GAP)
            cpu, clients = tree_cpu_seconds(relay.pid), sum(map(cpu_seconds, pool.pids))
            sent = time.time()
            producer.writer.write(frames[-1])
            earliest, latest = await pool.delivered(message.id, 60)
            relay_cpu.append(tree_cpu_seconds(relay.pid) - cpu)
            client_cpu.append(sum(map(cpu_seconds, pool.pids)) - clients)
            await asyncio.wait_for(producer.acked(number), 60)
            samples.append(latest - sent)
            first.append(earliest - sent)
            await asyncio.sleep(FANOUT_PAUSE)
    record = {**_spread(samples, 3), "first_arrival_ms": _ms(first, 3)}
    record |= {"relay_cpu_ms": _ms(relay_cpu, 1), "client_cpu_ms": _ms(client_cpu, 1)}
    return record | {
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


async def memory(
    kind: str, count: int, notable: list[str], relay_args: Sequence[str]
) -> dict[str, int]:
    """A fresh relay's RSS after a warm-up step and after ``count`` more idle subscribers
    (``idle`` on WebSockets, ``idle_sse`` on SSE streams) or unfinished 10,000-char messages
    (``in_flight``), the last one acked."""
    deltas, warm = IN_FLIGHT_CHARS // 4, max(10, count // 5)
    limit = ("--max-streaming-per-producer", str(warm + count + 10))
    idle = kind.startswith("idle")
    server = relay("M1" if idle else "M2", *limit * (not idle), *relay_args)

    def unfinished(batch: Sequence[Message], marker: Message) -> bytes:
        texts = [*(f for m in batch for f in m.frames[:-1]), marker.frames[-1]]
        return b"".join(client_frame(text.encode()) for text in texts)

    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(started(server, notable=notable))
        if idle:
            sse = int(kind == "idle_sse")
            await stack.enter_async_context(
                SubscriberPool.running(server.port, "memory-warm", 100, 1, sse=sse)
            )
            before = await settled_rss(server)
            await stack.enter_async_context(
                SubscriberPool.running(server.port, "memory-idle", count, 2, sse=sse)
            )
        else:
            messages = wire.build_messages(warm + count + 2, deltas, prefix="memory-")
            producer = await stack.enter_async_context(RawProducer(server.port, "memory-in-flight"))
            await producer.write(unfinished(messages[:warm], messages[-2]))
            await asyncio.wait_for(producer.acked(1), 60 + warm * deltas / 10_000)
            before = await settled_rss(server)
            await producer.write(unfinished(messages[warm:-2], messages[-1]))
            await asyncio.wait_for(producer.acked(2), 60 + count * deltas / 10_000)
        after = await settled_rss(server)
        check_alive(server)
    return {"count": count, "before": before, "after": after}
