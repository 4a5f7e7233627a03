"""Dead webhook letters on every broker: bounded in count and in bytes, the oldest dropped
first, a letter alone over the bytes never kept, and every byte accounted for (in the
process's memory with the memory broker, in ``tr:wh:dead:bytes`` with Redis)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from token_relay.brokers import Broker, WebhookStore, open_broker
from token_relay.brokers.memory import MemoryBroker
from token_relay.brokers.redis.webhooks import DEAD, DEAD_BYTES
from token_relay.core.settings import Settings
from token_relay.core.webhooks import DeadLetter, WebhookPayload

from ..harness import RedisServer
from .test_contract import Recorder

URL = "http://127.0.0.1:9/hook"


def _letter(message_id: str, chars: int) -> DeadLetter:
    payload = WebhookPayload(
        type="message", channel="c", id=message_id, text="x" * chars, meta={}, offset=1,
        epoch="e",
    )  # fmt: skip
    return DeadLetter(
        webhook_id=f"msg_{message_id}", url=URL, attempts=1, error="http_error 500",
        completed_at=0.0, died_at=0.0, payload=payload,
    )  # fmt: skip


def _size(message_id: str, chars: int) -> int:
    return len(_letter(message_id, chars).model_dump_json())


@pytest.fixture(params=["memory", "redis"])
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    url = "memory://"
    if request.param == "redis":
        url = request.getfixturevalue("redis_server").url
    # Room for three letters of 1,000 characters by count, and for two by bytes.
    settings = Settings(
        broker=url, webhooks=(URL,), webhook_max_dead=3,
        webhook_max_dead_bytes=2 * _size("m0", 1000) + 500,
    )  # fmt: skip
    broker = open_broker(settings, "alpha")
    await broker.start(Recorder())
    try:
        yield broker
    finally:
        await broker.close()


async def _seen(store: WebhookStore) -> tuple[int, int]:
    await store.take(0, 0)  # a Redis store counts what Redis holds as it takes
    return store.dead_count, store.dead_bytes


async def test_dead_letters_count_the_bytes_of_their_json_not_its_characters(
    broker: Broker,
) -> None:
    store = broker.webhooks
    assert store is not None
    plain = _letter("e", 0)
    letter = plain.model_copy(
        update={"payload": plain.payload.model_copy(update={"text": "🚀" * 300})}
    )
    size = len(letter.model_dump_json().encode())
    assert size == len(letter.model_dump_json()) + 900  # four bytes a rocket, one character
    assert await store.bury(letter) == 0
    assert await _seen(store) == (1, size)


async def test_dead_letters_are_bounded_in_count_and_bytes_oldest_dropped_first(
    broker: Broker,
) -> None:
    store = broker.webhooks
    assert store is not None
    # By count: 300-character letters, three fit in the bytes; the fourth drops the first.
    assert [await store.bury(_letter(f"s{n}", 300)) for n in range(4)] == [0, 0, 0, 1]
    assert [d.payload.id for d in await store.dead()] == ["s3", "s2", "s1"]
    assert await _seen(store) == (3, sum(_size(f"s{n}", 300) for n in (1, 2, 3)))
    # Bytes: two letters of 1,000 characters fit beside nothing else.
    assert await store.bury(_letter("m0", 1000)) == 1  # s1, the oldest, by count
    assert [d.payload.id for d in await store.dead()] == ["m0", "s3", "s2"]
    assert await store.bury(_letter("m1", 1000)) == 2  # s2 and s3, by bytes
    assert [d.payload.id for d in await store.dead()] == ["m1", "m0"]
    assert await _seen(store) == (2, 2 * _size("m0", 1000))
    # A letter alone over the bytes is dropped at once; the others stay.
    assert await store.bury(_letter("huge", 5000)) == 1
    assert [d.payload.id for d in await store.dead()] == ["m1", "m0"]
    assert await _seen(store) == (2, 2 * _size("m0", 1000))
    # Revived letters leave the count.
    assert await store.revive() == 2
    assert await _seen(store) == (0, 0)


async def test_memory_dead_letters_count_in_the_relays_memory() -> None:
    settings = Settings(webhooks=(URL,), webhook_max_dead=10, webhook_max_dead_bytes=100_000)
    broker = open_broker(settings, "alpha")
    assert isinstance(broker, MemoryBroker) and broker.webhooks is not None
    before = broker.memory_bytes()
    await broker.webhooks.bury(_letter("m0", 20_000))
    assert broker.memory_bytes() - before == _size("m0", 20_000)
    await broker.webhooks.revive()  # now an outbox entry: still held, as its frame
    assert broker.memory_bytes() - before == broker.webhooks.held_bytes > 20_000


async def test_a_redis_dead_list_without_its_byte_count_is_counted_again(
    redis_server: RedisServer,
) -> None:
    settings = Settings(
        broker=redis_server.url, webhooks=(URL,), webhook_max_dead=10,
        webhook_max_dead_bytes=3 * _size("old0", 1000),
    )  # fmt: skip
    broker = open_broker(settings, "alpha")
    await broker.start(Recorder())
    redis = Redis.from_url(redis_server.url)
    try:
        # Letters kept before the byte count existed: the next burial counts them first.
        for n in range(3):
            await redis.lpush(DEAD, _letter(f"old{n}", 1000).model_dump_json())
        assert await redis.get(DEAD_BYTES) is None
        store = broker.webhooks
        assert store is not None
        assert await store.bury(_letter("m0", 1000)) == 1
        assert [d.payload.id for d in await store.dead()] == ["m0", "old2", "old1"]
        assert int(await redis.get(DEAD_BYTES) or 0) == sum(
            len(item) for item in await redis.lrange(DEAD, 0, -1)
        )
    finally:
        await redis.aclose()
        await broker.close()


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_revived_letters_the_full_outbox_does_not_take_stay_dead(
    kind: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("redis_server").url if kind == "redis" else "memory://"
    broker = open_broker(Settings(broker=url, webhooks=(URL,), webhook_max_pending=1), "alpha")
    await broker.start(Recorder())
    try:
        store = broker.webhooks
        assert store is not None
        for n in range(3):
            await store.bury(_letter(f"m{n}", 100))
        assert await store.revive() == 1  # the oldest; the outbox holds one
        assert [d.payload.id for d in await store.dead()] == ["m2", "m1"]
        assert await _seen(store) == (2, _size("m1", 100) + _size("m2", 100))
    finally:
        await broker.close()
