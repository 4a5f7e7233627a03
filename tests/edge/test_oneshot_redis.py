"""On Redis, a one-shot ``POST /produce`` is answered exactly as the general path, and keeps
nothing per owner in Redis.

The requests of :mod:`tests.edge.test_oneshot` (one-shot messages and everything near them)
are played through an :class:`~token_relay.edge.connection.HttpConnection` of a real relay
on a real ``redis-server``, with a deltas subscriber on the channel: once with one-shot
messages taken whole (one script each), once with every request on the general path (a
producer session saved in Redis, its writes, its end). The bytes written back to every
request, every frame the subscriber was sent, the channel's history and messages in
progress, the relay's counters and the names of the keys left in Redis must be the same.

Then the faults: Redis's connections cut while a one-shot message's script is on its way
(both paths answer ``broker_unavailable`` and publish the message once Redis is back), and
Redis gone before the request (the general path answers it).

``ONESHOT_REDIS_EXAMPLES=N`` plays N sequences instead of the default.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from token_relay import Relay, Settings
from token_relay.edge.connection import HttpConnection

from tests.conftest import NO_SWEEPS
from tests.edge.played import connection as _connection
from tests.edge.test_http11 import FakeTransport
from tests.edge.test_oneshot import (
    MAX_CHARS,
    NEAR,
    SUBSCRIBE,
    _counters,
    _post,
    requests,
)
from tests.harness import RedisServer

EXAMPLES = int(os.environ.get("ONESHOT_REDIS_EXAMPLES", "40"))
WAIT = 10.0
"""Seconds anything awaited here may take before the test fails."""


def _responses(data: bytes) -> tuple[int, bool]:
    """How many whole HTTP responses ``data`` holds, and whether the last closes its
    connection."""
    count, at, closing = 0, 0, False
    while (end := data.find(b"\r\n\r\n", at)) >= 0:
        head = data[at:end].lower()
        length = re.search(rb"\r\ncontent-length: (\d+)", head)
        after = end + 4 + (int(length.group(1)) if length else 0)
        if len(data) < after:
            break
        count, closing, at = count + 1, b"\r\nconnection: close" in head, after
    return count, closing


async def _until(done: Callable[[], bool], what: str) -> None:
    """Wait (polling) until ``done()``; fail the test after :data:`WAIT` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not done():
        assert loop.time() < deadline, f"waited {WAIT} s for {what}"
        await asyncio.sleep(0.002)


async def _answered(transport: FakeTransport, requests: int) -> bytes:
    """Every answer of ``requests`` requests sent on one connection (fewer if one closed it)."""

    def done() -> bool:
        count, closing = _responses(bytes(transport.written))
        return count >= requests or closing or transport.closing

    await _until(done, "the answers")
    return bytes(transport.written)


async def _keys(url: str, instance: str) -> list[str]:
    """The names of the keys in Redis, the relay process's own name read as ``I``."""
    client = aioredis.Redis.from_url(url)
    try:
        return sorted(key.decode().replace(instance, "I") for key in await client.keys("*"))
    finally:
        await client.aclose()


