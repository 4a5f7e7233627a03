"""Bad input over real sockets that once got no answer, a 500, a 1011 or a traceback: JSON
nested past the parser's recursion limit, header values that are not ASCII echoed back, a
``?limit=`` of Unicode digits, and a chunked producer body whose framing breaks."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import logging

import pytest

from ..conftest import recv_json, start_relay
from .test_http import _request

HTTP_PARSERS = ("fast", "h11")

DEEP = b"[" * 20_000 + b"]" * 20_000


async def _ask(port: int, request: bytes) -> tuple[int, bytes, bytes]:
    """Send one request; its status, head and body (up to the close or 5 s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        body = b""
        with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                None,
            )
            if length is not None:
                body = await asyncio.wait_for(reader.readexactly(length), 5)
        return int(head.split()[1]), head, body
    finally:
        writer.close()


def _port(running: object) -> int:
    return int(running.url.rsplit(":", 1)[1])  # type: ignore[attr-defined]


@pytest.fixture
def errors(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.ERROR)
    return caplog


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    gc.collect()  # a task's exception never retrieved is logged when the task is collected
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_deeply_nested_json_append_is_invalid_json(errors: pytest.LogCaptureFixture) -> None:
    running, relay = await start_relay()
    async with relay:
        port = _port(running)
        json_type = "Content-Type: application/json"
        status, _, _ = await _ask(port, _request("PUT", "/v1/stream/deep", json_type))
        assert status == 201
        for method in ("POST", "PUT"):
            target = "/v1/stream/deep" if method == "POST" else "/v1/stream/deep2"
            status, _, body = await _ask(port, _request(method, target, json_type, body=DEEP))
            assert status == 400, body
            assert json.loads(body)["code"] == "invalid_json"
        status, _, body = await _ask(port, _request("GET", "/v1/stream/deep?offset=-1"))
        assert (status, body) == (200, b"[]")
    assert _tracebacks(errors) == []


@pytest.mark.parametrize("where", ["header", "query"])
async def test_deeply_nested_resume_token_is_400(
    where: str, errors: pytest.LogCaptureFixture
) -> None:
    token = base64.urlsafe_b64encode(b"[" * 1100 + b"]" * 1100).rstrip(b"=").decode()
    channels = "channel=a&channel=b&channel=c&channel=d"
    running, relay = await start_relay()
    async with relay:
        if where == "header":
            request = _request("GET", f"/sse?{channels}", f"Last-Event-ID: {token}")
        else:
            request = _request("GET", f"/sse?{channels}&since={token}")
        status, _, body = await _ask(_port(running), request)
        assert status == 400, body
        assert b"resume token is invalid" in body
    assert _tracebacks(errors) == []


async def test_deeply_nested_cancel_body_is_refused(errors: pytest.LogCaptureFixture) -> None:
    body = b'{"channel": "c", "id": "m", "x": ' + DEEP + b"}"
    running, relay = await start_relay()
    async with relay:
        status, _, answer = await _ask(_port(running), _request("POST", "/cancel", body=body))
        assert status == 400, answer
        assert json.loads(answer)["code"] == "invalid_json"
    assert _tracebacks(errors) == []


async def test_deeply_nested_ai_sdk_event_is_invalid_json(errors: pytest.LogCaptureFixture) -> None:
    body = b"data: " + DEEP + b"\n\n"
    running, relay = await start_relay()
    async with relay:
        status, _, answer = await _ask(
            _port(running), _request("POST", "/ai-sdk/c/produce", body=body)
        )
        assert status < 500, answer
        assert b"invalid_json" in answer
    assert _tracebacks(errors) == []


