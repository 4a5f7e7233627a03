"""Producer inputs that once closed a connection with 1011 or left an HTTP request unanswered,
each now refused with its error and nothing else: a lone surrogate in an event's id, JSON
nested deeper than the models read, a ``meta`` holding numbers JSON has not, refused metadata
on an AI SDK ``finish``, and a chunked body whose framing breaks."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ..conftest import RunningRelay, recv_json, send_json, subscribed_pair
from .test_http_producers import _post

DEEP_META = '{"id":"d","delta":"x","final":true,"meta":{"a":' + "[" * 300 + "]" * 300 + "}}"
DEEPER_META = '{"id":"d","delta":"x","meta":{"a":' + '{"a":' * 5000 + "1" + "}" * 5000 + "}}"
DEEP_CHUNK = (
    '{"id":"d","chunk":{"type":"data-x","data":' + "[" * 300 + "]" * 300 + '},"final":true}'
)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ('{"id":"\\ud800","delta":"x"}', "invalid_event"),
        ('[{"id":"ok","delta":"y"},{"id":"\\udc00","final":true}]', "invalid_event"),
        (DEEP_META, "invalid_json"),
        (DEEPER_META, "invalid_json"),
        (DEEP_CHUNK, "invalid_json"),
    ],
)
async def test_a_bad_event_gets_an_error_and_the_connection_goes_on(
    relay: RunningRelay, raw: str, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with subscribed_pair(relay) as (subscriber, producer):
        await producer.send(raw)
        error = await recv_json(producer)
        assert error["type"] == "error" and error["code"] == code, error
        assert error["id"] in (None, "d", "ok"), error
        await send_json(producer, {"id": "good", "delta": "fine", "final": True})
        assert await recv_json(producer) == {"type": "ack", "id": "good", "channel": "c"}
        frame = await recv_json(subscriber)
        assert (frame["id"], frame["text"]) == ("good", "fine"), frame
    assert "Traceback" not in caplog.text and "exception" not in caplog.text


@pytest.mark.parametrize(
    ("path", "body", "content_type"),
    [
        ("/produce?channel=c", b'{"id":"\\ud800","delta":"x"}', "application/json"),
        ("/produce?channel=c", DEEP_META.encode(), "application/json"),
        ("/produce?channel=c", DEEPER_META.encode(), "application/json"),
        ("/produce?channel=c", DEEP_META.encode() + b"\n", "application/x-ndjson"),
        (
            "/ai-sdk/c/produce",
            b'data: {"type":"start","messageId":"\\ud800"}\n\ndata: [DONE]\n\n',
            "text/event-stream",
        ),
        (
            "/ai-sdk/c/produce",
            b'data: {"type":"data-x","data":' + b"[" * 300 + b"]" * 300 + b"}\n\ndata: [DONE]\n\n",
            "text/event-stream",
        ),
        (
            "/ai-sdk/c/produce",
            b'data: {"type":"data-x","data":'
            + b"[" * 5000
            + b"]" * 5000
            + b"}\n\ndata: [DONE]\n\n",
            "text/event-stream",
        ),
    ],
)
async def test_a_bad_http_body_gets_an_answer(
    relay: RunningRelay, path: str, body: bytes, content_type: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    port = int(relay.url.rsplit(":", 1)[1])
    status, answer = await _post(port, path, body, content_type)
    assert status in (200, 400), (status, answer)
    codes = [error["code"] for error in answer["errors"]]
    assert codes and set(codes) <= {"invalid_json", "invalid_event", "invalid_chunk"}, answer
    assert "Traceback" not in caplog.text and "exception" not in caplog.text


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"1e400"])
async def test_meta_that_is_not_json_is_refused_not_turned_to_null(
    relay: RunningRelay, number: bytes
) -> None:
    port = int(relay.url.rsplit(":", 1)[1])
    body = b'{"id":"n","delta":"ok","final":true,"meta":{"a":' + number + b"}}"
    async with subscribed_pair(relay) as (subscriber, _):
        status, answer = await _post(port, "/produce?channel=c", body, "application/json")
        assert status == 200 and [e["code"] for e in answer["errors"]] == ["invalid_event"], answer
        assert answer["acks"] == []
        with pytest.raises(TimeoutError):
            await recv_json(subscriber, 0.3)


async def test_an_ai_sdk_finish_with_refused_metadata_still_completes(
    relay: RunningRelay,
) -> None:
    port = int(relay.url.rsplit(":", 1)[1])
    body = (
        b'data: {"type":"text-start","id":"t"}\n\n'
        b'data: {"type":"text-delta","id":"t","delta":"hi"}\n\n'
        b'data: {"type":"finish","messageMetadata":{"a":"\\ud800"}}\n\n'
        b"data: [DONE]\n\n"
    )
    async with subscribed_pair(relay) as (subscriber, _):
        status, answer = await _post(port, "/ai-sdk/c/produce?id=f", body, "text/event-stream")
        assert status == 200 and answer["outcome"] == "completed", answer
        assert [e["code"] for e in answer["errors"]] == ["invalid_event"], answer
        frame = await recv_json(subscriber)
        assert (frame["type"], frame["id"], frame["text"]) == ("message", "f", "hi"), frame


async def test_a_broken_chunked_body_gets_400_and_no_traceback(
    relay: RunningRelay, caplog: pytest.LogCaptureFixture
) -> None:
    port = int(relay.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /produce?channel=c HTTP/1.1\r\nHost: r\r\nContent-Type: application/x-ndjson\r\n"
        b'Transfer-Encoding: chunked\r\n\r\nzz\r\n{"id":"g","delta":"x"}\r\n0\r\n\r\n'
    )
    response = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert response.startswith(b"HTTP/1.1 400 "), response
    await asyncio.sleep(0.2)
    assert "Traceback" not in caplog.text and "exception" not in caplog.text
