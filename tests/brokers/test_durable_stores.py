"""The same scenarios against every durable store behind the async contract: the streams of
one process (``LocalStore``) and the streams in a real ``redis-server`` (``RedisStore``)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from token_relay.brokers.redis.durable import RedisStore
from token_relay.core.durable import ENTRY_OVERHEAD, Expiry, Limits
from token_relay.core.durableproducers import Producer
from token_relay.core.durablestore import Create, DurableStore, LocalStore, MemoryStore
from token_relay.core.errors import StreamRefused
from token_relay.core.settings import Settings

from ..harness import RedisServer

TEXT = "text/plain"
JSON = "application/json"
MAX_STREAM_BYTES = 20 + 2 * ENTRY_OVERHEAD
"""Two entries and 20 bytes of data (each entry counts its data and ENTRY_OVERHEAD)."""
BOUNDS: dict[str, Any] = {
    "max_durable_streams": 3,
    "max_durable_stream_bytes": MAX_STREAM_BYTES,
    "max_durable_producers": 4,
}


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[DurableStore]:
    if request.param == "memory":
        yield LocalStore(
            MemoryStore(
                max_streams=3,
                max_total_bytes=1000,
                limits=Limits(max_bytes=MAX_STREAM_BYTES, max_producers=4),
            )
        )
        return
    redis = RedisServer(tmp_path)
    redis.start()
    made = RedisStore(Settings(broker=redis.url, **BOUNDS))
    made.max_total_bytes = 1000
    try:
        yield made
    finally:
        await made.close()
        redis.kill()


async def _refused(call: Any, *args: Any, **kwargs: Any) -> StreamRefused:
    with pytest.raises(StreamRefused) as refused:
        await call(*args, **kwargs)
    return refused.value


async def _text(store: DurableStore, path: str, position: int = 0) -> bytes:
    stream = await store.get(path, 0.0)
    return b"".join((await store.read(stream, position)).entries)


async def test_a_fork_reads_its_source_and_keeps_it_as_a_tombstone(store: DurableStore) -> None:
    await store.create("/s", Create(TEXT, body=b"abc"), 0.0)
    await store.create("/f", Create(TEXT, forked_from="/s", body=b"de"), 0.0)
    await store.append("/s", b"xyz", content_type=TEXT, close=False, now=0.0)
    assert await _text(store, "/f") == b"abcde"
    assert await _text(store, "/f", 2) == b"cde"
    assert await _text(store, "/s") == b"abcxyz"
    await store.delete("/s", 0.0)
    assert (await _refused(store.get, "/s", 0.0)).status == 410
    assert (await _refused(store.create, "/s", Create(TEXT), 0.0)).code == "stream_gone"
    assert await _text(store, "/f") == b"abcde"
    assert len(store) == 2
    await store.delete("/f", 0.0)
    await store.expire(0.0)  # a shared store counts again as it sweeps
    assert (len(store), store.total_bytes) == (0, 0)
    assert (await store.create("/s", Create(TEXT), 0.0)).created  # the path is free again


async def test_a_sliding_ttl_is_kept_by_reads_and_the_sweep_drops_the_stream(
    store: DurableStore,
) -> None:
    # Times from now on: Redis expires a stream's keys by its own clock, a minute after.
    start = time.time()
    await store.create("/t", Create(TEXT, expiry=Expiry(ttl=10), body=b"ab"), start)
    await store.get("/t", start + 5, touch=True)  # slides to 15
    assert await store.expire(start + 14) == []
    assert (await store.get("/t", start + 14)).tail == 2
    assert await store.expire(start + 15) == ["/t"]
    assert (await _refused(store.get, "/t", start + 15)).status == 404
    assert (len(store), store.total_bytes) == (0, 0)


async def test_bounds_refuse_and_change_nothing(store: DurableStore) -> None:
    await store.create("/a", Create(TEXT, body=b"x" * 15), 0.0)
    full = await _refused(store.append, "/a", b"y" * 6, content_type=TEXT, close=False, now=0.0)
    assert (full.status, full.code) == (413, "stream_full")
    await store.create("/b", Create(TEXT), 0.0)
    await store.create("/c", Create(TEXT), 0.0)
    many = await _refused(store.create, "/d", Create(TEXT), 0.0)
    assert (many.status, many.code) == (507, "too_many_streams")
    store.max_total_bytes = 18 + 2 * ENTRY_OVERHEAD
    total = await _refused(store.append, "/b", b"z" * 4, content_type=TEXT, close=False, now=0.0)
    assert (total.status, total.code) == (507, "store_full")
    assert (await store.get("/b", 0.0)).tail == 0
    assert store.total_bytes == 15 + ENTRY_OVERHEAD


async def test_producers_and_closure_are_kept_with_the_stream(store: DurableStore) -> None:
    await store.create("/p", Create("application/json"), 0.0)

    async def send(epoch: int, seq: int, body: bytes = b"[1]", close: bool = False) -> Any:
        return await store.append(
            "/p",
            body,
            content_type="application/json",
            close=close,
            now=0.0,
            producer=Producer("w", epoch, seq),
        )

    assert not (await send(0, 0)).duplicate
    assert (await send(0, 0)).duplicate
    assert (await _refused(send, 0, 2)).code == "producer_seq_gap"
    assert (await send(1, 0, b"[2]", close=True)).closed
    assert (await _refused(send, 0, 1)).code == "stream_closed"  # closure is judged first
    assert (await send(1, 0, b"[2]", close=True)).duplicate  # the closing write, retried
    stream = await store.get("/p", 0.0)
    assert (stream.tail, stream.closed) == (2, True)


async def test_a_stream_whose_keys_redis_expired_first_leaves_the_counts_at_the_sweep(
    tmp_path: Any,
) -> None:
    redis = RedisServer(tmp_path)
    redis.start()
    store = RedisStore(Settings(broker=redis.url, **BOUNDS))
    client = Redis.from_url(redis.url)
    try:
        start = time.time()
        await store.create("/src", Create(TEXT, body=b"abc"), start)
        made = Create(TEXT, expiry=Expiry(ttl=10), forked_from="/src", body=b"de")
        fork = (await store.create("/fork", made, start)).stream
        await store.delete("/src", start)  # a tombstone: the fork reads it
        assert (len(store), store.total_bytes) == (2, 5 + 2 * ENTRY_OVERHEAD)
        # As if no relay swept within the minute of grace: Redis forgot the fork's keys.
        removed = await client.delete(
            "tr:ds:p:/fork", *(f"tr:ds:{kind}:{fork.stream_id}" for kind in "sla")
        )
        assert removed == 4
        assert await store.expire(start + 100) == []  # nothing left to wake anyone about
        assert (len(store), store.total_bytes) == (0, 0)  # the tombstone went with it
        assert await client.keys("tr:ds:[psla]:*") == []
    finally:
        await client.aclose()
        await store.close()
        redis.kill()


async def test_an_append_tells_the_tail_it_found(store: DurableStore) -> None:
    await store.create("/t", Create(TEXT, body=b"abc"), 0.0)
    first = await store.append("/t", b"de", content_type=TEXT, close=False, now=0.0)
    assert (first.before, first.next) == (3, 5)
    closed = await store.append("/t", b"", content_type=TEXT, close=True, now=0.0)
    assert (closed.before, closed.next, closed.closed, closed.duplicate) == (5, 5, True, False)
    again = await store.append("/t", b"", content_type=TEXT, close=True, now=0.0)
    assert (again.before, again.next, again.duplicate) == (5, 5, True)


async def test_many_tiny_messages_count_their_overhead_and_are_refused(
    store: DurableStore,
) -> None:
    """A JSON-array body appends one entry per element, each counted with ENTRY_OVERHEAD:
    20 tiny messages are 20 bytes of data, under the stream's bound as data alone, and
    20 * (1 + ENTRY_OVERHEAD) counted, past it. Refused whole; nothing changes."""
    body = b"[" + b",".join([b"1"] * 20) + b"]"
    assert 20 <= MAX_STREAM_BYTES < 20 * (1 + ENTRY_OVERHEAD)
    made = await _refused(store.create, "/c", Create(JSON, body=body), 0.0)
    assert (made.status, made.code) == (413, "stream_full")
    await store.create("/j", Create(JSON), 0.0)
    full = await _refused(store.append, "/j", body, content_type=JSON, close=False, now=0.0)
    assert (full.status, full.code) == (413, "stream_full")
    assert ((await store.get("/j", 0.0)).tail, store.total_bytes) == (0, 0)
    # What is written counts the same in either store: data and overhead per entry.
    appended = await store.append("/j", b"[1,2]", content_type=JSON, close=False, now=0.0)
    assert appended.added_bytes == store.total_bytes == 2 * (1 + ENTRY_OVERHEAD)
    await store.create("/k", Create(JSON, body=b"[3]"), 0.0)
    assert store.total_bytes == 3 * (1 + ENTRY_OVERHEAD)
    # Room for one byte of data, not for its entry: the store's total refuses it.
    store.max_total_bytes = store.total_bytes + ENTRY_OVERHEAD
    total = await _refused(store.append, "/k", b"[4]", content_type=JSON, close=False, now=0.0)
    assert (total.status, total.code) == (507, "store_full")
    assert ((await store.get("/k", 0.0)).tail, store.total_bytes) == (1, 3 * (1 + ENTRY_OVERHEAD))
    assert await _text(store, "/j") == b"12"
