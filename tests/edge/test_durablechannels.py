"""Channel streams' live reads against a broker that plays each order of a frame and a read:
a frame that arrives while a long-poll reads the history wakes it (it was listening first)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from token_relay.core.events import CatchUp
from token_relay.core.settings import Settings
from token_relay.edge.durablechannels import ChannelStreams
from token_relay.edge.http import HttpRequest
from token_relay.edge.routes import StreamRequest

EPOCH = "e"
FRAME = '{"type":"message","channel":"c","id":"m","text":"x","offset":1,"epoch":"e"}'


class RacingBroker:
    """A broker whose history gets the frame only after the first read, which the frame's
    delivery interrupts (``during_read``) or follows (``after_read``)."""

    def __init__(self, streams: list[ChannelStreams], order: str) -> None:
        self.streams = streams
        self.order = order
        self.reads = 0
        self.interest: list[tuple[str, bool]] = []

    async def catch_up(
        self, channel: str, since: tuple[int, str] | None, live: bool, rewind: int = 0
    ) -> CatchUp:
        self.reads += 1
        if self.reads == 1:
            if self.order == "during_read":
                self.streams[0].on_frame(channel)  # delivered before this read answers
            else:
                asyncio.get_running_loop().call_soon(self.streams[0].on_frame, channel)
            return CatchUp(0, EPOCH, True, [], 0, [])
        return CatchUp(1, EPOCH, True, [FRAME], 1, [])


def _streams(order: str) -> tuple[ChannelStreams, RacingBroker]:
    holder: list[ChannelStreams] = []
    broker = RacingBroker(holder, order)

    async def update_interest(channel: str, strict: bool) -> None:
        broker.interest.append((channel, streams.listening(channel)))

    def spawn(coroutine: Coroutine[Any, Any, None]) -> None:
        asyncio.ensure_future(coroutine)  # noqa: RUF006 - awaited below through the loop

    # A long-poll that would wait an hour if it missed the wake: it must not.
    streams = ChannelStreams(
        Settings(long_poll_timeout=3600),
        broker,
        update_interest,
        spawn,  # type: ignore[arg-type]
    )
    holder.append(streams)
    return streams, broker


async def _poll(streams: ChannelStreams) -> tuple[int, bytes]:
    route = StreamRequest(
        method="GET", stream="/v1/stream/__channel/c", offset=f"{EPOCH}_{0:016d}", live="long-poll"
    )
    request = HttpRequest("GET", route.stream, route.stream, (), "127.0.0.1")
    reply = await asyncio.wait_for(streams.serve(route, request), 60)
    return reply.status, reply.body


async def test_a_frame_delivered_during_the_read_wakes_the_poll() -> None:
    streams, broker = _streams("during_read")
    assert await _poll(streams) == (200, f"[{FRAME}]".encode())
    assert broker.reads == 2
    await asyncio.sleep(0)
    assert broker.interest == [("c", True), ("c", False)]
    assert not streams.listening("c")


async def test_a_frame_delivered_after_the_read_wakes_the_poll() -> None:
    streams, broker = _streams("after_read")
    assert await _poll(streams) == (200, f"[{FRAME}]".encode())
    assert broker.reads == 2
    await asyncio.sleep(0)
    assert broker.interest == [("c", True), ("c", False)]