async def test_deeply_nested_producer_frame_with_a_surrogate_is_an_error_frame() -> None:
    frame = '{"id": "m", "delta": "\\ud800", "meta": {"x": ' + "[" * 5000 + "]" * 5000 + "}}"
    running, relay = await start_relay()
    async with relay, running.connect("/produce?channel=c") as ws:
        await ws.send(frame)
        error = await recv_json(ws)
        assert error["type"] == "error" and error["code"] == "invalid_json", error
        await ws.send(json.dumps({"id": "ok", "delta": "hi", "final": True}))
        assert (await recv_json(ws))["type"] == "ack"


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        ('{"type": "subscribe", "channel": "\\ud800"}', "'channel'"),
        (
            '{"type": "subscribe", "channel": "c", "since": {"offset": 1, "epoch": "\\udc00"}}',
            "'since.epoch'",
        ),
        ('{"type": "cancel", "channel": "c", "id": "\\ud83d"}', "'id'"),
    ],
)
async def test_subscriber_frame_with_half_a_surrogate_pair_names_its_field(
    frame: str, field: str
) -> None:
    # JSON's grammar takes the escape, so the frame is valid JSON whose field is no text:
    # invalid_frame naming the field (as a producer's event gets invalid_event), not
    # invalid_json; the connection goes on.
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe") as ws:
        await ws.send(frame)
        error = await recv_json(ws)
        assert error["code"] == "invalid_frame" and error["id"] is None, error
        assert error["message"].startswith(field), error
        await ws.send(json.dumps({"type": "subscribe", "channel": "c"}))
        assert (await recv_json(ws))["type"] == "subscribed"


async def test_non_ascii_origin_is_answered(errors: pytest.LogCaptureFixture) -> None:
    origin = "Origin: \xc3\xa9"  # obs-text: HTTP allows it in a field value
    running, relay = await start_relay()
    async with relay:
        port = _port(running)
        status, head, _ = await _ask(
            port, _request("PUT", "/v1/stream/o", "Content-Type: text/plain", origin)
        )
        assert status == 201, head
        for target in ("/v1/stream/o?offset=-1", "/ai-sdk/c/messages", "/healthz"):
            status, head, _ = await _ask(port, _request("GET", target, origin))
            assert status == 200, (target, head)
        status, head, _ = await _ask(port, _request("GET", "/sse?channel=c", origin))
        assert status == 200, head
    assert _tracebacks(errors) == []


async def test_non_ascii_content_type_keeps_its_stream_readable(
    errors: pytest.LogCaptureFixture,
) -> None:
    content_type = "Content-Type: text/plain; x=\xc3\xa9"
    running, relay = await start_relay()
    async with relay:
        port = _port(running)
        status, head, _ = await _ask(port, _request("PUT", "/v1/stream/ct", content_type))
        assert status == 201, head
        status, _, _ = await _ask(port, _request("POST", "/v1/stream/ct", content_type, body=b"hi"))
        assert status == 204
        status, head, body = await _ask(port, _request("GET", "/v1/stream/ct?offset=-1"))
        assert (status, body) == (200, b"hi"), head
        status, head, _ = await _ask(port, _request("HEAD", "/v1/stream/ct"))
        assert status == 200, head
    assert _tracebacks(errors) == []


@pytest.mark.parametrize("limit", ["%C2%B2", "%D9%A3"])
async def test_ai_sdk_limit_of_unicode_digits_is_400(
    limit: str, errors: pytest.LogCaptureFixture
) -> None:
    running, relay = await start_relay()
    async with relay:
        status, _, body = await _ask(
            _port(running), _request("GET", f"/ai-sdk/c/messages?limit={limit}")
        )
        assert status == 400, body
        assert b"?limit= must be" in body
    assert _tracebacks(errors) == []


@pytest.mark.parametrize("target", ["/produce?channel=c", "/ai-sdk/c/produce"])
async def test_broken_chunk_framing_mid_produce_logs_no_traceback(
    target: str, errors: pytest.LogCaptureFixture
) -> None:
    request = (
        f"POST {target} HTTP/1.1\r\nHost: relay\r\nTransfer-Encoding: chunked\r\n\r\n"
        "2\r\n{}\r\nzz\r\n"
    ).encode()
    running, relay = await start_relay()
    async with relay:
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(running))
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(), 5)  # the relay's close ends it
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        writer.close()
        await asyncio.sleep(0.5)  # the producer's answer comes once the socket is gone
        assert _tracebacks(errors) == []


