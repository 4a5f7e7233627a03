"""What a producer request holds for its answer is bounded, and so is what it queues.

:class:`~token_relay.edge.httpproducer.HttpProducer` keeps every frame its body earns; once
they reach :data:`MAX_ANSWER_BYTES`, or :data:`MAX_ANSWER_ERRORS` errors, the lines still
waiting are dropped and one ``body_too_large`` refusal ends the body. Lines refused as they
are read count at once: a body of them stops being queued at the bound, not one read later.
(Over real sockets: ``tests/e2e/test_http_answer_bounds.py``.)
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.grants import Grant, Role
from token_relay.edge.aisdkproduce import AiSdkProducer
from token_relay.edge.httpproducer import MAX_ANSWER_BYTES, MAX_ANSWER_ERRORS, HttpProducer

from tests.e2e.test_http_bodies import ReadSocket
from tests.edge.test_statuses import ndjson_producer


def _ai_sdk_producer(sock: ReadSocket) -> HttpProducer:
    return AiSdkProducer(
        cast(asyncio.Transport, sock),
        path="/ai-sdk/c/produce",
        client="test",
        grant=Grant(Role.PRODUCE, ("*",)),
        channel="c",
        wanted=None,
        max_line=1000,
    )


def _cut(item: object) -> FrameRejected:
    assert isinstance(item, FrameRejected) and item.code is ErrorCode.BODY_TOO_LARGE
    assert "the answer to this request reached" in item.message
    return item


@pytest.mark.parametrize("route", ["produce", "ai-sdk"])
def test_lines_refused_as_they_are_read_are_queued_up_to_the_bound_then_the_body_ends(
    route: str,
) -> None:
    sock = ReadSocket()
    producer = ndjson_producer(sock) if route == "produce" else _ai_sdk_producer(sock)
    junk = b"\xff\n" if route == "produce" else b"x\n"  # not UTF-8; no SSE field
    producer.feed(junk * 100_000)
    items = [item for item, _ in producer._items]
    assert len(items) == MAX_ANSWER_ERRORS + 1  # not 100,000 refusals held at once
    assert [cast(FrameRejected, item).line for item in items[:-1]] == list(
        range(1, MAX_ANSWER_ERRORS + 1)
    )
    cut = _cut(items[-1])
    if route == "produce":
        assert (cut.index, cut.line) == (MAX_ANSWER_ERRORS, None)
    else:
        assert (cut.index, cut.line) == (None, MAX_ANSWER_ERRORS + 1)
    # The body has ended for its producer: what still comes is read, and dropped.
    assert sock.reading
    producer.feed(b'{"id": "late", "delta": "x", "final": true}\n')
    producer.end()
    assert len(producer._items) == MAX_ANSWER_ERRORS + 1


async def test_frames_past_the_byte_bound_drop_the_lines_waiting_and_keep_every_frame() -> None:
    sock = ReadSocket()
    producer = ndjson_producer(sock)
    producer.feed(b'{"id": "a", "delta": "x"}\n' * 100)  # 64 waiting: the socket is paused
    assert not sock.reading
    await anext(producer)
    await anext(producer)
    # Two lines taken; the frames they earned reach the bound.
    ack = b'{"type":"ack","id":"a","channel":"c"}'
    producer.collect(ack)
    assert producer._items and producer._queued
    big = b'{"type":"ack","id":"' + b"i" * MAX_ANSWER_BYTES + b'","channel":"c"}'
    producer.collect(big)
    assert producer.acks == [ack, big]
    cut = _cut(await anext(producer))
    assert (cut.index, producer._queued) == (2, 0)
    assert sock.reading  # what still comes is read, and dropped
    with pytest.raises(StopAsyncIteration):
        await anext(producer)
    producer.feed(b'{"id": "late", "delta": "x"}\n')
    assert not producer._items
    # More frames still come for what was applied before (acks settled late): kept.
    producer.collect(ack)
    assert producer.acks[-1] == ack and not producer._items


async def test_a_body_applied_whole_before_the_bound_is_not_cut() -> None:
    producer = ndjson_producer(ReadSocket())
    producer.feed(b'{"id": "a", "delta": "x"}\n')
    producer.end()
    await anext(producer)
    error = b'{"type":"error","code":"seq_gap","message":"m","id":"a"}'
    for _ in range(MAX_ANSWER_ERRORS + 5):
        producer.collect(error)  # the frames of what was applied are kept, every one
    assert len(producer.errors) == MAX_ANSWER_ERRORS + 5
    assert not producer._items  # and nothing is refused: nothing of the body was left
    with pytest.raises(StopAsyncIteration):
        await anext(producer)
