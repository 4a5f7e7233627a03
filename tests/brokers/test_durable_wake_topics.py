"""The durable streams' pub/sub topics (:class:`~token_relay.brokers.redis.durablewake.Wakes`)
against a pub/sub connection whose confirmations the test delivers: a reader that asks to
watch a path whose subscription another reader started, and Redis has not confirmed yet,
waits for it and looks again. Told it was watched already, it would wait on a read made
before Redis subscribed, and a change made in between would wake nobody."""

from __future__ import annotations

import asyncio
from typing import Any

from token_relay.brokers.redis.durablewake import TOPIC_PREFIX, Wakes

PATH = "/v1/stream/watched"
TOPIC = TOPIC_PREFIX + PATH


class HeldPubSub:
    """A pub/sub connection: subscriptions are sent, and confirmed when the test says."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def subscribe(self, *topics: str) -> None:
        self.sent.extend(topics)

    async def unsubscribe(self, *topics: str) -> None:
        pass

    async def get_message(self, timeout: float | None = None) -> dict[str, Any]:  # noqa: ASYNC109
        return await self.messages.get()

    async def aclose(self) -> None:
        pass

    def confirm(self, topic: str) -> None:
        self.messages.put_nowait({"type": "subscribe", "channel": topic.encode(), "data": 1})


class Client:
    def __init__(self, pubsub: HeldPubSub) -> None:
        self._pubsub = pubsub

    def pubsub(self) -> HeldPubSub:
        return self._pubsub


async def _turns(count: int = 20) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_watch_while_the_subscription_is_unconfirmed_waits_and_looks_again() -> None:
    pubsub = HeldPubSub()
    wakes = Wakes(lambda: Client(pubsub), lambda path: None)  # type: ignore[arg-type, return-value]
    try:
        first = asyncio.create_task(wakes.watch(PATH))
        await _turns()
        assert pubsub.sent == [TOPIC_PREFIX, TOPIC]  # sent, not confirmed
        second = asyncio.create_task(wakes.watch(PATH))
        await _turns()
        assert not second.done()  # not "watched already" before Redis says so
        pubsub.confirm(TOPIC)
        assert await asyncio.wait_for(first, 5) is True
        assert await asyncio.wait_for(second, 5) is True  # it looks again too
        assert await wakes.watch(PATH) is False  # confirmed: nothing to look again for
        assert pubsub.sent == [TOPIC_PREFIX, TOPIC]  # subscribed once
    finally:
        await wakes.close()
