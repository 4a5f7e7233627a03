"""A request's target is parsed once, at the gate, over real sockets: one call of the route
parser and at most one parse of its query string, whatever the kind of request and
whatever the relay does with it afterwards (a WebSocket's handler, a stream, a body)."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from token_relay.edge import routes

from ..conftest import recv_json, send_json, start_relay


async def _exchange(port: int, request: bytes) -> bytes:
    """Send one request and read its response head (and what else comes within a moment)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        with contextlib.suppress(TimeoutError, ConnectionError):
            head += await asyncio.wait_for(reader.read(4096), 0.3)
        return head
    finally:
        writer.close()


UPGRADE = (
    "Upgrade: websocket",
    "Connection: Upgrade",
    "Sec-WebSocket-Version: 13",
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
)


def _request(method: str, target: str, body: bytes = b"", *headers: str) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: relay", *headers]
    if body or method == "POST":
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


EVENT = b'{"id":"m1","delta":"hi","final":true}'
PLAIN = [
    # (request, its status, how many times its query is parsed: never where no route reads it)
    (_request("POST", "/produce?channel=c&producer=p", EVENT), 200, 1),
    (_request("GET", "/sse?channel=c&rewind=1&deltas=1"), 200, 1),
    (_request("GET", "/ai-sdk/quiet/stream?wait=0"), 204, 1),
    (_request("POST", "/ai-sdk/c/stop?id=gone"), 404, 1),
    (_request("POST", "/cancel?x=1", b'{"channel":"c","id":"gone"}'), 404, 1),
    (_request("GET", "/webhooks/dead?token=t"), 404, 1),
    (_request("GET", "/subscribe?channel=c&rewind=0", b"", *UPGRADE), 400, 1),
    (_request("GET", "/healthz?probe=1"), 200, 0),
    (_request("GET", "/metrics?x=1"), 200, 0),
    (_request("GET", "/nowhere?x=1"), 404, 0),
    (_request("GET", "/subscribe?channel=c"), 426, 0),
    (_request("POST", "/subscribe?channel=c"), 405, 0),
]


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of the route parser and of the standard library's query parser (which every
    ``parse_qs`` goes through, however it was imported)."""
    calls: Counter[str] = Counter()

    def wrap(owner: Any, name: str) -> None:
        plain: Callable[..., Any] = getattr(owner, name)

        def counting(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return plain(*args, **kwargs)

        monkeypatch.setattr(owner, name, counting)

    wrap(routes, "parse_route")
    wrap(urllib.parse, "parse_qsl")
    return calls


async def test_each_plain_request_is_routed_once_and_its_query_parsed_once(
    counted: Counter[str],
) -> None:
    running, relay = await start_relay()
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        for request, status, queries in PLAIN:
            counted.clear()
            head = await _exchange(port, request)
            line = request.split(b"\r\n")[0]
            assert int(head.split()[1]) == status, (line, head)
            assert dict(counted) == {"parse_route": 1, "parse_qsl": queries} or (
                queries == 0 and dict(counted) == {"parse_route": 1}
            ), line


async def test_each_websocket_is_routed_once_and_its_query_parsed_once(
    counted: Counter[str],
) -> None:
    running, relay = await start_relay()
    async with relay:
        counted.clear()
        async with running.connect("/subscribe?channel=c&deltas=1&rewind=2") as subscriber:
            assert (await recv_json(subscriber))["type"] == "subscribed"
            assert dict(counted) == {"parse_route": 1, "parse_qsl": 1}
            counted.clear()
            async with running.connect("/produce?channel=c&session=") as producer:
                assert producer.session["resumed"] is False  # ?session= empty: a new one
                await send_json(producer, {"id": "m1", "delta": "hi ", "final": True})
                assert (await recv_json(producer))["type"] == "ack"
                # The handler served it on the route's facts: the URL's channel.
                assert (await recv_json(subscriber))["channel"] == "c"
            assert dict(counted) == {"parse_route": 1, "parse_qsl": 1}
