"""Ingest: delta events per second from one producer through one server process.

* :func:`relay_ingest`: the relay. The producer is a :class:`~bench.producer.RawProducer`:
  every event frame is built before the clock starts, then written to the socket in 256 KiB
  chunks while a reader task counts the acks. One websockets subscriber checks every
  completed message (exact text, once, contiguous offsets). The clock runs from the first
  byte written to the subscriber holding the last message. With ``batch``, each frame is a
  JSON array of ``batch`` events, which the relay applies in order and answers with one
  ``acks`` frame.
* :func:`noop_ingest`: the ceiling, :mod:`bench.noop_server`, a websockets server that only
  reads frames, fed the same bytes by the same load generator; the clock runs until it says
  it has read them all.
* :func:`socketio_ingest`: the peer, :mod:`bench.sio_server`, doing the same job. It is
  driven the way its users drive it, with python-socketio's own client: one
  ``socketio.AsyncClient`` (websocket transport only) emits one ``event`` per delta event
  in a tight loop, yielding to the event loop every 100 emits so that its writer task and
  the readers run; ``emit()`` only queues a packet, and the client's writer task sends them
  in order. A second ``AsyncClient`` in the same process has joined the channel's room and
  checks every ``message``. The clock runs from the first emit to the subscriber holding
  the last message.

Each run also reads the server process's CPU time, so the report can show that the server,
not the load generator, was the busy side.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import socketio  # type: ignore[import-untyped]
from websockets.asyncio.client import connect

from .errors import BenchError
from .messages import Message
from .processes import ServiceProcess, cpu_seconds
from .producer import RawProducer, Rejected
from .wire import client_frames
from .workload import TIMEOUT_MARGIN, CheckingSubscriber, all_or_first_failure, short

__all__ = ["IngestRun", "Unsupported", "noop_ingest", "relay_ingest", "socketio_ingest"]

SOCKETIO_YIELD_EVERY = 100


class Unsupported(BenchError):
    """The relay rejected array frames: it does not take batched events."""


@dataclass(frozen=True, slots=True)
class IngestRun:
    """One ingest measurement."""

    events: int
    frames: int
    seconds: float
    server_cpu_seconds: float

    @property
    def events_per_second(self) -> float:
        """Events taken in per second (for the no-op server: events in the frames it read)."""
        return self.events / self.seconds

    @property
    def frames_per_second(self) -> float:
        """Frames read per second."""
        return self.frames / self.seconds

    @property
    def server_busy(self) -> float:
        """The server process's CPU time over the run's wall time (1.0 = one core, busy)."""
        return self.server_cpu_seconds / self.seconds


def frame_texts(messages: list[Message], batch: int | None) -> list[str]:
    """Every event as one frame each, or ``batch`` events per JSON array frame."""
    texts = [frame for message in messages for frame in message.frames]
    if batch is None:
        return texts
    return [
        "[" + ",".join(texts[start : start + batch]) + "]" for start in range(0, len(texts), batch)
    ]


async def relay_ingest(
    relay: ServiceProcess, channel: str, messages: list[Message], batch: int | None = None
) -> IngestRun:
    """One producer through ``relay`` to one subscriber; see the module docstring."""
    texts = frame_texts(messages, batch)
    events = sum(len(message.frames) for message in messages)
    data = client_frames(texts)
    query = "channel=" + quote(channel, safe="")
    async with connect(f"{relay.url}/subscribe?{query}", compression=None) as sub:
        confirmation = await asyncio.wait_for(sub.recv(), 10)
        if '"subscribed"' not in confirmation:
            raise BenchError(f"subscribing got {confirmation!r}")
        subscriber = CheckingSubscriber(sub, channel, messages)
        producer = await RawProducer.open(relay.port, channel)
        try:
            cpu = cpu_seconds(relay.pid)
            start = time.perf_counter()
            async with asyncio.timeout(TIMEOUT_MARGIN + events / 20_000):
                await all_or_first_failure(
                    producer.write(data), subscriber.run(), producer.acked(len(messages))
                )
            cpu = cpu_seconds(relay.pid) - cpu
        except Rejected as exc:
            if batch is not None:
                raise Unsupported(f"array frames were rejected: {exc.frame}") from None
            raise
        except TimeoutError:
            raise BenchError(
                f"ingest timed out with {len(subscriber.arrivals)} of {len(messages)} messages "
                f"delivered and {producer.acks} acks"
            ) from None
        finally:
            await producer.close()
    seconds = max(subscriber.arrivals.values()) - start
    return IngestRun(events, len(texts), seconds, cpu)


async def noop_ingest(
    server: ServiceProcess, messages: list[Message], batch: int | None = None, copies: int = 1
) -> IngestRun:
    """The same frames, ``copies`` times over, read by the no-op server.

    Several copies make a run long enough to time when the server reads it in a blink.
    """
    texts = frame_texts(messages, batch)
    frames = len(texts) * copies
    events = sum(len(message.frames) for message in messages) * copies
    data = client_frames(texts) * copies
    done = False
    finished = 0.0

    def on_text(payload: bytes) -> None:
        nonlocal done, finished
        if payload != f"done {frames}".encode():
            raise BenchError(f"the no-op server sent {payload[:100]!r}")
        finished = time.perf_counter()
        done = True
        producer.reached()

    producer = await RawProducer.open(server.port, target=f"/?frames={frames}", on_text=on_text)
    try:
        cpu = cpu_seconds(server.pid)
        start = time.perf_counter()
        async with asyncio.timeout(TIMEOUT_MARGIN + events / 50_000):
            await all_or_first_failure(producer.write(data), producer.wait_for(lambda: done))
        cpu = cpu_seconds(server.pid) - cpu
    except TimeoutError:
        raise BenchError("the no-op server did not read every frame in time") from None
    finally:
        await producer.close()
    return IngestRun(events, frames, finished - start, cpu)


async def socketio_ingest(
    server: ServiceProcess, channel: str, messages: list[Message]
) -> IngestRun:
    """The same events through the python-socketio relay; see the module docstring."""
    url = f"http://127.0.0.1:{server.port}"
    expected = {message.id: message.text for message in messages}
    arrivals: dict[str, float] = {}
    acks = 0
    problems: list[str] = []
    complete = asyncio.Event()
    # No reconnecting behind the benchmark's back, and Ctrl-C stays the harness's business
    # (by default the client takes over SIGINT and stops the event loop).
    subscriber = socketio.AsyncClient(reconnection=False, handle_sigint=False)
    producer = socketio.AsyncClient(reconnection=False, handle_sigint=False)

    def check_done() -> None:
        if problems or (len(arrivals) == len(expected) and acks == len(expected)):
            complete.set()

    @subscriber.on("message")  # type: ignore[untyped-decorator]
    def on_message(frame: dict[str, Any]) -> None:
        message_id = frame.get("id")
        if frame.get("channel") != channel or not isinstance(message_id, str):
            problems.append(f"unexpected message {short(frame)}")
        elif message_id in arrivals:
            problems.append(f"message {message_id!r} arrived twice")
        elif frame.get("text") != expected.get(message_id):
            problems.append(f"message {message_id!r} arrived with the wrong text")
        else:
            arrivals[message_id] = time.perf_counter()
        check_done()

    @producer.on("ack")  # type: ignore[untyped-decorator]
    def on_ack(frame: dict[str, Any]) -> None:
        nonlocal acks
        acks += 1
        check_done()

    events = [event for message in messages for event in message.events]
    try:
        await subscriber.connect(url, transports=["websocket"])
        reply = await subscriber.call("subscribe", channel, timeout=10)
        if reply != {"type": "subscribed", "channel": channel}:
            raise BenchError(f"socketio subscribe answered {reply!r}")
        await producer.connect(url, transports=["websocket"], auth={"channel": channel})
        cpu = cpu_seconds(server.pid)
        start = time.perf_counter()
        async with asyncio.timeout(TIMEOUT_MARGIN + len(events) / 2_000):
            emit = producer.emit
            for index, event in enumerate(events, 1):
                await emit("event", event)
                if index % SOCKETIO_YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            await complete.wait()
        cpu = cpu_seconds(server.pid) - cpu
    except TimeoutError:
        raise BenchError(
            f"socketio ingest timed out with {len(arrivals)} of {len(expected)} messages"
        ) from None
    except socketio.exceptions.SocketIOError as exc:
        raise BenchError(f"socketio client: {exc}") from None
    finally:
        await asyncio.gather(producer.disconnect(), subscriber.disconnect(), return_exceptions=True)
    if problems:
        raise BenchError(f"socketio relay: {problems[0]}")
    return IngestRun(len(events), len(events), max(arrivals.values()) - start, cpu)
