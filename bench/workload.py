"""The two measured cases, over real WebSocket connections to running relays.

* :func:`measure_throughput`: one producer sends every event as fast as it can while
  reading its acks; one subscriber counts the completed messages.
* :func:`measure_latency`: the producer paces its events at a fixed rate; each message's
  latency is the time from sending its ``final`` to the subscriber holding its ``message``.

Both check that every message arrives exactly once, with contiguous offsets and exactly
the text that was sent, and raise :class:`~bench.errors.BenchError` otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from .errors import BenchError
from .messages import Message

if TYPE_CHECKING:
    from .processes import Route

__all__ = [
    "CheckingSubscriber",
    "LatencyResult",
    "ThroughputResult",
    "all_or_first_failure",
    "measure_latency",
    "measure_throughput",
    "short",
]

TIMEOUT_MARGIN = 30.0
"""Seconds a case may run beyond what its load should take before it is declared stuck."""


@dataclass(frozen=True, slots=True)
class ThroughputResult:
    """One throughput measurement."""

    messages: int
    events: int
    seconds: float
    """From the first send to the subscriber holding every message."""

    @property
    def events_per_second(self) -> float:
        """Delta events (deltas and finals) delivered per second."""
        return self.events / self.seconds


@dataclass(frozen=True, slots=True)
class LatencyResult:
    """One latency measurement: a sample per message, in seconds."""

    rate: float
    samples: list[float]


class CheckingSubscriber:
    """Reads one subscriber connection and checks every frame against what was sent."""

    def __init__(self, ws: ClientConnection, channel: str, messages: Sequence[Message]) -> None:
        self.ws = ws
        self.channel = channel
        self.expected = {message.id: message.text for message in messages}
        self.arrivals: dict[str, float] = {}

    async def run(self) -> None:
        """Read until every expected message has arrived."""
        if len(self.arrivals) == len(self.expected):
            return
        async for raw in self.ws:
            now = time.perf_counter()
            self.arrivals[self._check(json.loads(raw))] = now
            if len(self.arrivals) == len(self.expected):
                return
        raise BenchError(
            f"subscriber connection closed with {len(self.arrivals)} of "
            f"{len(self.expected)} messages"
        )

    def _check(self, frame: dict[str, Any]) -> str:
        """Fail unless ``frame`` is the next expected ``message``; return its id."""
        if frame.get("type") != "message" or frame.get("channel") != self.channel:
            raise BenchError(f"subscriber got an unexpected frame: {short(frame)}")
        message_id = frame.get("id")
        if not isinstance(message_id, str) or message_id not in self.expected:
            raise BenchError(f"subscriber got a message that was never sent: {short(frame)}")
        if message_id in self.arrivals:
            raise BenchError(f"subscriber got message {message_id!r} twice")
        if frame.get("text") != self.expected[message_id]:
            raise BenchError(
                f"message {message_id!r} arrived with the wrong text: "
                f"{frame.get('text')!r}, expected {self.expected[message_id]!r}"
            )
        if frame.get("offset") != len(self.arrivals) + 1:
            raise BenchError(
                f"message {message_id!r} has offset {frame.get('offset')!r}, expected "
                f"{len(self.arrivals) + 1} (a gap or reordering)"
            )
        return message_id


async def _read_acks(ws: ClientConnection, count: int, channel: str) -> None:
    """Read the producer's frames until ``count`` acks have come.

    The ``session`` frame a producer gets on connecting is skipped; anything else fails.
    """
    acked = 0
    async for raw in ws:
        frame = json.loads(raw)
        if frame.get("type") == "session":
            continue
        if frame.get("type") != "ack" or frame.get("channel") != channel:
            raise BenchError(f"producer got an unexpected frame: {short(frame)}")
        acked += 1
        if acked == count:
            return
    raise BenchError(f"producer connection closed with {acked} of {count} acks")


def short(frame: object, limit: int = 300) -> str:
    text = json.dumps(frame, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


async def all_or_first_failure(*coroutines: Coroutine[Any, Any, None]) -> None:
    """Run the coroutines together; on the first failure cancel the rest and re-raise it."""
    tasks = [asyncio.create_task(coroutine) for coroutine in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


@contextlib.asynccontextmanager
async def _connected(
    route: Route, channel: str
) -> AsyncIterator[tuple[ClientConnection, ClientConnection]]:
    """A subscribed subscriber connection and a producer connection for ``channel``."""
    query = "channel=" + quote(channel, safe="")
    try:
        async with (
            connect(f"{route.subscriber.url}/subscribe?{query}", compression=None) as sub,
            connect(f"{route.producer.url}/produce?{query}", compression=None) as producer,
        ):
            confirmation = json.loads(await asyncio.wait_for(sub.recv(), 10))
            if confirmation.get("type") != "subscribed" or confirmation.get("channel") != channel:
                raise BenchError(f"subscribing got {short(confirmation)}")
            yield sub, producer
    except ConnectionClosed as exc:
        raise BenchError(f"{route.label}: a connection closed unexpectedly ({exc})") from None


async def measure_throughput(
    route: Route, channel: str, messages: Sequence[Message]
) -> ThroughputResult:
    """Send every message as fast as possible and time until the subscriber holds them all."""
    frames = [frame for message in messages for frame in message.frames]
    async with _connected(route, channel) as (sub, producer):
        subscriber = CheckingSubscriber(sub, channel, messages)
        start = 0.0

        async def send() -> None:
            nonlocal start
            per_message = len(messages[0].frames) if messages else 1
            start = time.perf_counter()
            for index, frame in enumerate(frames, 1):
                await producer.send(frame)
                if index % per_message == 0:
                    # send() only yields when the socket is full: let the readers run.
                    await asyncio.sleep(0)

        try:
            async with asyncio.timeout(TIMEOUT_MARGIN + len(frames) / 500):
                await all_or_first_failure(
                    send(), subscriber.run(), _read_acks(producer, len(messages), channel)
                )
        except TimeoutError:
            raise BenchError(
                f"{route.label}: throughput timed out with {len(subscriber.arrivals)} of "
                f"{len(messages)} messages delivered"
            ) from None
    last = max(subscriber.arrivals.values(), default=start)
    return ThroughputResult(len(messages), len(frames), last - start)


async def measure_latency(
    route: Route, channel: str, messages: Sequence[Message], rate: float
) -> LatencyResult:
    """Send ``rate`` messages per second, events spread evenly; time each final to delivery."""
    events = [(message, frame) for message in messages for frame in message.frames]
    per_message = len(events) / len(messages) if messages else 1.0
    interval = 1.0 / (rate * per_message)
    sent: dict[str, float] = {}
    async with _connected(route, channel) as (sub, producer):
        subscriber = CheckingSubscriber(sub, channel, messages)

        async def send() -> None:
            start = time.perf_counter()
            for index, (message, frame) in enumerate(events):
                delay = start + index * interval - time.perf_counter()
                # Behind schedule, still yield, so the readers timestamp arrivals promptly.
                await asyncio.sleep(max(delay, 0))
                if frame is message.frames[-1]:
                    sent[message.id] = time.perf_counter()
                await producer.send(frame)

        try:
            async with asyncio.timeout(TIMEOUT_MARGIN + len(messages) / rate):
                await all_or_first_failure(
                    send(), subscriber.run(), _read_acks(producer, len(messages), channel)
                )
        except TimeoutError:
            raise BenchError(
                f"{route.label}: latency timed out with {len(subscriber.arrivals)} of "
                f"{len(messages)} messages delivered"
            ) from None
    samples = [subscriber.arrivals[message.id] - sent[message.id] for message in messages]
    return LatencyResult(rate, samples)
