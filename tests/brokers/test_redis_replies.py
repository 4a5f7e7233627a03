"""Replies read in a burst are taken from hiredis's parsed replies, in order, each exactly
once, without a pass through redis-py's layers each: the pub/sub reader's messages (anything
else still goes through redis-py) and the writer's pipeline replies (error replies in their
places)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import hiredis
import pytest
from redis import exceptions as redis_errors
from redis._parsers import _AsyncHiredisParser
from redis.asyncio import Redis
from token_relay.brokers import open_broker
from token_relay.brokers.redis import RedisBroker, pipeline
from token_relay.brokers.redis.connections import Connections
from token_relay.brokers.redis.health import Health
from token_relay.brokers.redis.partlog import delta_entry
from token_relay.brokers.redis.pipeline import _reply
from token_relay.brokers.redis.reader import Reader
from token_relay.brokers.redis.replies import NOT_ENOUGH_DATA, buffered
from token_relay.core.errors import BrokerUnavailable
from token_relay.core.events import FrameKind
from token_relay.core.settings import Settings

from ..harness import RedisServer
from .test_contract import Recorder, message_body, until


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(data), data)


def _message(topic: bytes, data: bytes, resp3: bool) -> bytes:
    """A channel's message as Redis sends it: a RESP3 push, or a RESP2 array."""
    return (b">3\r\n" if resp3 else b"*3\r\n") + _bulk(b"message") + _bulk(topic) + _bulk(data)


def _reading(wire: bytes) -> tuple[Reader, Recorder, Any]:
    """A reader whose pub/sub connection has read ``wire`` (parsed by hiredis, as redis-py
    parses it) and not taken any of it yet."""
    parser = SimpleNamespace(_reader=hiredis.Reader(notEnoughData=NOT_ENOUGH_DATA))
    parser._reader.feed(wire)
    pubsub = SimpleNamespace(connection=SimpleNamespace(_parser=parser))
    reader, recorder = Reader(Connections("redis://unused"), Health(), "here"), Recorder()
    reader.listener = recorder
    return reader, recorder, pubsub


def test_a_burst_is_taken_in_order_up_to_the_first_reply_that_is_not_a_message() -> None:
    frames = [b't|%d|{"n":%d}' % (n, n) for n in range(1, 7)]
    wire = b"".join(_message(b"tr:m:c", frame, n % 2 == 0) for n, frame in enumerate(frames[:4]))
    wire += b"*3\r\n" + _bulk(b"subscribe") + _bulk(b"tr:m:other") + b":2\r\n"
    wire += b"".join(_message(b"tr:m:c", frame, True) for frame in frames[4:])
    wire += _message(b"tr:m:c", b"t|7|{", True)[:-3]  # the next one, not read whole yet
    reader, recorder, pubsub = _reading(wire)

    other = reader._take_buffered(pubsub, b"tr:i:here")
    assert list(other) == [b"subscribe", b"tr:m:other", 2]  # left for redis-py's bookkeeping
    assert [(channel, kind, seq) for channel, kind, seq, _ in recorder.frames] == [
        ("c", FrameKind.TERMINAL, n) for n in range(1, 5)
    ]
    assert reader._take_buffered(pubsub, b"tr:i:here") is None
    assert [text for _, _, _, text in recorder.frames] == [f'{{"n":{n}}}' for n in range(1, 7)]
    assert reader._take_buffered(pubsub, b"tr:i:here") is None  # nothing taken twice


def test_a_note_to_this_process_and_a_delta_read_in_a_burst_are_taken_as_one_at_a_time() -> None:
    wire = _message(b"tr:i:here", b'c|owner.1|{"type":"cancel"}', True)
    wire += _message(b"tr:d:c", b"d|3|1|mhello", True)
    reader, recorder, pubsub = _reading(wire)
    assert reader._take_buffered(pubsub, b"tr:i:here") is None
    assert recorder.cancels == [("owner.1", '{"type":"cancel"}')]
    delta = '{"type":"delta","channel":"c","id":"m","delta":"hello"}'
    assert recorder.frames == [("c", FrameKind.DELTA, 3, delta)]


