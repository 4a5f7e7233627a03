"""The durable streams' pub/sub topics (:class:`~token_relay.brokers.redis.durablewake.Wakes`)
on a real redis-server: a reader that asks to watch a path whose subscription another reader
started, and Redis has not confirmed yet, waits for it and looks again. Told it was watched
already, it would wait on a read made before Redis subscribed, and a change made in between
would wake nobody."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from token_relay.brokers.redis.durablewake import TOPIC_PREFIX, Wakes

from ..harness import RedisServer, eventually

PATH = "/v1/stream/watched"
TOPIC = TOPIC_PREFIX + PATH


async def test_a_watch_while_the_subscription_is_unconfirmed_waits_and_looks_again(
    redis_server: RedisServer,
) -> None:
    client = Redis.from_url(redis_server.url)
    woken: list[str] = []
    wakes = Wakes(lambda: client, woken.append)
    try:
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
    finally:
        await wakes.close()
        await client.aclose()