async def _flush(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.flushall()
    finally:
        await client.aclose()


async def _started(url: str, one_shot: bool, **overrides: Any) -> tuple[Relay, FakeTransport]:
    """A relay on Redis at ``url`` (emptied first), with a deltas subscriber on ``c``."""
    await _flush(url)
    relay = Relay(
        Settings(
            port=0,
            broker=url,
            max_message_chars=MAX_CHARS,
            id_hold=60.0,
            max_body_bytes=4096,
            **{**NO_SWEEPS, **overrides},
        )
    )
    await relay.start()
    relay.producers.one_shot = one_shot
    subscriber, seen = _connected(relay)
    subscriber.data_received(SUBSCRIBE)
    await _until(lambda: b'"subscribed"' in seen.written, "the subscription")
    return relay, seen


OPENED: list[HttpConnection] = []
"""The connections the test opened, closed before its relay stops (or it would wait
``--shutdown-timeout`` for them)."""


def _connected(relay: Relay) -> tuple[HttpConnection, FakeTransport]:
    connection, transport = _connection(relay)
    OPENED.append(connection)
    return connection, transport


async def _stopped(relay: Relay) -> None:
    """Close the test's connections, then stop the relay."""
    while OPENED:
        OPENED.pop().connection_lost(None)
    await relay.stop()


async def _state(relay: Relay, url: str, seen: FakeTransport) -> dict[str, Any]:
    """What the relay and Redis show once everything queued has been published."""
    await relay.broker.flush_writes()
    await relay.broker.flush()
    cut = await relay.broker.catch_up("c", None, live=True, rewind=1000)
    epoch = cut.epoch.encode()
    _, _, frames = bytes(seen.written).partition(b"\r\n\r\n")  # after the 101 (its Date)
    return {
        "subscriber": frames.replace(epoch, b"E"),
        "history": [frame.replace(cut.epoch, "E") for frame in cut.frames],
        # Redis lists messages in progress in its set's order, which owes nothing to them.
        "live": sorted((m.message_id, m.text) for m in cut.live),
        "counters": _counters(relay),
        "keys": await _keys(url, relay.broker.instance),
    }


async def _play(url: str, one_shot: bool, sequence: list[bytes], together: bool) -> dict[str, Any]:
    relay, seen = await _started(url, one_shot)
    try:
        answers: list[bytes] = []
        if together:  # pipelined on one connection
            connection, transport = _connected(relay)
            connection.data_received(b"".join(sequence))
            answers.append(await _answered(transport, len(sequence)))
        else:
            for request in sequence:
                connection, transport = _connected(relay)
                connection.data_received(request)
                answers.append(await _answered(transport, 1))
        return {"answers": answers, **await _state(relay, url, seen)}
    finally:
        await _stopped(relay)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(requests(), min_size=1, max_size=5), st.booleans())
def test_one_shot_on_redis_answers_as_the_general_path(
    redis_url: str, sequence: list[bytes], together: bool
) -> None:
    at_once = asyncio.run(_play(redis_url, True, sequence, together))
    general = asyncio.run(_play(redis_url, False, sequence, together))
    assert at_once == general


@pytest.mark.parametrize("event", NEAR, ids=[json.dumps(event)[:60] for event in NEAR])
def test_each_way_near_a_one_shot_message_on_redis_answers_as_the_general_path(
    redis_url: str, event: Any
) -> None:
    """Every body near a one-shot message, posted twice (the second a repeated id): the same
    answers, frames, counters and keys."""
    sequence = [_post(json.dumps(event).encode())] * 2
    at_once = asyncio.run(_play(redis_url, True, sequence, False))
    general = asyncio.run(_play(redis_url, False, sequence, False))
    assert at_once == general


def test_one_shot_messages_keep_nothing_per_owner_in_redis(redis_url: str) -> None:
    """Five hundred one-shot messages at once, each on its own connection (as a gateway's
    concurrent posts come): each is acked and took one script, the channel's history holds
    them all in the order they came, and Redis holds the channel's keys only: no session,
    no record of any owner."""
    count = 500

    async def play() -> tuple[list[str], int, list[str]]:
        relay, _ = await _started(
            redis_url, True, history_size=count, max_connections_per_ip=count + 10
        )
        try:
            client = aioredis.Redis.from_url(redis_url)
            stats = await client.info("commandstats")
            before = stats.get("cmdstat_evalsha", {"calls": 0})["calls"]
            transports = []
            for number in range(count):
                connection, transport = _connected(relay)
                body = json.dumps({"id": f"m{number}", "delta": "hi", "final": True})
                connection.data_received(_post(body.encode()))
                transports.append(transport)
            for transport in transports:
                answer = await _answered(transport, 1)
                assert b'"acks":[{"type":"ack"' in answer and b'"errors":[]' in answer
            scripts = (await client.info("commandstats"))["cmdstat_evalsha"]["calls"] - before
            await client.aclose()
            cut = await relay.broker.catch_up("c", None, live=True, rewind=count)
            ids = [json.loads(frame)["id"] for frame in cut.frames]
            return await _keys(redis_url, relay.broker.instance), scripts, ids
        finally:
            await _stopped(relay)

    keys, scripts, ids = asyncio.run(play())
    assert ids == [f"m{number}" for number in range(count)]
    assert scripts == count
    assert keys == [
        "tr:channels",  # the channels with history, one shared set (--max-history-channels)
        "tr:epoch:c",
        "tr:held:c",
        "tr:history:c",
        "tr:instances",
        "tr:lease:I",
        "tr:offset:c",
        "tr:published:c",
        "tr:seq:c",
    ], keys


async def _cut(url: str) -> None:
    """Cut every connection Redis has to its clients but pub/sub's (the writer's among them)."""
    client = aioredis.Redis.from_url(url)
    try:
        await client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    finally:
        await client.aclose()


