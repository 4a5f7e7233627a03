"""Durable Streams' live reads against a store that plays a change made elsewhere (another
relay process on the same Redis) while a read is under way: the change's wake is heard
before the read's answer, which still shows the stream as it was. A live read listens
before it reads, so that wake is not lost: the long-poll and the SSE response get the data
at once, where they would otherwise sleep until their timeout (a lost wake, seen under
load in the conformance suite on two relays behind nginx)."""

from __future__ import annotations

import asyncio
import copy

import pytest
from token_relay.core.durable import DurableStream, Limits
from token_relay.core.durablestore import Create, LocalStore, MemoryStore
from token_relay.core.grants import Grant, Role
from token_relay.core.settings import Settings
from token_relay.edge.durable import DurableStreams
from token_relay.edge.http import HttpRequest, ReadBody, Reply
from token_relay.edge.routes import StreamRequest

PATH = "/v1/stream/racing"
TEXT = "text/plain"
ELSEWHERE = b"appended elsewhere"

RACES = {
    # The change lands during the live read's first read; the path is watched already.
    "during_the_first_read": (1, False),
    # The first wait starts the path's subscription (the caller looks again), and the change
    # lands during that second read.
    "during_the_read_after_the_subscription": (2, True),
}


class RacingStore(LocalStore):
    """A store whose ``racing_read``-th read finds the stream as it was, while another
    process appends to it and its wake is delivered before the read answers."""

    def __init__(self, racing_read: int, subscribes: bool) -> None:
        super().__init__(
            MemoryStore(
                max_streams=4, max_total_bytes=1000, limits=Limits(max_bytes=1000, max_producers=4)
            )
        )
        self.racing_read = racing_read
        self.watched = not subscribes
        self.reads = 0

    async def get(self, path: str, now: float, *, touch: bool = False) -> DurableStream:
        stream = await super().get(path, now, touch=touch)
        self.reads += 1
        if self.reads != self.racing_read:
            return stream
        found = copy.copy(stream)  # the stream as the read found it (its tail)...
        await self.append(path, ELSEWHERE, content_type=TEXT, close=False, now=now)
        self.wake(path)  # ...and the wake of the change after it, heard before its answer
        return found

    async def watch(self, path: str) -> bool:
        if self.watched:
            return False
        self.watched = True
        return True


async def _streams(race: str) -> tuple[DurableStreams, RacingStore]:
    store = RacingStore(*RACES[race])
    # A live read that missed the wake would wait an hour: it must not.
    streams = DurableStreams(Settings(long_poll_timeout=3600), store=store)
    await store.create(PATH, Create(content_type=TEXT), streams.clock())
    return streams, store


def _reading(live: str) -> ReadBody:
    route = StreamRequest(method="GET", stream=PATH, offset="now", live=live)
    request = HttpRequest("GET", PATH, PATH, (), "127.0.0.1")
    return ReadBody(request, route, Grant(Role.SUBSCRIBE, ("*",)))


@pytest.mark.parametrize("race", RACES)
async def test_a_change_made_during_a_long_polls_read_wakes_it(race: str) -> None:
    streams, store = await _streams(race)
    reply = await asyncio.wait_for(streams.serve(_reading("long-poll"), b""), 10)
    assert (reply.status, reply.body) == (200, ELSEWHERE)
    assert store.reads == store.racing_read + 1
    assert not streams._waiters  # every waiter it listened with is forgotten


class Sse:
    """What following a stream writes to: its events, and when the data came."""

    def __init__(self) -> None:
        self.open = True
        self.events = b""
        self.data = asyncio.Event()
        self.refused: Reply | None = None
        self.until_gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Never done: the client stays."""

    def begin(self, headers: tuple[tuple[str, str], ...]) -> None:
        pass

    def event(self, chunk: bytes) -> None:
        self.events += chunk
        if b"event: data" in chunk:
            self.data.set()

    async def drain(self) -> None:
        pass

    def refuse(self, reply: Reply) -> None:
        self.refused = reply


@pytest.mark.parametrize("race", RACES)
async def test_a_change_made_during_an_sse_reads_read_is_sent_at_once(race: str) -> None:
    streams, store = await _streams(race)
    sse = Sse()
    reading = _reading("sse")
    following = asyncio.create_task(streams.serve_sse(sse, reading.route))  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(sse.data.wait(), 10)
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
    assert sse.refused is None
    assert b"data:" + ELSEWHERE in sse.events
    assert store.reads == store.racing_read + 1
    assert not streams._waiters  # every waiter it listened with is forgotten


async def _until_waiting(streams: DurableStreams) -> None:
    while not streams._waiters:  # noqa: ASYNC110 - a pass of the loop at a time
        await asyncio.sleep(0)


async def test_a_long_poll_whose_client_goes_stops_waiting_at_once() -> None:
    """Told its client is gone, a long-poll ends in the same pass, not at its timeout (an
    hour here), and forgets its waiter."""
    streams = DurableStreams(Settings(long_poll_timeout=3600), store=RacingStore(0, False))
    await streams.store.create(PATH, Create(content_type=TEXT), streams.clock())
    gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    base = _reading("long-poll")
    reading = ReadBody(base.request, base.route, base.grant, gone=gone)
    polling = asyncio.create_task(streams.serve(reading, b""))
    await asyncio.wait_for(_until_waiting(streams), 10)
    assert streams._polls == 1 and not polling.done()
    gone.set_result(None)
    reply = await asyncio.wait_for(polling, 1)
    assert reply.status == 204  # written nowhere: its socket is gone
    assert streams._polls == 0
    assert not streams._waiters


async def test_an_sse_read_whose_client_goes_stops_waiting_at_once() -> None:
    """An SSE response whose socket goes ends then, not at its lifetime, with nothing
    more written, and forgets its waiter."""
    streams = DurableStreams(Settings(), store=RacingStore(0, False))
    await streams.store.create(PATH, Create(content_type=TEXT), streams.clock())
    sse = Sse()
    following = asyncio.create_task(streams.serve_sse(sse, _reading("sse").route))  # type: ignore[arg-type]
    await asyncio.wait_for(_until_waiting(streams), 10)
    told = sse.events
    assert b"event: control" in told and not following.done()
    sse.open = False  # as the socket's loss leaves it
    sse.until_gone.set_result(None)
    await asyncio.wait_for(following, 1)
    assert sse.events == told
    assert not streams._waiters
