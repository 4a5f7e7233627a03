"""A structured message's log in Redis (brokers/redis/partlog.py): its layout, read back
exactly, its entries joined into one script per run, catch-up skipping it, and its bound."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from token_relay.brokers import open_broker
from token_relay.brokers.redis import RedisBroker, partlog
from token_relay.core.parts import MessageParts
from token_relay.core.settings import Settings

from ..harness import RedisServer
from .test_contract import Recorder


@pytest.fixture
async def broker(redis_server: RedisServer) -> AsyncIterator[RedisBroker]:
    opened = open_broker(Settings(broker=redis_server.url), "alpha")
    assert isinstance(opened, RedisBroker)
    await opened.start(Recorder())
    try:
        yield opened
    finally:
        await opened.close()


async def _value(url: str, member: str) -> bytes | None:
    redis = Redis.from_url(url)
    try:
        value = await redis.get(f"tr:text:{member}")
        return value if value is None else bytes(value)
    finally:
        await redis.aclose()


async def test_the_log_keeps_the_text_before_and_each_entry_in_order(
    broker: RedisBroker, redis_server: RedisServer
) -> None:
    broker.open("c", "alpha.1", "m")
    broker.delta("c", "alpha.1", "m", "Hi \x1e|:")  # plain text may hold any character
    await broker.flush_writes()
    reasoning = {"type": "reasoning-start", "id": "r"}
    broker.part("c", "alpha.1", "m", reasoning, 2, convert="1")
    broker.part("c", "alpha.1", "m", {"type": "reasoning-delta", "id": "r", "delta": "é"}, 3)
    broker.part("c", "alpha.1", "m", "half \ud83d", 4)  # a lone surrogate, kept as JSON
    await broker.flush_writes()
    value = await _value(redis_server.url, "alpha.1|m")
    assert value is not None and value[:1] == b"\xff"
    assert partlog.read_value(value) == partlog.PartLog(
        True,
        "Hi \x1e|:",
        [reasoning, {"type": "reasoning-delta", "id": "r", "delta": "é"}, "half \ud83d"],
    )
    # A joiner gets it rebuilt from the log and compacted; a plain message beside it as text.
    broker.open("c", "alpha.1", "p")
    broker.delta("c", "alpha.1", "p", "plain")
    cut = await broker.catch_up("c", None, True)
    live = {message.message_id: message for message in cut.live}
    assert (live["p"].text, live["p"].chunks) == ("plain", None)
    expected = MessageParts()
    expected.delta("Hi \x1e|:")
    expected.apply(reasoning)
    expected.apply({"type": "reasoning-delta", "id": "r", "delta": "é"})
    expected.delta("half \ud83d")
    assert live["m"].text == "Hi \x1e|:half " == expected.text()
    assert live["m"].chunks == expected.catch_up()
    assert live["m"].chunks[0] == {"type": "text-start", "id": "text"}


async def test_a_message_opened_by_its_first_chunk_has_no_implicit_text(
    broker: RedisBroker, redis_server: RedisServer
) -> None:
    broker.open("c", "alpha.1", "m")
    broker.part("c", "alpha.1", "m", {"type": "start-step"}, convert="0")
    broker.part("c", "alpha.1", "m", "x")
    await broker.flush_writes()
    value = await _value(redis_server.url, "alpha.1|m")
    assert value == b"\xff00:\x1e" + b'{"type":"start-step"}' + b'\x1e"x"'
    assert partlog.read_value(value) == partlog.PartLog(False, "", [{"type": "start-step"}, "x"])


async def test_a_run_of_entries_is_one_script_and_an_entry_never_joins_a_plain_run(
    broker: RedisBroker,
) -> None:
    target = ("c", "alpha.1", "m")
    broker.open(*target)
    broker.delta(*target, "plain")
    broker.part(*target, {"type": "start-step"}, convert="1")
    for n in range(5):
        broker.part(*target, str(n))
    queued = list(broker._pipeline.queue)
    assert [write.script for write in queued] == ["open", "part"]
    assert queued[0].parts == ["", "plain"]
    assert queued[1].entries == [partlog.chunk_entry({"type": "start-step"})] + [
        partlog.delta_entry(str(n)) for n in range(5)
    ]
    await broker.flush_writes()


async def test_a_log_past_its_bound_is_cut_and_grows_no_more(
    broker: RedisBroker, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from token_relay.brokers.redis import writes

    monkeypatch.setattr(writes, "MAX_LOG_BYTES", 40)
    broker.open("c", "alpha.1", "m")
    broker.delta("c", "alpha.1", "m", "before")
    broker.part("c", "alpha.1", "m", "0123456789", convert="1")
    await broker.flush_writes()
    broker.part("c", "alpha.1", "m", "0123456789" * 3)
    await broker.flush_writes()
    cut = await _value(redis_server.url, "alpha.1|m")
    assert cut is not None
    assert partlog.read_value(cut) == partlog.PartLog(False, "before", [], cut=True)
    broker.part("c", "alpha.1", "m", "more")
    await broker.flush_writes()
    assert await _value(redis_server.url, "alpha.1|m") == cut


async def test_a_log_missing_an_entry_is_cut_by_the_next(
    broker: RedisBroker, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker.open("c", "alpha.1", "m")
    broker.part("c", "alpha.1", "m", {"type": "start-step"}, convert="0")
    await broker.flush_writes()
    pipeline = broker._pipeline  # type: ignore[attr-defined]
    with monkeypatch.context() as patched:
        patched.setattr(pipeline, "enqueue", lambda write, target: False)  # the queue is full
        broker.part("c", "alpha.1", "m", "lost")
    broker.part("c", "alpha.1", "m", "after")
    await broker.flush_writes()
    value = await _value(redis_server.url, "alpha.1|m")
    assert value is not None
    assert partlog.read_value(value) == partlog.PartLog(False, "", [], cut=True)
    # Its terminal write forgets it.
    await broker.terminal(
        "c", "alpha.1", "m", '{"type":"message","channel":"c","id":"m","text":""}'
    )
    assert pipeline.broken_logs == set()
