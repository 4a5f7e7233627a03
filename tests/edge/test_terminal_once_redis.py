"""On Redis, a final whose reply never came is published exactly once, and soon.

A Redis that hangs (its process stopped: a stalled host, or a network path that went dead
and came back) makes the relay's write time out. The producer is answered
``broker_unavailable``, and the final is kept in the outbox, to be published once Redis
takes writes. But the script may have reached Redis before the hang, and Redis runs it
when it wakes. The kept frame, run again by the same owner within ``--id-hold``, must
publish nothing more: the channel holds the message once. The outbox must be published
as soon as Redis takes writes again, whether or not the relay saw an outage. A producer
that sends the final again is acked.

Played on a real ``redis-server``, stopped with SIGSTOP and resumed with SIGCONT, with the
relay's write timeout shortened; and with writes paused (``CLIENT PAUSE ... WRITE``), where
the script never runs and PING still answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import pytest
import redis.asyncio as aioredis
from token_relay.brokers.redis import pipeline
from token_relay.core.codec import message_body
from token_relay.core.errors import FrameRejected

from tests.conftest import open_producer, recv_json, send_json
from tests.edge.test_oneshot import _post
from tests.edge.test_oneshot_redis import _answered, _connected, _started, _stopped, _until
from tests.harness import RedisServer

TIMEOUT = 0.5
"""The relay's write timeout here (``COMMAND_TIMEOUT``, 5 s in production)."""
HANG = 2.0
"""Seconds Redis hangs: past the timeout, so the relay gives up on the write in flight."""


def _hang(server: RedisServer) -> None:
    """Stop the Redis process now, and resume it :data:`HANG` seconds later."""
    assert server.process is not None
    pid = server.process.pid
    os.kill(pid, signal.SIGSTOP)
    asyncio.get_running_loop().call_later(HANG, os.kill, pid, signal.SIGCONT)