async def _play_cut(url: str, one_shot: bool) -> dict[str, Any]:
    """Three one-shot messages, Redis's connections cut just before the second."""
    relay, seen = await _started(url, one_shot)
    try:
        answers = []
        for name in (b"a", b"b", b"c"):
            if name == b"b":
                await _cut(url)
            connection, transport = _connected(relay)
            connection.data_received(_post(b'{"id":"%b","delta":"hi","final":true}' % name))
            answers.append(await _answered(transport, 1))
            await _until(lambda: relay.broker.healthy, "Redis again")
        state = await _state(relay, url, seen)
        for _ in range(int(WAIT / 0.01)):  # the kept message, published once Redis is back
            if len(state["history"]) == 3:
                break
            await asyncio.sleep(0.01)
            state = await _state(relay, url, seen)
        # Which of the kept message and the next one reaches Redis first is a race either
        # way; each is published once.
        state["history"] = sorted(json.loads(frame)["id"] for frame in state["history"])
        del state["subscriber"]
        return {"answers": answers, **state}
    finally:
        await _stopped(relay)


def test_a_one_shot_message_whose_script_fails_on_its_way_is_published_later(
    redis_url: str,
) -> None:
    """Redis cuts the writer's connection while a message is on its way: the answer is
    ``broker_unavailable`` (no ack), and the message is kept and published once Redis takes
    writes again, as the general path does with it; the message after it is acked."""
    at_once = asyncio.run(_play_cut(redis_url, True))
    general = asyncio.run(_play_cut(redis_url, False))
    a, b, c = at_once["answers"]
    assert b'"acks":[{"type":"ack","id":"a"' in a
    assert b'"code":"broker_unavailable"' in b and b'"acks":[]' in b
    assert b'"acks":[{"type":"ack","id":"c"' in c
    assert at_once["history"] == ["a", "b", "c"]
    assert at_once == general


def test_a_one_shot_message_with_redis_gone_takes_the_general_path(tmp_path: Any) -> None:
    """Redis is down when the request comes: the broker takes no write, so the one-shot way
    declines and the general path answers (``broker_unavailable``, nothing applied twice)."""
    server = RedisServer(tmp_path)
    server.start()

    async def play(one_shot: bool) -> bytes:
        relay, _ = await _started(server.url, one_shot)
        try:
            server.kill()
            await _until(lambda: not relay.broker.healthy, "Redis gone")
            connection, transport = _connected(relay)
            connection.data_received(_post(b'{"id":"a","delta":"hi","final":true}'))
            return await _answered(transport, 1)
        finally:
            await _stopped(relay)
            server.start()

    try:
        at_once, general = asyncio.run(play(True)), asyncio.run(play(False))
    finally:
        server.kill()
    assert b'"code":"broker_unavailable"' in at_once and b'"acks":[]' in at_once
    assert at_once == general


def test_a_one_shot_message_on_redis_queues_its_webhook_as_the_general_path(
    redis_url: str,
) -> None:
    """With ``--webhook``, a one-shot message's frame is queued in Redis's webhook outbox in
    its script, as the general path queues it: the same entries (channel, frame, producer)."""

    async def play(one_shot: bool) -> list[list[bytes]]:
        relay, _ = await _started(
            redis_url,
            one_shot,
            webhooks=("http://127.0.0.1:9/hook",),
            webhook_backoff=300.0,
            shutdown_timeout=1.0,
        )
        try:
            for name in (b"a", b"b"):
                connection, transport = _connected(relay)
                connection.data_received(_post(b'{"id":"%b","delta":"hi","final":true}' % name))
                assert b'"acks":[{"type":"ack"' in await _answered(transport, 1)
            cut = await relay.broker.catch_up("c", None, live=False, rewind=10)
            client = aioredis.Redis.from_url(redis_url)
            try:
                entries = await client.xrange("tr:wh")
            finally:
                await client.aclose()
            epoch = cut.epoch.encode()
            return [
                [fields[b"c"], fields[b"f"].replace(epoch, b"E"), fields[b"p"]]
                for _, fields in entries
            ]
        finally:
            await _stopped(relay)

    at_once, general = asyncio.run(play(True)), asyncio.run(play(False))
    assert [json.loads(frame)["id"] for _, frame, _ in at_once] == ["a", "b"]
    assert at_once == general
