"""Memory: the relay's resident set size per idle subscriber and per message in flight.

Each measurement gets a fresh relay process, so that memory freed by an earlier step can't
be reused and hide what the measured step costs:

* idle subscribers: :data:`WARM_SUBSCRIBERS` subscribers connect first (so one-time costs,
  such as code paths run for the first time, are in the baseline), then RSS is read; then
  N more subscribers of another channel connect and stay idle, and RSS is read again.
  The cost is the difference over N.
* messages in flight: messages of 10,000 characters each are streamed, in deltas of four
  characters like a model's tokens, and left unfinished; a final for one more message,
  acked once the relay has applied everything before it, marks the end of a batch. A first
  batch (a fifth as many, at least ten) warms up whatever grows once, such as buffers and
  the allocator's first arenas; RSS is read; then N more, and RSS is read again.

RSS is read from ``/proc`` once it has stopped moving (two reads 100 ms apart that agree
within 16 KiB, or after 3 s).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from .messages import Message, build_messages
from .processes import ServiceProcess, SubscriberPool, relay, rss_bytes, started
from .producer import RawProducer
from .wire import client_frames

__all__ = ["IN_FLIGHT_CHARS", "MemoryRun", "idle_subscriber_bytes", "in_flight_bytes"]

WARM_SUBSCRIBERS = 100
WARM_IN_FLIGHT = 10
IN_FLIGHT_CHARS = 10_000
DELTA_CHARS = 4
SETTLE_STEP = 0.1
SETTLE_LIMIT = 3.0
SETTLE_TOLERANCE = 16 * 1024


@dataclass(frozen=True, slots=True)
class MemoryRun:
    """One memory measurement."""

    count: int
    before: int
    after: int

    @property
    def per_item(self) -> float:
        """Bytes of RSS per subscriber or per message."""
        return (self.after - self.before) / self.count


async def settled_rss(process: ServiceProcess) -> int:
    """The process's RSS once it has stopped moving."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_LIMIT
    previous = rss_bytes(process.pid)
    while True:
        await asyncio.sleep(SETTLE_STEP)
        current = rss_bytes(process.pid)
        if abs(current - previous) <= SETTLE_TOLERANCE or loop.time() > deadline:
            return current
        previous = current


async def idle_subscriber_bytes(
    count: int, processes: int, notable: list[str], relay_args: Sequence[str] = ()
) -> MemoryRun:
    """RSS per idle subscriber on a fresh relay; its warnings go to ``notable``."""
    server = relay("M1", *relay_args)
    try:
        async with (
            started(server),
            SubscriberPool.running(server.port, "memory-warm", WARM_SUBSCRIBERS, 1),
        ):
            before = await settled_rss(server)
            async with SubscriberPool.running(server.port, "memory-idle", count, processes):
                after = await settled_rss(server)
                server.check_alive()
    finally:
        notable.extend(f"{server.name}: {line}" for line in server.notable)
    return MemoryRun(count, before, after)


async def in_flight_bytes(
    count: int, notable: list[str], relay_args: Sequence[str] = ()
) -> MemoryRun:
    """RSS per unfinished 10,000-character message on a fresh relay; warnings to ``notable``."""
    deltas = IN_FLIGHT_CHARS // DELTA_CHARS
    warm_count = max(WARM_IN_FLIGHT, count // 5)
    messages = build_messages(warm_count + count + 2, deltas, prefix="memory-")
    warm, measured = messages[:warm_count], messages[warm_count : warm_count + count]
    markers = messages[-2:]
    server = relay("M2", "--max-streaming-per-producer", str(warm_count + count + 10), *relay_args)

    def unfinished(batch: Sequence[Message], marker: Message) -> bytes:
        """Every delta of ``batch``, no final, then the final of ``marker``."""
        frames = [frame for message in batch for frame in message.frames[:-1]]
        return client_frames([*frames, marker.frames[-1]])

    try:
        async with started(server):
            producer = await RawProducer.open(server.port, "memory-in-flight")
            try:
                await producer.write(unfinished(warm, markers[0]))
                await asyncio.wait_for(producer.acked(1), 60 + warm_count * deltas / 10_000)
                before = await settled_rss(server)
                await producer.write(unfinished(measured, markers[1]))
                await asyncio.wait_for(producer.acked(2), 60 + count * deltas / 10_000)
                after = await settled_rss(server)
                server.check_alive()
            finally:
                await producer.close()
    finally:
        notable.extend(f"{server.name}: {line}" for line in server.notable)
    return MemoryRun(count, before, after)
