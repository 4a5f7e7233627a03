"""A producer ends its own message: the event's ``abort`` (``cancelled`` or ``error``)."""

from __future__ import annotations

import json

from ..conftest import recv_core, recv_json, send_json
from ..docs.blocks import docs_block
from ..harness.redis_server import RedisServer
from .conftest import OpenRelay


async def test_an_abort_event_ends_the_message_at_once_with_its_meta(
    open_relay: OpenRelay,
) -> None:
    async with open_relay() as (_, sub, producer):
        await send_json(producer, {"id": "m", "delta": "Hel", "seq": 1, "meta": {"model": "x"}})
        await send_json(
            producer, {"id": "m", "seq": 2, "abort": "cancelled", "meta": {"finishReason": "stop"}}
        )
        assert await recv_core(sub) == {
            "type": "aborted",
            "channel": "c",
            "id": "m",
            "text": "Hel",
            "reason": "cancelled",
            "meta": {"model": "x", "finishReason": "stop"},
        }
        # The id is aborted: a late event is refused, and the producer got nothing else.
        await send_json(producer, {"id": "m", "delta": "lo", "seq": 3})
        error = await recv_json(producer)
        assert (error["type"], error["code"], error["id"]) == ("error", "message_aborted", "m")


async def test_an_abort_in_a_batch_ends_its_message_and_the_rest_applies(
    open_relay: OpenRelay,
) -> None:
    async with open_relay() as (_, sub, producer):
        await send_json(
            producer,
            [
                {"id": "a", "delta": "cut"},
                {"id": "a", "abort": "error", "meta": {"errorText": "upstream failed"}},
                {"id": "b", "delta": "whole", "final": True},
                {"id": "never", "abort": "cancelled"},
            ],
        )
        aborted = await recv_core(sub)
        assert (aborted["id"], aborted["reason"], aborted["text"]) == ("a", "error", "cut")
        assert aborted["meta"] == {"errorText": "upstream failed"}
        message = await recv_core(sub)
        assert (message["type"], message["id"], message["text"]) == ("message", "b", "whole")
        assert await recv_json(producer) == {
            "type": "acks",
            "acks": [{"id": "b", "channel": "c"}],
        }


async def test_the_documented_abort_event_ends_the_reply_cancelled(open_relay: OpenRelay) -> None:
    async with open_relay(channel="chat-42") as (_, sub, producer):
        await send_json(producer, {"id": "reply-1", "delta": "Hello, wor"})
        await producer.send(docs_block("producer-abort").strip())
        assert await recv_core(sub) == {
            "type": "aborted",
            "channel": "chat-42",
            "id": "reply-1",
            "text": "Hello, wor",
            "reason": "cancelled",
            "meta": json.loads(docs_block("producer-abort"))["meta"],
        }


async def test_an_abort_event_carrying_a_delta_is_refused(open_relay: OpenRelay) -> None:
    async with open_relay() as (_, sub, producer):
        await send_json(producer, {"id": "m", "delta": "so far"})
        await send_json(producer, {"id": "m", "delta": "more", "abort": "cancelled"})
        error = await recv_json(producer)
        assert (error["type"], error["code"], error["id"]) == ("error", "invalid_event", "m")
        await send_json(producer, {"id": "m", "abort": "stopped"})
        error = await recv_json(producer)
        assert (error["type"], error["code"]) == ("error", "invalid_event")
        # Still in progress: it completes as usual.
        await send_json(producer, {"id": "m", "final": True})
        message = await recv_core(sub)
        assert (message["type"], message["text"]) == ("message", "so far")


async def test_an_abort_event_ends_a_structured_reply_through_redis(
    open_relay: OpenRelay, redis_server: RedisServer
) -> None:
    async with open_relay(broker=redis_server.url, deltas=True) as (_, sub, producer):
        await send_json(producer, {"id": "m", "chunk": {"type": "text-start", "id": "t"}})
        await send_json(
            producer, {"id": "m", "chunk": {"type": "text-delta", "id": "t", "delta": "Hi"}}
        )
        await send_json(producer, {"id": "m", "abort": "cancelled"})
        frame = await recv_core(sub)
        while frame["type"] != "aborted":
            frame = await recv_core(sub)
        assert (frame["reason"], frame["text"]) == ("cancelled", "Hi")
        assert frame["parts"] == [{"type": "text", "text": "Hi", "state": "streaming"}]
