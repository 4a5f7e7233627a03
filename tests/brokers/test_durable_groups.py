"""Appends to one stream that wait for their turn in a process on Redis are judged together on
one read and written by one script: each must be answered exactly as if it had been judged
and written alone, in the order it came.

Generated sequences of appends (plain ones, idempotent producers' with retries, stale epochs
and gaps, ``Stream-Seq`` regressions, closes, a wrong content type, empty bodies) are sent to
one path all at once, so that they queue behind each other, and once on the streams of one
process (:class:`~token_relay.core.durablestore.LocalStore`, one at a time by construction).
Every answer (what was appended, or the refusal's status and code), the stream's content and
its state must be the same. Then the bytes bound met by a group, a group racing another
process's writes, and a request that goes away while its group is being written.

``DURABLE_GROUP_EXAMPLES=N`` plays N sequences instead of the default.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from token_relay.brokers.redis import durable as redis_durable
from token_relay.brokers.redis.durable import RedisStore
from token_relay.core.durable import ENTRY_OVERHEAD, Limits
from token_relay.core.durableproducers import Producer
from token_relay.core.durablestore import Create, DurableStore, LocalStore, MemoryStore
from token_relay.core.errors import StreamRefused
from token_relay.core.settings import Settings

EXAMPLES = int(os.environ.get("DURABLE_GROUP_EXAMPLES", "40"))
TEXT = "text/plain"
JSON = "application/json"
MAX_STREAM_BYTES = 400 + 16 * ENTRY_OVERHEAD
"""Met by some generated sequences: each entry counts its data and ENTRY_OVERHEAD."""
ROOMY = 1 << 20
"""A stream bound the tests of many appends never meet."""


@st.composite
def appends(draw: st.DrawFn) -> dict[str, Any]:
    """One append's arguments."""
    kind = draw(st.sampled_from(["plain", "plain", "producer", "producer", "seq", "odd"]))
    append: dict[str, Any] = {
        "body": draw(st.sampled_from([b"ab", b"c", b"hello ", b"x" * 40])),
        "content_type": TEXT,
        "close": draw(st.integers(0, 15)) == 0,
    }
    if kind == "producer":
        producer = draw(st.sampled_from(["w", "v"]))
        append["producer"] = Producer(producer, draw(st.integers(0, 2)), draw(st.integers(0, 4)))
    elif kind == "seq":
        append["stream_seq"] = draw(st.sampled_from(["a", "b", "c", "d"]))
    elif kind == "odd":
        odd = draw(st.sampled_from(["type", "empty", "empty close"]))
        if odd == "type":
            append["content_type"] = JSON
        else:
            append["body"] = b""
            append["close"] = odd == "empty close"
    return append


def _outcome(result: Any) -> Any:
    if isinstance(result, StreamRefused):
        return ("refused", result.status, result.code)
    return ("appended", *result)


async def _play(store: DurableStore, sequence: list[dict[str, Any]]) -> dict[str, Any]:
    """Create ``/s``, send every append of ``sequence`` to it at once, and read it back."""
    await store.create("/s", Create(TEXT), 0.0)
    sends = [store.append("/s", now=1.0, **append) for append in sequence]
    results = await asyncio.gather(*sends, return_exceptions=True)
    stream = await store.get("/s", 2.0)
    chunk = await store.read(stream, 0)
    return {
        "answers": [_outcome(result) for result in results],
        "content": b"".join(chunk.entries),
        "state": (stream.tail, stream.closed, stream.last_stream_seq, stream.producers.states()),
    }


def _local() -> LocalStore:
    limits = Limits(max_bytes=MAX_STREAM_BYTES, max_producers=4)
    return LocalStore(MemoryStore(max_streams=10, max_total_bytes=1 << 20, limits=limits))


async def _redis_store(url: str, max_stream_bytes: int = MAX_STREAM_BYTES) -> RedisStore:
    client = Redis.from_url(url)
    try:
        await client.flushall()
    finally:
        await client.aclose()
    bounds = {"max_durable_stream_bytes": max_stream_bytes, "max_durable_producers": 4}
    store = RedisStore(Settings(broker=url, **bounds))
    store.max_total_bytes = 1 << 20
    return store


async def _on_redis(url: str, sequence: list[dict[str, Any]]) -> dict[str, Any]:
    store = await _redis_store(url)
    try:
        return await _play(store, sequence)
    finally:
        await store.close()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(appends(), min_size=1, max_size=24))
def test_appends_written_together_are_answered_as_one_at_a_time(
    redis_url: str, sequence: list[dict[str, Any]]
) -> None:
    alone = asyncio.run(_play(_local(), sequence))
    together = asyncio.run(_on_redis(redis_url, sequence))
    assert together == alone


def test_appends_queued_together_go_in_one_script(redis_url: str) -> None:
    """Forty appends sent at once take two COMMITs (the first alone, the rest together behind
    it), not forty, and land in the order they came."""

    async def play() -> tuple[int, bytes]:
        store = await _redis_store(redis_url, ROOMY)
        client = Redis.from_url(redis_url)
        try:
            await store.create("/s", Create(TEXT), 0.0)
            await client.config_resetstat()
            sends = [
                store.append("/s", b"%d," % n, content_type=TEXT, close=False, now=1.0)
                for n in range(40)
            ]
            await asyncio.gather(*sends)
            scripts = (await client.info("commandstats"))["cmdstat_evalsha"]["calls"]
            stream = await store.get("/s", 2.0)
            return scripts, b"".join((await store.read(stream, 0)).entries)
        finally:
            await client.aclose()
            await store.close()

    scripts, content = asyncio.run(play())
    assert content == b"".join(b"%d," % n for n in range(40))
    assert scripts == 2 * 2  # each group: one LOOKUP and one COMMIT


