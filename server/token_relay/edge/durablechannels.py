"""Every channel read as a Durable Stream: ``/v1/stream/__channel/{channel}``.

The stream is read-only (``GET`` and ``HEAD``; a write gets 405, ``read_only``), JSON, and
its items are the channel's completed frames from the broker's history, as a subscriber
gets them. The offsets map 1:1 to the channel's positions
(:mod:`token_relay.core.durablechannels`). A catch-up read answers what history holds from
its offset; a long-poll and an SSE read wait for the channel's next terminal frame,
delivered through the broker as to any subscriber (with Redis: its pub/sub; the history,
Redis's): while one waits, this process listens to the channel's frames.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..brokers import Broker
from ..core.durable import BEGINNING, TAIL
from ..core.durablechannels import (
    ChannelPosition,
    Items,
    channel_of,
    channel_offset,
    etag,
    from_start,
    items_body,
    judge_read,
    position_of_offset,
)
from ..core.durablerequests import cursor
from ..core.errors import BrokerUnavailable, StreamRefused
from ..core.settings import Settings
from .durablesse import SSE_LIFETIME, DurableSse, sse_event
from .http import HttpRequest, Reply
from .routes import STREAM_PREFIX, StreamRequest
from .waiters import Waiters, woken

__all__ = ["ChannelStreams", "channel_of_route"]

CURSOR_JITTER = (1, 180)
JSON = "application/json"
Headers = tuple[tuple[str, str], ...]


def channel_of_route(route: StreamRequest) -> str | None:
    """The channel a stream request reads, or None for any other stream."""
    return channel_of(route.stream.removeprefix(STREAM_PREFIX))


class ChannelStreams:
    """The channel streams of one relay process."""

    def __init__(
        self,
        settings: Settings,
        broker: Broker,
        update_interest: Callable[[str, bool], Coroutine[Any, Any, None]],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.update_interest = update_interest
        """Tell the broker whether this process needs a channel's frames now (strictly:
        raising :class:`BrokerUnavailable`, when asked)."""
        self.spawn = spawn
        self.clock = clock
        self._waiters = Waiters()
        self._readers: dict[str, int] = {}
        """Live reads in progress, per channel: while any, the channel's frames are wanted."""
        self.stopping = False
        self._polls = 0
        """Long-polls in progress (their answer is written in the step that ends them)."""

    # ------------------------------------------------------------------ the broker

    def listening(self, channel: str) -> bool:
        """Whether a live read of ``channel`` waits here (its frames are wanted)."""
        return channel in self._readers

    def on_frame(self, channel: str) -> None:
        """A terminal frame of ``channel`` came: wake its live reads."""
        self._waiters.wake(channel)

    @property
    def polls(self) -> int:
        """Long-polls in progress."""
        return self._polls

    async def stop(self) -> None:
        """The relay is shutting down: every live read answers now (a long-poll 204), and
        this returns once the long-polls' answers are written, before their sockets close."""
        self.stopping = True
        self._waiters.wake_all()
        while self._polls:  # noqa: ASYNC110 - each poll ends in the loop's next passes
            await asyncio.sleep(0)

    async def _follow(self, channel: str) -> None:
        self._readers[channel] = self._readers.get(channel, 0) + 1
        if self._readers[channel] == 1:
            try:
                await self.update_interest(channel, True)
            except BrokerUnavailable:
                self._unfollow(channel)
                raise StreamRefused(
                    503, "broker_unavailable", "the broker is unreachable"
                ) from None

    def _unfollow(self, channel: str) -> None:
        left = self._readers.get(channel, 1) - 1
        if left:
            self._readers[channel] = left
            return
        self._readers.pop(channel, None)
        self.spawn(self.update_interest(channel, False))

    def _waiter(self, channel: str) -> asyncio.Future[None]:
        return self._waiters.listen(channel)

    async def _wait(
        self,
        channel: str,
        waiter: asyncio.Future[None],
        timeout: float,  # noqa: ASYNC109
        gone: asyncio.Future[None] | None,
    ) -> None:
        try:
            if timeout > 0 and not self.stopping:
                await woken(waiter, timeout, gone)
        finally:
            self._discard(channel, waiter)

    def _discard(self, channel: str, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(channel, waiter)

    # ------------------------------------------------------------------ reads

    async def read(self, channel: str, offset: str | ChannelPosition | None) -> Items:
        """What history holds of ``channel`` from ``offset`` (``-1``/None, ``now``, a
        stream offset, or a position)."""
        try:
            if offset is None or offset == BEGINNING:
                cut = await self.broker.catch_up(channel, None, False, self.settings.history_size)
                return from_start(ChannelPosition(cut.offset, cut.epoch), cut.frames)
            if offset == TAIL:
                cut = await self.broker.catch_up(channel, None, False)
                tail = ChannelPosition(cut.offset, cut.epoch)
                return Items((), tail, tail)
            since = offset if isinstance(offset, ChannelPosition) else position_of_offset(offset)
            cut = await self.broker.catch_up(channel, (since.offset, since.epoch), False)
        except BrokerUnavailable:
            raise StreamRefused(503, "broker_unavailable", "the broker is unreachable") from None
        tail = ChannelPosition(cut.offset, cut.epoch)
        return judge_read(since, tail, bool(cut.recovered), cut.frames)

    async def serve(
        self, route: StreamRequest, request: HttpRequest, gone: asyncio.Future[None] | None = None
    ) -> Reply:
        """Answer one request on a channel's stream (anything but an SSE read). A long-poll
        stops waiting once its client is ``gone``."""
        channel = channel_of_route(route)
        assert channel is not None
        if route.method not in ("GET", "HEAD"):
            raise StreamRefused(
                405,
                "read_only",
                "a channel's stream is read-only: its producers write the channel",
                (("Allow", "GET, HEAD"),),
            )
        if route.method == "HEAD":
            items = await self.read(channel, TAIL)
            return Reply(
                200,
                b"",
                JSON,
                (("Stream-Next-Offset", channel_offset(items.end)), ("Cache-Control", "no-store")),
            )
        if route.live == "long-poll":
            self._polls += 1
            try:
                return await self._poll(channel, route, gone)
            finally:
                self._polls -= 1
        items = await self.read(channel, route.offset)
        tag = etag(items)
        headers: Headers = (
            ("Stream-Next-Offset", channel_offset(items.end)),
            *_up_to_date(items),
            ("ETag", tag),
            ("Stream-Cursor", self.cursor(route)),
            ("Cache-Control", "no-store"),
        )
        if tag in {t.strip() for t in request.header("if-none-match").split(",")}:
            return Reply(304, b"", headers=headers)
        return Reply(200, items_body(items.frames), JSON, headers)

    async def _poll(
        self, channel: str, route: StreamRequest, gone: asyncio.Future[None] | None
    ) -> Reply:
        """A long-poll: the frames after the offset once there are any, or 204 at the
        timeout (at once when the relay stops)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.long_poll_timeout
        await self._follow(channel)
        try:
            position: str | ChannelPosition | None = route.offset
            while True:
                waiter = self._waiter(channel)  # before the read: no frame falls between
                items = await self.read(channel, position)
                if items.frames:
                    self._discard(channel, waiter)
                    return Reply(
                        200,
                        items_body(items.frames),
                        JSON,
                        (
                            ("Stream-Next-Offset", channel_offset(items.end)),
                            *_up_to_date(items),
                            ("ETag", etag(items)),
                            ("Stream-Cursor", self.cursor(route)),
                            ("Cache-Control", "no-store"),
                        ),
                    )
                left = deadline - loop.time()
                if left <= 0 or self.stopping or (gone is not None and gone.done()):
                    self._discard(channel, waiter)
                    return Reply(
                        204,
                        b"",
                        headers=(
                            ("Stream-Next-Offset", channel_offset(items.end)),
                            ("Stream-Up-To-Date", "true"),
                            ("Stream-Cursor", self.cursor(route)),
                            ("Cache-Control", "no-store"),
                        ),
                    )
                await self._wait(channel, waiter, left, gone)
                position = items.start
        finally:
            self._unfollow(channel)

    def cursor(self, route: StreamRequest) -> str:
        return cursor(self.clock(), route.cursor, random.randint(*CURSOR_JITTER))

    # ------------------------------------------------------------------ SSE

    async def serve_sse(self, sse: DurableSse, route: StreamRequest) -> None:
        """A live read as Server-Sent Events: what history holds from the offset, as a
        ``data`` event and a ``control`` event, then each new frame the same way, until the
        client goes, the relay stops, or :data:`SSE_LIFETIME` passes."""
        try:
            channel = channel_of_route(route)
            assert channel is not None
            await self._follow(channel)
        except StreamRefused as exc:
            sse.refuse(_refusal(exc))
            return
        waiter = self._waiter(channel)  # before the read: no frame falls between
        try:
            try:
                items = await self.read(channel, route.offset)
            except StreamRefused as exc:
                sse.refuse(_refusal(exc))
                return
            sse.begin(
                (
                    ("Content-Type", "text/event-stream"),
                    ("Cache-Control", "no-cache"),
                    ("X-Accel-Buffering", "no"),
                )
            )
            loop = asyncio.get_running_loop()
            ends = loop.time() + SSE_LIFETIME
            told = False
            while sse.open:
                if items.frames or not told:
                    events = b""
                    if items.frames:
                        events += sse_event("data", items_body(items.frames).decode())
                    control = {
                        "streamNextOffset": channel_offset(items.end),
                        "streamCursor": self.cursor(route),
                        "upToDate": items.up_to_date,
                    }
                    events += sse_event("control", json.dumps(control, separators=(",", ":")))
                    sse.event(events)
                    told = True
                    await sse.drain()
                left = ends - loop.time()
                if left <= 0 or self.stopping:
                    return
                if items.up_to_date:  # else the rest is read at once
                    await self._wait(channel, waiter, left, sse.until_gone)
                    waiter = self._waiter(channel)
                try:
                    items = await self.read(channel, items.end)
                except StreamRefused:
                    return  # history moved past us: the client reads on from its offset
        finally:
            self._discard(channel, waiter)
            self._unfollow(channel)


def _up_to_date(items: Items) -> Headers:
    """``Stream-Up-To-Date`` when the read reached the channel's tail."""
    return (("Stream-Up-To-Date", "true"),) if items.up_to_date else ()


def _refusal(exc: StreamRefused) -> Reply:
    body = json.dumps({"type": "error", "code": exc.code, "message": exc.message})
    return Reply(exc.status, body.encode(), JSON, exc.headers)