@pytest.mark.parametrize("offset", ["zz", "-1", "now", ""])
async def test_malformed_fork_offset_is_bad_fork_offset(offset: str) -> None:
    text = "Content-Type: text/plain"
    running, relay = await start_relay()
    async with relay:
        port = _port(running)
        status, _, _ = await _ask(port, _request("PUT", "/v1/stream/src", text, body=b"abc"))
        assert status == 201
        fork = ("Stream-Forked-From: /v1/stream/src", f"Stream-Fork-Offset: {offset}")
        status, _, body = await _ask(port, _request("PUT", "/v1/stream/fork", text, *fork))
        assert status == 400, body
        assert json.loads(body)["code"] == "bad_fork_offset"


async def test_deeply_nested_ai_sdk_ws_frame_closes_1008() -> None:
    """A frame with no readable requestId closes with 1008, as documented (not 1011)."""
    from websockets.exceptions import ConnectionClosed

    frame = '{"type": "send", "x": ' + "[" * 5000 + "]" * 5000 + "}"
    running, relay = await start_relay()
    async with relay, running.connect("/ai-sdk/ws") as ws:
        await ws.send(frame)
        with pytest.raises(ConnectionClosed):
            await recv_json(ws)
        assert ws.close_code == 1008


@pytest.mark.parametrize("depth", [127, 900, 5000])
async def test_deeply_nested_tool_input_ends_its_message(depth: int) -> None:
    running, relay = await start_relay()
    async with (
        relay,
        running.connect("/subscribe?channel=t") as sub,
        running.connect("/produce?channel=t") as producer,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        start = {"type": "tool-input-start", "toolCallId": "c1", "toolName": "x"}
        text = "[" * depth + "]" * depth
        delta = {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": text}
        await producer.send(json.dumps({"id": "m", "chunk": start}))
        await producer.send(json.dumps({"id": "m", "chunk": delta}))
        await producer.send(json.dumps({"id": "m", "final": True}))
        assert (await recv_json(producer))["type"] == "ack"
        message = await recv_json(sub)
        assert message["type"] == "message", message
        state = message["parts"][0]["state"]
        assert state == ("input-available" if depth <= 128 else "output-error"), message


async def test_resume_token_with_a_half_surrogate_epoch_is_400(
    errors: pytest.LogCaptureFixture,
) -> None:
    token = base64.urlsafe_b64encode(b'{"a":[1,"\\ud800"]}').rstrip(b"=").decode()
    running, relay = await start_relay()
    async with relay:
        status, _, body = await _ask(
            _port(running), _request("GET", "/sse?channel=a", f"Last-Event-ID: {token}")
        )
        assert status == 400, body
        assert b"resume token is invalid" in body
    assert _tracebacks(errors) == []


HANDSHAKE = (
    "Upgrade: websocket",
    "Connection: Upgrade",
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Version: 13",
)


async def test_http_1_0_is_served_other_versions_and_a_1_0_handshake_are_refused(
    errors: pytest.LogCaptureFixture,
) -> None:
    running, relay = await start_relay()
    async with relay:
        port = _port(running)

        def versioned(request: bytes, version: bytes) -> bytes:
            return request.replace(b" HTTP/1.1\r\n", b" HTTP/" + version + b"\r\n", 1)

        # An HTTP/1.0 request is served, as HTTP/1.0.
        status, _, body = await _ask(port, versioned(_request("GET", "/healthz"), b"1.0"))
        assert (status, body) == (200, b"ok\n")
        # A version other than 1.0 and 1.1: 505, named.
        for version in (b"2.0", b"1.2", b"0.9", b"3.0"):
            status, _, body = await _ask(port, versioned(_request("GET", "/healthz"), version))
            assert status == 505 and b"HTTP/" + version in body, (version, body)
        # A WebSocket handshake takes HTTP/1.1 (RFC 6455): over 1.0 it is 400, over 1.1 101.
        handshake = _request("GET", "/subscribe?channel=a", *HANDSHAKE)
        status, _, body = await _ask(port, versioned(handshake, b"1.0"))
        assert status == 400 and b"HTTP/1.1" in body, body
        assert (await _ask(port, handshake))[0] == 101
    assert _tracebacks(errors) == []