async def _pause_writes(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.execute_command("CLIENT", "PAUSE", int(HANG * 1000), "WRITE")
    finally:
        await client.aclose()


async def _post_and_answer(relay: Any, body: bytes) -> bytes:
    connection, transport = _connected(relay)
    connection.data_received(_post(body))
    return await _answered(transport, 1)


async def _settled(relay: Any) -> list[tuple[str, str]]:
    """The channel's history, once the outbox is empty and Redis has had time to run what
    it held (and a while more, for a frame published twice to show)."""
    await _until(lambda: relay.broker.healthy and not relay.broker.outbox, "the outbox")
    await asyncio.sleep(HANG)
    await relay.broker.flush_writes()
    cut = await relay.broker.catch_up("c", None, live=False, rewind=100)
    return [(json.loads(frame)["id"], json.loads(frame)["text"]) for frame in cut.frames]


def _unavailable(answer: bytes) -> bool:
    return b" 503 " in answer.split(b"\r\n")[0] and b'"code":"broker_unavailable"' in answer


def test_a_post_whose_reply_never_came_is_published_once(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-shot ``POST /produce`` (one script) while Redis hangs. (The general path saves
    a producer session first, on a connection of its own that waits the hang out.)"""
    monkeypatch.setattr(pipeline, "COMMAND_TIMEOUT", TIMEOUT)

    async def play() -> tuple[bytes, bytes, bytes, bytes, list[list[tuple[str, str]]]]:
        relay, _ = await _started(redis_server.url, True)
        try:
            # A write first: the writer's connection is open when Redis hangs, so the next
            # script reaches Redis and waits there.
            warm = await _post_and_answer(relay, b'{"id":"w","delta":"x","final":true}')
            _hang(redis_server)
            answer = await _post_and_answer(relay, b'{"id":"m","delta":"hello","final":true}')
            history = [await _settled(relay)]
            # The retry is a producer of its own, and the id is held by the first attempt's;
            # it is the same whole message, so it is acked, and publishes nothing more.
            retry = await _post_and_answer(relay, b'{"id":"m","delta":"hello","final":true}')
            history.append(await _settled(relay))
            # Other text under the id is another message: refused.
            other = await _post_and_answer(relay, b'{"id":"m","delta":"hellO","final":true}')
            history.append(await _settled(relay))
            return warm, answer, retry, other, history
        finally:
            await _stopped(relay)

    warm, answer, retry, other, history = asyncio.run(play())
    assert b'"acks":[{"type":"ack","id":"w"' in warm
    assert _unavailable(answer), answer
    assert history == [[("w", "x"), ("m", "hello")]] * 3
    assert b" 200 " in retry.split(b"\r\n")[0], retry
    assert retry.endswith(
        b'{"acks":[{"type":"ack","id":"m","channel":"c"}],"errors":[],"cancels":[]}'
    )
    assert b'"code":"id_in_use"' in other and b'"acks":[]' in other


def test_a_kept_final_is_published_once_writes_pass_again(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes paused past the timeout while PING answers: no outage is seen, and the kept
    frame is published all the same once they pass."""
    monkeypatch.setattr(pipeline, "COMMAND_TIMEOUT", TIMEOUT)

    async def play() -> tuple[bytes, list[tuple[str, str]]]:
        relay, _ = await _started(redis_url, True)
        try:
            await _post_and_answer(relay, b'{"id":"w","delta":"x","final":true}')
            await _pause_writes(redis_url)
            answer = await _post_and_answer(relay, b'{"id":"m","delta":"hello","final":true}')
            return answer, await _settled(relay)
        finally:
            await _stopped(relay)

    answer, history = asyncio.run(play())
    assert _unavailable(answer), answer
    assert history == [("w", "x"), ("m", "hello")]


def test_a_final_sent_again_after_its_reply_was_lost_is_acked_and_published_once(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A WebSocket producer's final times out while Redis hangs; the producer sends it
    again, as the error tells it to: acked, and the channel holds the message once."""
    monkeypatch.setattr(pipeline, "COMMAND_TIMEOUT", TIMEOUT)

    async def play() -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, str]]]:
        relay, _ = await _started(redis_server.url, False)
        try:
            assert relay.server is not None
            port = relay.server.sockets[0].getsockname()[1]
            async with open_producer(f"ws://127.0.0.1:{port}/produce?channel=c") as producer:
                await send_json(producer, {"id": "m", "delta": "hel"})
                await relay.broker.flush_writes()
                _hang(redis_server)
                await send_json(producer, {"id": "m", "delta": "lo", "final": True})
                first = await recv_json(producer, 10)
                await _until(lambda: relay.broker.healthy, "Redis again")
                await asyncio.sleep(HANG)
                await send_json(producer, {"id": "m", "final": True})
                second = await recv_json(producer, 10)
                return first, second, await _settled(relay)
        finally:
            await _stopped(relay)

    first, second, history = asyncio.run(play())
    assert first["type"] == "error" and first["code"] == "broker_unavailable", first
    assert second["type"] == "ack" and second["id"] == "m", second
    assert history == [("m", "hello")]


def test_a_terminal_script_sent_again_by_its_owner_publishes_nothing_more(redis_url: str) -> None:
    """The script itself: a whole message sent twice by one owner, then by another, is
    published once, and each later answer is the frame as published; other text under the
    id from another owner is refused the id."""

    async def play() -> tuple[list[Any], list[str]]:
        relay, _ = await _started(redis_url, True)
        try:
            broker = relay.broker
            answers: list[Any] = []
            for owner, text in (
                ("one", "hello"),
                ("one", "hello"),
                ("two", "hello"),
                ("three", "bye"),
            ):
                published = broker.whole("c", owner, "m", text, message_body("c", "m", text))
                assert published is not None
                try:
                    answers.append(await published)
                except FrameRejected as exc:
                    answers.append(exc.code.value)
            cut = await broker.catch_up("c", None, live=False, rewind=100)
            return answers, cut.frames
        finally:
            await _stopped(relay)

    (first, again, copy, other), history = asyncio.run(play())
    assert history == [first]
    assert again == copy == first and json.loads(first)["offset"] == 1
    assert other == "id_in_use"