@pytest.mark.parametrize("reply", [b"-ERR wrong\r\n", b"+PONG\r\n"])
def test_an_error_or_a_pong_is_never_taken_as_a_message(reply: bytes) -> None:
    reader, recorder, pubsub = _reading(_message(b"tr:m:c", b"t|1|{}", True) + reply)
    other = reader._take_buffered(pubsub, b"tr:i:here")
    assert other is not None and not isinstance(other, list)
    assert len(recorder.frames) == 1


Started = tuple[RedisBroker, Recorder, Redis]


@pytest.fixture
async def started(redis_server: RedisServer) -> AsyncIterator[Started]:
    """A Redis broker started on a private ``redis-server``, what it hands its listener, and
    a plain client of the test's own."""
    broker = open_broker(Settings(broker=redis_server.url), "alpha")
    assert isinstance(broker, RedisBroker)
    recorder = Recorder()
    await broker.start(recorder)
    client = Redis.from_url(redis_server.url)
    try:
        yield broker, recorder, client
    finally:
        await client.aclose()
        await broker.close()


async def test_the_installed_redis_py_lends_the_reader_its_parsed_replies(
    started: Started,
) -> None:
    pubsub = started[0]._reader._pubsub
    assert buffered(pubsub.connection) is not None, "redis-py no longer parses with hiredis here"


