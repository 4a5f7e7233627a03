"""``python -m bench.inprocess``: the relay's CPU per event and per socket, without sockets.

A relay runs in this process with its connections on in-memory transports: the bytes a
socket would read are handed to the connection as the event loop would hand them, and what
it writes is counted, not sent. No system call, no load generator and no other process
shares the measurement, so the figures move little from run to run, and they say what the
relay's own Python costs:

* ``ingest``: CPU per producer event, one producer to one subscriber, each event in its own
  frame, then 100 to an array frame, then as NDJSON lines in one chunked ``POST
  /produce`` (its answer checked); in memory, and through a private ``redis-server`` (the
  relay's side only, a frame each). Messages of 10 deltas and a final; those of 1 delta
  and of 100, solved for the two unknowns, split it into what a plain delta costs and what
  a message's own work costs (its open and its final: claim, completion, history,
  delivery, ack).
* ``framing``: the part of ingest spent reading frames and handing them over, with the
  events left unapplied; and the part spent decoding them too.
* ``fan-out``: CPU per subscriber for one completed message to 10,000 subscribers.

Each figure is the lowest of ``--repeat`` passes (the least disturbed). A pass in which the
garbage collector scans every object it tracks is among the slowest, so one more row puts
the collector's own time over every pass of batched ingest, per event, and a note gives its
share of the CPU and its longest pause. The relay starts as ``python -m token_relay``
starts it (see :func:`as_the_cli_starts`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from token_relay.core.settings import Settings
from token_relay.edge.producers import ProducerEndpoint
from token_relay.edge.relay import Relay
from token_relay.edge.server import HttpConnection, HttpServer
from token_relay.edge.websocket import WebSocket

from tests.harness import RedisServer

from .wire import build_messages, client_frame, upgrade_request

READ = 256 * 1024
"""Bytes handed over per read, as asyncio reads a busy socket."""
APPLY = ProducerEndpoint._frame
_PASSES = itertools.count()
"""Numbers the ingest passes, whose messages' ids must not repeat on one relay."""


