"""A peer's bad request over real sockets: a clear 400 for any numeric query argument that is
not one, and a log that a flood of refusals can't flood."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest
from token_relay.edge.http import HttpRequest

from ..conftest import recv_json, start_relay
from ..harness import eventually


async def _ask(port: int, request: bytes, source: str = "127.0.0.1") -> tuple[int, bytes]:
    """Send one request; its status and body (the relay closes after a refusal)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        body = b""
        with contextlib.suppress(ConnectionError):
            body = await asyncio.wait_for(reader.read(), 5)
        return int(head.split()[1]), body
    finally:
        writer.close()


def _get(target: str, *headers: str) -> bytes:
    lines = [f"GET {target} HTTP/1.1", "Host: relay", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


UPGRADE = (
    "Upgrade: websocket",
    "Connection: Upgrade",
    "Sec-WebSocket-Version: 13",
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
)


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("/subscribe?channel=c&rewind=%C2%B2", b"?rewind= must be a whole number"),
        ("/subscribe?channel=c&rewind=" + "9" * 5000, b"?rewind= must be a whole number"),
        ("/subscribe?channel=c&rewind=%D9%A3", b"?rewind= must be a whole number"),
        ("/sse?channel=c&rewind=%C2%B2", b"?rewind= must be a whole number"),
        ("/sse?channel=c&rewind=" + "1" * 5000, b"?rewind= must be a whole number"),
        ("/ai-sdk/c/stream?rewind=%C2%B2", b"?rewind= must be a whole number"),
        ("/ai-sdk/c/stream?wait=nan", b"?wait= must be seconds, 0 to 30"),
        ("/ai-sdk/c/stream?wait=inf", b"?wait= must be seconds, 0 to 30"),
        ("/ai-sdk/c/stream?wait=1e3", b"?wait= must be seconds, 0 to 30"),
        ("/ai-sdk/c/stream?wait=%D9%A3", b"?wait= must be seconds, 0 to 30"),
        ("/ai-sdk/c/stream?wait=" + "1" * 5000, b"?wait= must be seconds, 0 to 30"),
    ],
)
async def test_a_numeric_query_argument_that_is_not_one_gets_400_and_nothing_breaks(
    target: str, reason: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    running, relay = await start_relay()
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        upgrade = UPGRADE if target.startswith("/subscribe") else ()
        status, body = await _ask(port, _get(target, *upgrade))
        assert (status, body.startswith(reason)) == (400, True), body
        # The relay goes on serving: the same argument, well formed, gets in.
        async with running.connect("/subscribe?channel=c&rewind=2") as ws:
            assert (await recv_json(ws))["type"] == "subscribed"
    assert [record.getMessage() for record in caplog.records if record.exc_info] == []


def _refusal_lines(caplog: pytest.LogCaptureFixture, peer: str) -> list[logging.LogRecord]:
    return [
        record
        for record in caplog.records
        if getattr(record, "event", None) in ("refused", "failed")
        and getattr(record, "peer", None) == peer
    ]


async def test_a_flood_of_bad_requests_writes_a_bounded_number_of_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="token_relay")
    running, relay = await start_relay()
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        started = time.monotonic()
        statuses = []
        for _ in range(10):
            statuses += await asyncio.gather(
                *(_ask(port, _get("/nowhere")) for _ in range(30)),
                *(_ask(port, _get("/subscribe?channel=c&rewind=x", *UPGRADE)) for _ in range(10)),
            )
        seconds = time.monotonic() - started
        assert sorted({status for status, _ in statuses}) == [400, 404] and len(statuses) == 400
        flood = _refusal_lines(caplog, "127.0.0.1")
        # A burst of 10, then a line a second: never one per request.
        assert 10 <= len(flood) <= 10 + seconds + 1
        # Another address's refusal is still logged, at once.
        status, _ = await _ask(port, _get("/elsewhere"), source="127.0.0.2")
        assert status == 404
        [other] = _refusal_lines(caplog, "127.0.0.2")
        assert other.getMessage() == (
            "refused GET /elsewhere from 127.0.0.2: 404 no endpoint at /elsewhere; "
            "use /produce or /subscribe"
        )
        # Every refusal is still counted.
        metrics = relay.metrics.render().decode()
        assert 'relay_http_refusals_total{status="404"} 301.0' in metrics
    assert [record for record in caplog.records if record.exc_info] == []


async def test_a_bug_tripped_again_and_again_answers_500_and_logs_a_bounded_number_of_tracebacks(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, relay = await start_relay()
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        plain = relay.gate.route

        def route(request: HttpRequest) -> object:
            if request.path == "/bug":
                raise RuntimeError("a bug of the relay's")
            return plain(request)

        monkeypatch.setattr(relay.gate, "route", route)
        started = time.monotonic()
        statuses = [status for status, _ in [await _ask(port, _get("/bug")) for _ in range(100)]]
        seconds = time.monotonic() - started
        assert statuses == [500] * 100
        tracebacks = [record for record in _refusal_lines(caplog, "127.0.0.1") if record.exc_info]
        assert 10 <= len(tracebacks) <= 10 + seconds + 1
        assert "RuntimeError: a bug of the relay's" in caplog.text
        # The relay goes on serving everyone.
        async with running.connect("/subscribe?channel=c") as ws:
            assert (await recv_json(ws))["type"] == "subscribed"


async def test_a_body_cut_mid_chunk_logs_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    running, relay = await start_relay()
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        for _ in range(20):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /produce?channel=c HTTP/1.1\r\nHost: relay\r\n"
                b"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"
            )
            await writer.drain()
            writer.close()  # gone mid-chunk: the relay's answer meets a closed socket
            await writer.wait_closed()
        async with running.connect("/subscribe?channel=c") as ws:
            assert (await recv_json(ws))["type"] == "subscribed"
        await eventually(lambda: relay.server is not None and not relay.server.open, 5)
    assert [record.getMessage() for record in caplog.records if record.exc_info] == []
    assert "Fatal error" not in caplog.text