async def test_a_burst_over_a_real_socket_arrives_whole_in_order_with_a_subscribe_amid_it(
    started: Started,
) -> None:
    broker, recorder, publisher = started
    await broker.listen("c", True, True)
    pubsub = broker._reader._pubsub
    reads = 0
    get_message = pubsub.get_message

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await get_message(*args, **kwargs)

    pubsub.get_message = counted
    burst = 500

    async def publish(first: int) -> None:
        async with publisher.pipeline(transaction=False) as pipe:
            for n in range(first, first + burst // 2):
                pipe.publish("tr:m:c", f't|{n}|{{"n":{n}}}')
            await pipe.execute()

    # A subscription is confirmed amid the burst: its reply goes through redis-py.
    subscribing = asyncio.ensure_future(broker.listen("other", True, False))
    await publish(1)
    await publish(251)
    await subscribing
    await until(lambda: len(recorder.frames) >= burst)
    assert [seq for _, _, seq, _ in recorder.frames] == list(range(1, burst + 1))
    assert [text for _, _, _, text in recorder.frames][-1] == f'{{"n":{burst}}}'
    assert reads < burst // 5  # most messages were taken from the burst they came in
    await publisher.publish("tr:m:other", 't|1|{"n":0}')  # the subscription took effect
    await until(lambda: len(recorder.frames) > burst)
    assert recorder.frames[-1][0] == "other"


def _connection(wire: bytes) -> Any:
    """A connection whose replies hiredis has parsed from ``wire`` as redis-py's parser
    would (its error replies as redis-py's exceptions), none taken yet; reading more from
    it fails the test."""
    errors = _AsyncHiredisParser(65536).parse_error
    reader = hiredis.Reader(notEnoughData=NOT_ENOUGH_DATA, replyError=errors)
    reader.feed(wire)

    async def read_response() -> Any:
        raise AssertionError("read from the socket, with replies parsed already")

    return SimpleNamespace(_parser=SimpleNamespace(_reader=reader), read_response=read_response)


async def test_a_pipelines_replies_read_at_once_are_taken_in_order_errors_in_their_places() -> None:
    wire = b":1\r\n-NOSCRIPT No matching script.\r\n*2\r\n$2\r\n{}\r\n:1\r\n"
    wire += b"-ERR wrong\r\n:0\r\n"
    connection = _connection(wire)
    replies = [await _reply(connection) for _ in range(5)]
    assert replies[0] == 1 and replies[2] == [b"{}", 1] and replies[4] == 0
    assert isinstance(replies[1], redis_errors.NoScriptError)
    assert type(replies[3]) is redis_errors.ResponseError


async def test_a_reply_not_read_whole_yet_is_read_through_redis_py() -> None:
    connection = _connection(b":7\r\n$5\r\nhel")
    assert await _reply(connection) == 7
    with pytest.raises(AssertionError, match="read from the socket"):
        await _reply(connection)


async def test_a_script_flushed_from_redis_is_loaded_again_for_a_whole_pipeline(
    started: Started,
) -> None:
    broker, recorder, admin = started
    await broker.listen("c", True, False)
    await admin.script_flush()
    # One pass of the loop: every write goes in one pipeline, each refused NOSCRIPT.
    ends = []
    for n in range(6):
        broker.open("c", "alpha.1", f"m{n}")
        broker.delta("c", "alpha.1", f"m{n}", f"text {n}")
        ends.append(broker.terminal("c", "alpha.1", f"m{n}", message_body("c", f"m{n}", "x")))
    frames = [json.loads(frame) for frame in await asyncio.gather(*ends)]
    assert [frame["offset"] for frame in frames] == list(range(1, 7))
    assert [frame["id"] for frame in frames] == [f"m{n}" for n in range(6)]
    await until(lambda: len(recorder.frames) == 6)
    assert [json.loads(text)["id"] for _, _, _, text in recorder.frames] == [
        f"m{n}" for n in range(6)
    ]


async def test_the_write_queue_is_bounded_and_a_write_past_it_is_refused_or_resynced(
    started: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = started[0]
    monkeypatch.setattr(pipeline, "MAX_QUEUE", 3)
    writes = broker._pipeline
    # Nothing awaited: the writer takes none of them meanwhile.
    for n in range(3):
        broker.open("c", "alpha.1", f"m{n}")
    assert len(writes.queue) == 3 and writes.full() and not writes.has_room()
    broker.delta("c", "alpha.1", "late", "x")  # no room: its message resynced later
    assert len(writes.queue) == 3 and ("c", "alpha.1", "late") in writes.dirty
    with pytest.raises(BrokerUnavailable, match="queue of writes to Redis is full"):
        writes.put(writes.queue[0])
    refused = broker.terminal("c", "alpha.1", "m0", message_body("c", "m0", ""))
    with pytest.raises(BrokerUnavailable):
        await refused
    await until(lambda: not writes.queue)  # the writer took the three
    assert writes.has_room()


async def test_the_messages_marked_for_a_resync_stay_within_twice_those_in_progress(
    started: Started, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While Redis is down, each message opened is marked for a resync; those that ended
    meanwhile are forgotten as the set grows, those in progress are kept, and once Redis is
    back each of them is rewritten whole."""
    broker, recorder, client = started
    writes = broker._pipeline
    monkeypatch.setattr(pipeline, "MAX_DIRTY", 100)
    writes._dirty_bound = 100
    redis_server.kill()
    await until(lambda: not broker.healthy, 10)
    live: set[tuple[str, str, str]] = set()
    for n in range(5_000):
        message_id = f"m{n}"
        if n % 50 == 0:  # one in fifty still in progress here; the rest ended meanwhile
            recorder.texts[("p.1", message_id)] = f"text of {message_id}"
            live.add(("c", "p.1", message_id))
        broker.open("c", "p.1", message_id)  # not queued: marked for a resync
        assert len(writes.dirty) <= max(100, 2 * len(live))
    assert live <= writes.dirty
    redis_server.start()
    await until(lambda: broker.healthy and not writes.dirty, 15)  # each resynced
    await writes.flush_writes()
    for _, owner, message_id in live:
        assert await client.get(f"tr:text:{owner}|{message_id}") == f"text of {message_id}".encode()


async def test_each_write_counts_the_text_it_carries_until_the_writer_settled_it(
    started: Started,
) -> None:
    broker, recorder, _ = started
    writes = broker._pipeline
    held = writes.held
    # Nothing awaited: the writer takes none of them meanwhile.
    broker.open("c", "p.1", "a")
    broker.delta("c", "p.1", "a", "hello ")  # joins its open
    broker.delta("c", "p.1", "a", "world")
    assert held.chars == 11
    broker.meta("c", "p.1", "a", '{"k":1}')
    broker.delta("c", "p.1", "a", "!")  # a run of its own, after the meta
    expected = 11 + len('{"k":1}') + 1
    assert held.chars == expected
    body = message_body("c", "a", "hello world!")
    completed = broker.terminal("c", "p.1", "a", body)
    expected += len(body)
    broker.open("c", "p.1", "w")
    broker.delta("c", "p.1", "w", "abc")
    whole_body = message_body("c", "w", "abc")
    joined = broker.terminal("c", "p.1", "w", whole_body)  # WHOLE, in its open's place
    expected += 3 + len(whole_body)
    one_shot_body = message_body("c", "o", "one shot")
    one_shot = broker.whole("c", "anon", "o", "one shot", one_shot_body)
    expected += len("one shot") + len(one_shot_body)
    entry = delta_entry("part text")
    broker.part("c", "p.1", "s", "part text", live=[{"type": "text-delta", "delta": "x"}])
    expected += 2 * len(entry)  # its log entry, and its chunks counted as long
    writes.dirty.add(("c", "p.1", "r"))
    recorder.texts[("p.1", "r")] = "resynced text"
    broker.delta("c", "p.1", "r", "text")  # a resync: its whole text and its snapshot
    resync = writes.queue[-1]
    assert resync.script == "resync"
    expected += len("resynced text") + len(resync.args[2])
    assert held.chars == expected
    assert broker.memory_bytes() == expected  # the outbox holds nothing
    assert one_shot is not None
    await asyncio.gather(completed, joined, one_shot)
    await writes.flush_writes()
    assert not writes.queue and held.chars == 0
    assert broker.memory_bytes() == 0


async def test_a_stalled_redis_queues_at_most_its_bound_of_text_and_no_text_is_lost(
    started: Started, redis_server: RedisServer
) -> None:
    """While Redis answers nothing, the writes queued for it stop at the bound in
    characters (the one that crosses it is the last taken); what comes after is refused:
    deltas mark their message for a resync, a final gets ``broker_unavailable``. Once Redis
    answers, every message's text in Redis is whole and exact."""
    broker, recorder, client = started
    writes = broker._pipeline
    held = writes.held
    held.limit = 200_000
    chunk = "x" * 10_000
    texts: dict[str, str] = {}
    assert redis_server.process is not None
    redis_server.process.send_signal(signal.SIGSTOP)  # alive, but answers nothing
    try:
        broker.open("c", "p.1", "m0")
        broker.delta("c", "p.1", "m0", chunk)
        texts["m0"] = recorder.texts[("p.1", "m0")] = chunk
        await until(lambda: not writes.queue)  # the writer took it, and waits for Redis
        assert held.chars == len(chunk) and broker.memory_bytes() == len(chunk)
        # Nothing awaited from here: Redis's probe cannot run either.
        for n in range(1, 40):
            message_id = f"m{n}"
            broker.open("c", "p.1", message_id)
            for k in range(3):
                delta = f"{n}.{k}:" + chunk
                texts[message_id] = texts.get(message_id, "") + delta
                recorder.texts[("p.1", message_id)] = texts[message_id]  # as assembled
                broker.delta("c", "p.1", message_id, delta)
        assert held.limit <= held.chars < held.limit + len(chunk) + 10
        assert broker.memory_bytes() == held.chars
        refused = {message_id for _, _, message_id in writes.dirty}
        assert {f"m{n}" for n in range(25, 40)} <= refused  # the bound came before them
        assert not writes.has_room() and writes.full()
        final = broker.terminal("c", "p.1", "m1", message_body("c", "m1", texts["m1"]))
        assert final.done()
        with pytest.raises(BrokerUnavailable):
            final.result()
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
    await until(lambda: not writes.queue and held.chars == 0 and writes.has_room(), 15)
    await until(lambda: broker.healthy, 15)
    for message_id in texts:  # each message's next delta: a resync where one is due
        await until(writes.has_room)  # resyncs are bounded too: each waits for room
        texts[message_id] += "!"
        recorder.texts[("p.1", message_id)] = texts[message_id]
        broker.delta("c", "p.1", message_id, "!")
    await until(lambda: not writes.dirty and held.chars == 0 and writes.has_room())
    await writes.flush_writes()
    stored = {message_id: await client.get(f"tr:text:p.1|{message_id}") for message_id in texts}
    assert stored == {message_id: text.encode() for message_id, text in texts.items()}
