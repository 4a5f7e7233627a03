"""Fan-out: from a producer's final until every subscriber of the channel has the message.

The subscribers are :class:`~bench.processes.SubscriberPool` connections (bare asyncio
protocols after a hand-made handshake, a few processes' worth), all subscribed to one
channel of the fan-out relay. The producer streams one message at a time like a model
does: its deltas :data:`DELTA_GAP` apart, then the final, one gap after the last delta.
Each sample is the time from writing the final (``time.time()``) to the last subscriber
process's last arrival (``time.time()`` too, the same machine clock), once every
connection holds the message; then the next message starts. The subscriber processes run
at a lower priority (nice 10), so that on a small machine they take the CPU the relay leaves
rather than the relay's, and the relay's and the clients' CPU time over each sample are
recorded to show which side was busy. Subscribers that take deltas
(``deltas=1``) also get every delta frame, so the final can queue behind them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .messages import Message
from .processes import ServiceProcess, SubscriberPool, cpu_seconds
from .producer import RawProducer
from .wire import client_frame

__all__ = ["DELTA_GAP", "FanoutRun", "measure_fanout"]

DELTA_GAP = 0.02
"""Seconds between a message's events: 50 tokens per second, a typical model."""
PAUSE = 0.05
"""Seconds between one message being everywhere and the next one starting."""
DELIVERY_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class FanoutRun:
    """One series of messages to one pool of subscribers."""

    subscribers: int
    deltas: bool
    samples: list[float]
    """Per message: seconds from writing the final to the last subscriber holding it."""
    first: list[float]
    """Per message: seconds from writing the final to the first subscriber holding it."""
    relay_cpu: list[float]
    """Per message: the relay's CPU seconds over the same span (10 ms resolution)."""
    client_cpu: list[float]
    """Per message: the subscriber processes' CPU seconds over the same span, together."""


async def measure_fanout(
    relay: ServiceProcess,
    pool: SubscriberPool,
    channel: str,
    messages: Sequence[Message],
    deltas: bool,
) -> FanoutRun:
    """Send ``messages`` one by one to ``pool``'s channel; time each final to delivery."""
    samples: list[float] = []
    first: list[float] = []
    relay_cpu: list[float] = []
    client_cpu: list[float] = []
    producer = await RawProducer.open(relay.port, channel)
    try:
        for number, message in enumerate(messages, 1):
            frames = [client_frame(text.encode()) for text in message.frames]
            for frame in frames[:-1]:
                producer.writer.write(frame)
                await asyncio.sleep(DELTA_GAP)
            cpu = cpu_seconds(relay.pid)
            clients = sum(cpu_seconds(pid) for pid in pool.pids)
            sent = time.time()
            producer.writer.write(frames[-1])
            earliest, latest = await pool.delivered(message.id, DELIVERY_TIMEOUT)
            relay_cpu.append(cpu_seconds(relay.pid) - cpu)
            client_cpu.append(sum(cpu_seconds(pid) for pid in pool.pids) - clients)
            await asyncio.wait_for(producer.acked(number), DELIVERY_TIMEOUT)
            samples.append(latest - sent)
            first.append(earliest - sent)
            await asyncio.sleep(PAUSE)
    finally:
        await producer.close()
    return FanoutRun(pool.connections, deltas, samples, first, relay_cpu, client_cpu)
