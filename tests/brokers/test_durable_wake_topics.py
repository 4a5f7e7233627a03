"""The durable streams' pub/sub topics (:class:`~token_relay.brokers.redis.durablewake.Wakes`)
on a real redis-server: a reader that asks to watch a path whose subscription another reader
started, and Redis has not confirmed yet, waits for it and looks again. Told it was watched
already, it would wait on a read made before Redis subscribed, and a change made in between
would wake nobody."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from redis.asyncio import Redis
from token_relay.brokers.redis.durablewake import TOPIC_PREFIX, Wakes

from ..harness import RedisServer, eventually

PATH = "/v1/stream/watched"
TOPIC = TOPIC_PREFIX + PATH


@contextlib.asynccontextmanager
async def _wakes(redis_server: RedisServer) -> AsyncIterator[tuple[Wakes, list[str]]]:
    """Wake topics on ``redis_server``, and the paths they wake, in order."""
    client = Redis.from_url(redis_server.url)
    woken: list[str] = []
    wakes = Wakes(lambda: client, woken.append)
    try:
        yield wakes, woken
    finally:
        await wakes.close()
        await client.aclose()


async def test_a_watch_while_the_subscription_is_unconfirmed_waits_and_looks_again(
    redis_server: RedisServer,
) -> None:
    async with _wakes(redis_server) as (wakes, woken):
        first = asyncio.create_task(wakes.watch(PATH))
        # The first reader has sent SUBSCRIBE: its topic is taken, Redis has not answered.
        await eventually(lambda: TOPIC in wakes._topics, 10, interval=0, what="SUBSCRIBE sent")
        # The second reader's first step runs before the loop reads Redis's confirmation
        # (its task was scheduled before this pass's I/O callbacks).
        second = asyncio.create_task(wakes.watch(PATH))
        await asyncio.sleep(0)
        assert not second.done()  # not "watched already" before Redis says so
        assert await asyncio.wait_for(first, 5) is True
        assert await asyncio.wait_for(second, 5) is True  # it looks again too
        assert await wakes.watch(PATH) is False  # confirmed: nothing to look again for
        # The topic is subscribed for real: a change published elsewhere wakes the path.
        async with Redis.from_url(redis_server.url) as other:
            assert await other.publish(TOPIC, b"") == 1
        for _ in range(500):
            if woken:
                break
            await asyncio.sleep(0.01)
        assert woken == [PATH]


async def test_after_a_reconnect_a_watch_waits_for_the_topics_to_be_subscribed_again(
    redis_server: RedisServer,
) -> None:
    async with _wakes(redis_server) as (wakes, woken):
        assert await asyncio.wait_for(wakes.watch(PATH), 5) is True
        assert await wakes.watch(PATH) is False
        # Redis drops the pub/sub connection: every watched path is woken, and the topics
        # are subscribed again on a new one.
        lost = wakes._pubsub
        async with Redis.from_url(redis_server.url) as admin:
            assert await admin.client_kill_filter(_type="pubsub") >= 1
        await eventually(lambda: woken == [PATH], 10, what="the path woken at the loss")
        await eventually(lambda: wakes._pubsub is not lost, 10, interval=0, what="a reconnect")
        # Until Redis confirms, a reader is not told "watched already": a change made before
        # the new subscription would wake nobody, so it waits, then looks again.
        again = asyncio.create_task(wakes.watch(PATH))
        await asyncio.sleep(0)
        assert not again.done()
        assert await asyncio.wait_for(again, 5) is True
        assert await wakes.watch(PATH) is False
        async with Redis.from_url(redis_server.url) as other:
            assert await other.publish(TOPIC, b"") == 1
        await eventually(lambda: woken == [PATH, PATH], 10, what="woken by the new subscription")