def test_a_group_past_the_store_bytes_is_written_one_at_a_time(redis_url: str) -> None:
    """Together the group would pass the store's bytes: each append is judged on its own,
    so those that fit land, in order, and only the rest are refused 507."""

    async def play() -> tuple[list[Any], bytes]:
        store = await _redis_store(redis_url)
        try:
            await store.create("/s", Create(TEXT), 0.0)
            store.max_total_bytes = 25 + 2 * ENTRY_OVERHEAD  # two appends of 10 bytes fit
            sends = [
                store.append("/s", b"x" * 10, content_type=TEXT, close=False, now=1.0)
                for _ in range(4)
            ]
            results = await asyncio.gather(*sends, return_exceptions=True)
            stream = await store.get("/s", 2.0)
            return [_outcome(r) for r in results], b"".join((await store.read(stream, 0)).entries)
        finally:
            await store.close()

    answers, content = asyncio.run(play())
    assert [a[0] for a in answers] == ["appended", "appended", "refused", "refused"]
    assert answers[2][1:] == (507, "store_full")
    assert content == b"x" * 20


def test_groups_racing_another_process_land_once_each(redis_url: str) -> None:
    """Two stores (two processes' worth) append to one stream at once, each in groups: every
    append lands once, each store's in the order it sent them, and every answer's position
    is where its bytes are."""

    async def play() -> tuple[bytes, list[Any]]:
        first = await _redis_store(redis_url, ROOMY)
        second = RedisStore(Settings(broker=redis_url))
        second.max_total_bytes = 1 << 20
        try:
            await first.create("/s", Create(TEXT), 0.0)
            sends = [
                store.append("/s", b"%s%02d;" % (name, n), content_type=TEXT, close=False, now=1.0)
                for n in range(30)
                for name, store in ((b"a", first), (b"b", second))
            ]
            results = await asyncio.gather(*sends)
            stream = await first.get("/s", 2.0)
            return b"".join((await first.read(stream, 0)).entries), list(results)
        finally:
            await first.close()
            await second.close()

    content, results = asyncio.run(play())
    pieces = content.split(b";")[:-1]
    assert sorted(pieces) == sorted(b"%s%02d" % (n, i) for i in range(30) for n in (b"a", b"b"))
    for name in (b"a", b"b"):
        mine = [p for p in pieces if p.startswith(name)]
        assert mine == sorted(mine)
    for index, appended in enumerate(results):
        name, n = (b"a", b"b")[index % 2], index // 2
        assert content[appended.before : appended.next] == b"%s%02d;" % (name, n)


def test_a_request_gone_while_its_group_is_written_cuts_no_other_answer_short(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request whose turn writes a group is cancelled mid-write: the group is still
    written, and every other append of it is answered and lands."""

    async def play() -> tuple[list[Any], bytes]:
        store = await _redis_store(redis_url)
        try:
            await store.create("/s", Create(TEXT), 0.0)
            started = asyncio.Event()
            judge = store._judge_and_commit

            async def slow(path: str, group: Any) -> Any:
                started.set()
                await asyncio.sleep(0.05)
                return await judge(path, group)

            monkeypatch.setattr(store, "_judge_and_commit", slow)
            first = asyncio.ensure_future(
                store.append("/s", b"first;", content_type=TEXT, close=False, now=1.0)
            )
            await started.wait()  # its group (itself alone) is being written
            rest = [
                asyncio.ensure_future(
                    store.append("/s", b"%d;" % n, content_type=TEXT, close=False, now=1.0)
                )
                for n in range(5)
            ]
            await asyncio.sleep(0)
            first.cancel()
            results = await asyncio.gather(*rest)
            await asyncio.sleep(0.1)
            stream = await store.get("/s", 2.0)
            return list(results), b"".join((await store.read(stream, 0)).entries)
        finally:
            await store.close()

    results, content = asyncio.run(play())
    # The cancelled request's group and the next one raced each other (one was judged
    # again): each landed once, the next one's in order.
    assert content.count(b"first;") == 1
    assert content.replace(b"first;", b"") == b"0;1;2;3;4;"
    assert [content[r.before : r.next] for r in results] == [b"%d;" % n for n in range(5)]


def test_the_group_bounds_hold() -> None:
    """A group takes at most MAX_GROUP appends and MAX_GROUP_BYTES of bodies (one larger
    body goes alone), in order, and leaves the rest waiting."""
    from collections import deque

    class Waiting:
        def __init__(self, size: int) -> None:
            self.body = b"x" * size

    waiting: Any = deque(Waiting(10) for _ in range(redis_durable.MAX_GROUP + 5))
    first = redis_durable._group(waiting)
    assert len(first) == redis_durable.MAX_GROUP and len(waiting) == 5
    big = redis_durable.MAX_GROUP_BYTES
    waiting = deque([Waiting(big + 1), Waiting(1), Waiting(big), Waiting(1)])
    assert [len(w.body) for w in redis_durable._group(waiting)] == [big + 1]
    assert [len(w.body) for w in redis_durable._group(waiting)] == [1]
    assert [len(w.body) for w in redis_durable._group(waiting)] == [big]
    assert len(waiting) == 1