class MemoryTransport:
    """A transport that counts what is written and remembers whether reading is paused."""

    def __init__(self) -> None:
        self.written = 0
        self.paused = False
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def writelines(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.write(chunk)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_reading(self) -> bool:
        return not self.paused

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


def connect(server: HttpServer, target: str) -> tuple[HttpConnection, MemoryTransport]:
    """A connection upgraded to a WebSocket at ``target``."""
    connection, transport = HttpConnection(server), MemoryTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.data_received(upgrade_request(1, target)[1])
    return connection, transport


async def settle(done: Callable[[], bool], quiet: MemoryTransport | None = None) -> None:
    """Let the loop run until ``done()``; with ``quiet``, also until its output stops
    growing for 50 ms (replies from Redis)."""
    while not done():  # noqa: ASYNC110 - a pass of the loop at a time, as the relay's own
        await asyncio.sleep(0)
    for _ in range(50):
        await asyncio.sleep(0)
    if quiet is not None:
        previous = -1
        while quiet.written != previous:
            previous = quiet.written
            await asyncio.sleep(0.05)


def as_the_cli_starts(relay: Relay) -> Relay:
    """``relay``, after what ``python -m token_relay`` does before its relay starts, where
    the installation measured does it (``--compare-python``'s may be older): the objects of
    its start frozen out of the garbage collector's scans."""
    try:
        from token_relay.edge.workers import freeze_start
    except ImportError:
        return relay
    freeze_start()
    return relay


def settings(broker: str = "memory://") -> Settings:
    """A relay's settings with every per-client limit lifted: the load comes from one place."""
    big = 10**6
    return Settings(
        port=0,
        broker=broker,
        max_events_per_second=big * 1000,
        max_connections_per_ip=big,
        max_handshakes_per_ip=big,
        max_body_bytes=64 * 2**20,  # as bench.cases runs the relay: NDJSON posts of 4 MiB
    )


async def feed(
    producer: HttpConnection,
    transport: MemoryTransport,
    reads: list[bytes],
    quiet: MemoryTransport | None = None,
) -> None:
    """Hand the producer's socket its reads as the loop would, each once the socket is read
    again, and wait until every frame is handled (with ``quiet``, its output settled too)."""
    for read in reads:
        await settle(lambda: not transport.paused)
        producer.data_received(read)
    ws = producer.ws
    assert isinstance(ws, WebSocket)
    await settle(lambda: not transport.paused and not ws._messages, quiet)


def load(
    messages: int, batch: int, prefix: str = "m", deltas: int = 10, interleave: int = 1
) -> tuple[int, list[str], list[bytes]]:
    """``messages`` messages of ``deltas`` deltas and a final, their ids starting with
    ``prefix``, in frames of ``batch`` events: how many events, the frames' texts, and their
    bytes as the socket's reads would bring them. With ``interleave``, the messages go in
    groups of that many, streamed together: each group's first events, then their second,
    and so on (a gateway streaming several replies at once)."""
    built = build_messages(messages, deltas, prefix)
    texts = [
        frame
        for at in range(0, len(built), interleave)
        for step in zip(*(message.frames for message in built[at : at + interleave]), strict=True)
        for frame in step
    ]
    events = len(texts)
    if batch > 1:
        texts = ["[" + ",".join(texts[at : at + batch]) + "]" for at in range(0, len(texts), batch)]
    data = b"".join(client_frame(text.encode()) for text in texts)
    return events, texts, [data[at : at + READ] for at in range(0, len(data), READ)]


async def ingest(
    relay: Relay, batch: int, repeat: int, redis: bool = False, deltas: int = 10
) -> float:
    """Nanoseconds of CPU per event, the lowest of ``repeat`` passes of 10,000 messages of
    ``deltas`` deltas and a final (1,000 messages of 100 deltas or more)."""
    assert relay.server is not None
    server, handed = relay.server, relay.metrics.frames_in_producer
    subscriber, seen = connect(server, "/subscribe?channel=c")
    passes = []
    for n in range(repeat + 1):  # the first pass warms up
        # Ids of its own: a producer's ids stay held for --id-hold once completed.
        count = 10_000 if deltas < 100 else 1_000
        events, texts, reads = load(count, batch, f"m{next(_PASSES)}-", deltas)
        producer, transport = connect(server, f"/produce?channel=c&n={n}")
        await settle(lambda: True)
        before, frames, start = seen.written, handed.value, time.process_time()
        await feed(producer, transport, reads, seen if redis else None)
        spent = time.process_time() - start
        if handed.value - frames != len(texts):
            raise SystemExit(f"{handed.value - frames} of {len(texts)} frames were handed over")
        if ProducerEndpoint._frame is APPLY and seen.written == before:
            raise SystemExit("the subscriber got nothing: the relay did not apply the events")
        producer.connection_lost(None)
        if n:
            passes.append(spent / events * 1e9)
    subscriber.connection_lost(None)
    return min(passes)


class KeptTransport(MemoryTransport):
    """A :class:`MemoryTransport` that keeps what is written (an HTTP answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()

    def write(self, data: bytes) -> None:
        super().write(data)
        self.out += data


def chunked_post(target: str, lines: bytes) -> bytes:
    """A chunked ``POST`` of NDJSON ``lines`` to ``target``, in chunks of :data:`READ`."""
    head = (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    parts = (lines[at : at + READ] for at in range(0, len(lines), READ))
    return head + b"".join(b"%x\r\n%b\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


def answered(out: bytearray) -> bool:
    """Whether ``out`` holds a whole HTTP answer framed by ``Content-Length``."""
    end = out.find(b"\r\n\r\n")
    if end < 0:
        return False
    length = int(out[:end].lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return len(out) >= end + 4 + length


def ndjson_post(texts: list[str]) -> bytes:
    """``texts`` as NDJSON lines in one chunked ``POST /produce?channel=c``."""
    return chunked_post("/produce?channel=c", "".join(t + "\n" for t in texts).encode())


async def post_lines(server: HttpServer, data: bytes) -> bytes:
    """Hand ``server`` a request (:func:`ndjson_post`) in reads of :data:`READ` bytes, each
    once the socket is read again, as :func:`bench.cases.http_ingest` posts it; the whole
    answer, once it is written."""
    connection, transport = HttpConnection(server), KeptTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    for at in range(0, len(data), READ):
        await settle(lambda: not transport.paused)
        connection.data_received(data[at : at + READ])
    await settle(lambda: answered(transport.out))
    connection.connection_lost(None)
    return bytes(transport.out)


def check_answer(answer: bytes, messages: int) -> None:
    """Exit unless ``answer`` is a 200 with an ack for each of ``messages`` and no error."""
    acked = answer.count(b'"type":"ack"')
    if not answer.startswith(b"HTTP/1.1 200") or acked != messages or b'"errors":[]' not in answer:
        raise SystemExit(f"the NDJSON post was answered {answer[:200]!r} ({acked} acks)")


async def ndjson(relay: Relay, repeat: int) -> float:
    """Nanoseconds of CPU per event, the lowest of ``repeat`` passes of 10,000 messages of 10
    deltas and a final, posted as NDJSON lines in one chunked request (:func:`post_lines`),
    to one subscriber."""
    assert relay.server is not None
    server = relay.server
    subscriber, seen = connect(server, "/subscribe?channel=c")
    passes = []
    for _ in range(repeat + 1):  # the first pass warms up
        events, texts, _ = load(10_000, 1, f"m{next(_PASSES)}-")
        data = ndjson_post(texts)
        await settle(lambda: True)
        before, start = seen.written, time.process_time()
        answer = await post_lines(server, data)
        spent = time.process_time() - start
        check_answer(answer, 10_000)
        if seen.written == before:
            raise SystemExit("the subscriber got nothing: the relay did not apply the events")
        passes.append(spent / events * 1e9)
    subscriber.connection_lost(None)
    return min(passes[1:])


async def fanout(server: HttpServer, subscribers: int, repeat: int) -> float:
    """Nanoseconds of CPU per subscriber to deliver one message, the lowest over messages."""
    seen = [connect(server, "/subscribe?channel=f")[1] for _ in range(subscribers)]
    await settle(lambda: True)
    producer, _ = connect(server, "/produce?channel=f")
    await settle(lambda: True)
    passes = []
    for message in build_messages(repeat + 2, 10, prefix="f"):
        for frame in message.frames[:-1]:
            producer.data_received(client_frame(frame.encode()))
        await settle(lambda: True)
        before, start = sum(t.written for t in seen), time.process_time()
        producer.data_received(client_frame(message.frames[-1].encode()))
        await settle(lambda: True)
        passes.append((time.process_time() - start) / subscribers * 1e9)
        if sum(t.written for t in seen) <= before:
            raise SystemExit("no subscriber got the message")
    return min(passes[2:])


class Collections:
    """The time the cyclic garbage collector spends, while :meth:`counting`: every
    collection's, whichever code's allocation set it off."""

    def __init__(self) -> None:
        self.nanoseconds = 0
        self.count = 0
        self.longest = 0
        self._started = 0

    def _phase(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
            return
        spent = time.perf_counter_ns() - self._started
        self.nanoseconds += spent
        self.count += 1
        self.longest = max(self.longest, spent)

    @contextmanager
    def counting(self) -> Iterator[Collections]:
        gc.callbacks.append(self._phase)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._phase)


@contextmanager
def unapplied(decode: bool) -> Iterator[None]:
    """Producer frames read and handed over but not applied (``decode``: decoded too)."""
    from token_relay.core.codec import decode_producer_frame

    original = ProducerEndpoint._frame

    def frame(
        self: ProducerEndpoint, connection: Any, session: Any, raw: Any, now: float, run: Any = None
    ) -> None:
        if decode:
            decode_producer_frame(raw)

    ProducerEndpoint._frame = frame  # type: ignore[method-assign]
    try:
        yield
    finally:
        ProducerEndpoint._frame = original  # type: ignore[method-assign]


async def measure(repeat: int, subscribers: int) -> tuple[list[tuple[str, float, str]], list[str]]:
    """Every figure: (what, nanoseconds, per what); and notes on them."""

    rows = []
    notes: list[str] = []
    relay = as_the_cli_starts(Relay(settings()))
    server = await relay.start()
    rows.append(("ingest, a frame per event", await ingest(relay, 1, repeat), "event"))
    with Collections().counting() as collections:
        # Every pass (each figure above is its least disturbed one): what collecting costs.
        started, before = time.process_time(), relay.metrics.frames_in_producer.value
        rows.append(("ingest, 100 events per frame", await ingest(relay, 100, repeat), "event"))
        spent = time.process_time() - started
        events = (relay.metrics.frames_in_producer.value - before) * 100
    rows.append(("  garbage collection, every pass", collections.nanoseconds / events, "event"))
    share = f"{collections.nanoseconds / 1e9 / spent:.1%} of the CPU"
    longest = f"the longest {collections.longest / 1e6:.1f} ms"
    notes.append(f"garbage collection: {collections.count} collections, {share}, {longest}")
    rows.append(("ingest as NDJSON in one chunked POST", await ndjson(relay, repeat), "event"))
    for batch, frames in ((1, "a frame each"), (100, "100 per frame")):
        # Messages of 1 and of 100 deltas, solved for what a delta and a message cost.
        short = await ingest(relay, batch, repeat, deltas=1)  # (message + delta) / 2
        long = await ingest(relay, batch, repeat, deltas=100)  # (message + 100 deltas) / 101
        delta = (101 * long - 2 * short) / 99
        rows.append((f"  a plain delta, {frames}", delta, "delta"))
        rows.append((f"  a message's open and final, {frames}", 2 * short - delta, "message"))
    with unapplied(decode=False):
        rows.append(("  of which reading frames only", await ingest(relay, 1, repeat), "event"))
    with unapplied(decode=True):
        rows.append(("  reading and decoding them", await ingest(relay, 1, repeat), "event"))
    rows.append(
        (f"fan-out to {subscribers:,}", await fanout(server, subscribers, repeat), "socket")
    )
    await relay.stop()
    with tempfile.TemporaryDirectory(prefix="token-relay-inprocess-") as directory:
        redis = RedisServer(Path(directory))
        redis.start()
        try:
            relay = as_the_cli_starts(Relay(settings(redis.url)))
            server = await relay.start()
            row = (
                "ingest through Redis, a frame per event",
                await ingest(relay, 1, repeat, redis=True),
            )
            rows.append((*row, "event"))
            await relay.stop()
        finally:
            redis.kill()
    return rows, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inprocess", description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="passes per figure (3)")
    parser.add_argument("--subscribers", type=int, default=10_000, help="fan-out (10000)")
    args = parser.parse_args(argv)
    # Not asyncio.run: the relays' leftover tasks need no orderly end (see below).
    measuring = measure(args.repeat, args.subscribers)
    rows, notes = asyncio.new_event_loop().run_until_complete(measuring)
    for what, nanoseconds, per in rows:
        print(f"{what:<42} {nanoseconds / 1000:6.2f} µs of CPU per {per}")
    for note in notes:
        print(note)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
