"""The relay's abuse bounds on ``/v1/stream/`` (user streams and channel streams alike), on
a real relay over real sockets: bodies, request heads, long-polls in flight and SSE readers
per address."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest
from token_relay.core.durable import ENTRY_OVERHEAD, offset_text

from ..conftest import RunningRelay, start_relay
from ..harness import eventually
from ..harness.sse import SseReader

JSON = {"Content-Type": "application/json"}


def _http(running: RunningRelay) -> str:
    return running.url.replace("ws://", "http://")


def _port(running: RunningRelay) -> int:
    return int(running.url.rsplit(":", 1)[1])


async def _raw(port: int, request: bytes) -> bytes:
    """Send ``request`` on a fresh socket; the response's status line."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()


async def test_a_body_over_max_body_bytes_is_refused_before_it_is_read() -> None:
    running, server = await start_relay(max_body_bytes=1024)
    async with server, httpx.AsyncClient() as client:
        base = _http(running) + "/v1/stream/"
        assert (await client.put(base + "s", headers=JSON)).status_code == 201
        big = await client.post(base + "s", headers=JSON, content=b"[" + b"1," * 600 + b"1]")
        assert big.status_code == 413
        # Announced too big, none of it sent: refused at once, not waited for.
        status = await _raw(
            _port(running),
            b"POST /v1/stream/s HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000\r\n\r\n",
        )
        assert status.startswith(b"HTTP/1.1 413")
        # Nothing of either landed.
        read = await client.get(base + "s", params={"offset": "-1"})
        assert read.json() == []
        # A channel's stream refuses a write before its body too: it takes none.
        channel = await client.post(base + "__channel/c", headers=JSON, content=b"[1]")
        assert (channel.status_code, channel.json()["code"]) == (405, "read_only")


@pytest.mark.parametrize("broker", ["memory", "redis"])
async def test_a_body_of_many_tiny_messages_counts_each_ones_overhead(
    broker: str, request: pytest.FixtureRequest
) -> None:
    """1,000 one-byte messages in one body are 1,000 bytes of data, under a stream bound of
    4,096 as data alone; each is an entry, counted with ENTRY_OVERHEAD, so the append is
    refused (413 ``stream_full``) and nothing lands. Another stream's appends go on."""
    settings: dict[str, Any] = {"max_durable_stream_bytes": 4096}
    if broker == "redis":
        settings["broker"] = request.getfixturevalue("redis_server").url
    running, server = await start_relay(**settings)
    async with server, httpx.AsyncClient() as client:
        base = _http(running) + "/v1/stream/"
        assert (await client.put(base + "tiny", headers=JSON)).status_code == 201
        body = b"[" + b",".join([b"1"] * 1000) + b"]"
        refused = await client.post(base + "tiny", headers=JSON, content=body)
        assert refused.status_code == 413
        assert refused.json()["code"] == "stream_full"
        read = await client.get(base + "tiny", params={"offset": "-1"})
        assert (read.json(), read.headers["stream-next-offset"]) == ([], offset_text(0))
        assert (await client.put(base + "normal", headers=JSON)).status_code == 201
        messages = [b'{"n": 1}', b'{"n": 2}', b'"two"']
        first = await client.post(base + "normal", headers=JSON, content=messages[0])
        second = await client.post(
            base + "normal", headers=JSON, content=b"[" + b", ".join(messages[1:]) + b"]"
        )
        assert (first.status_code, second.status_code) == (204, 204)
        back = await client.get(base + "normal", params={"offset": "-1"})
        assert back.content == b"[" + b",".join(messages) + b"]"
        metrics = (await client.get(_http(running) + "/metrics")).text
    counted = sum(map(len, messages)) + len(messages) * ENTRY_OVERHEAD
    assert re.search(rf"^relay_durable_bytes {counted}\.0$", metrics, re.M), metrics


async def test_a_request_head_over_16_kib_gets_431(relay: RunningRelay) -> None:
    for path in (b"/v1/stream/s", b"/v1/stream/__channel/c"):
        status = await _raw(
            _port(relay),
            b"GET "
            + path
            + b"?offset=-1 HTTP/1.1\r\nHost: relay\r\nX-Pad: "
            + b"a" * 17_000
            + b"\r\n\r\n",
        )
        assert status.startswith(b"HTTP/1.1 431"), (path, status)


async def _long_poll(client: httpx.AsyncClient, url: str, offset: str) -> httpx.Response:
    return await client.get(url, params={"offset": offset, "live": "long-poll"})


async def test_long_polls_in_flight_count_per_address_until_they_end() -> None:
    running, server = await start_relay(max_connections_per_ip=2, long_poll_timeout=30)
    base = _http(running) + "/v1/stream/"
    limits = httpx.Limits(max_connections=10, max_keepalive_connections=0)
    async with server, httpx.AsyncClient(timeout=30, limits=limits) as client:
        made = await client.put(base + "s", headers=JSON)
        user_tail = made.headers["stream-next-offset"]
        channel_tail = (await client.head(base + "__channel/c")).headers["stream-next-offset"]
        polls = [
            asyncio.ensure_future(_long_poll(client, base + "s", user_tail)),
            asyncio.ensure_future(_long_poll(client, base + "__channel/c", channel_tail)),
        ]
        while not running.relay.channels.listening("c"):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        while running.relay.durable._polls < 1:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        third = await client.get(base + "s", params={"offset": "-1"})
        assert third.status_code == 429
        # The channel's poll goes: its connection no longer counts, and an append (from
        # the same address) answers the stream's poll.
        polls[1].cancel()
        while running.relay.gate.per_address.get("127.0.0.1", 0) >= 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        # Nor does the poll wait on (its 30 s) for a client that is gone.
        await eventually(
            lambda: running.relay.channels._polls == 0 and not running.relay.channels.listening("c")
        )
        appended = await client.post(base + "s", headers=JSON, content=b'{"n": 1}')
        assert appended.status_code == 204
        answered = await polls[0]
        assert (answered.status_code, answered.json()) == (200, [{"n": 1}])
        again = await client.get(base + "s", params={"offset": "-1"})
        assert again.status_code == 200


async def test_sse_readers_count_per_address_until_they_end() -> None:
    running, server = await start_relay(max_connections_per_ip=2)
    port = _port(running)
    async with server, httpx.AsyncClient() as client:
        assert (await client.put(_http(running) + "/v1/stream/s", headers=JSON)).status_code == 201
        paths = ["/v1/stream/s?offset=-1&live=sse", "/v1/stream/__channel/c?offset=-1&live=sse"]
        readers: list[Any] = [SseReader(port, path) for path in paths]
        for reader in readers:
            await reader.__aenter__()
            assert reader.status == 200
            assert (await reader.next()).event == "control"
        status = await _raw(
            port, b"GET /v1/stream/s?offset=-1&live=sse HTTP/1.1\r\nHost: relay\r\n\r\n"
        )
        assert status.startswith(b"HTTP/1.1 429"), status
        await readers[0].__aexit__()
        while running.relay.gate.per_address.get("127.0.0.1", 0) >= 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        # and its reader ends then, not at the response's lifetime (60 s)
        await eventually(lambda: not running.relay.durable._waiters)
        async with SseReader(port, paths[1]) as again:
            assert again.status == 200
        await readers[1].__aexit__()
        await eventually(lambda: not running.relay.channels.listening("c"))


async def _relay_on(broker: str, request: pytest.FixtureRequest) -> tuple[RunningRelay, Any]:
    """A relay on ``broker``: ``memory``, or ``redis`` (a private ``redis-server``)."""
    settings: dict[str, Any] = {}
    if broker == "redis":
        settings["broker"] = request.getfixturevalue("redis_server").url
    return await start_relay(**settings)


@pytest.mark.parametrize("broker", ["memory", "redis"])
async def test_a_pattern_over_streams_made_and_expired_holds_no_link_to_each(
    broker: str, request: pytest.FixtureRequest
) -> None:
    """300 streams a subscription's pattern matches, each made with ``Stream-TTL: 0`` and
    looked up at once (404: dropped at the lookup, before any sweep): the subscription keeps
    no link to each gone stream (it kept all 300, in Redis too, growing without bound past
    ``--max-durable-streams``), only to the streams there are."""
    running, server = await _relay_on(broker, request)
    async with server, httpx.AsyncClient() as client:
        base = _http(running) + "/v1/stream/"
        assert (await client.put(base + "wakes", headers=JSON)).status_code == 201
        config = {"type": "pull-wake", "pattern": "g/*", "wake_stream": "wakes"}
        made = await client.put(base + "__ds/subscriptions/s", json=config)
        assert made.status_code == 201
        for n in range(300):
            put = await client.put(base + f"g/{n}", headers={"Stream-TTL": "0"})
            assert put.status_code == 201
            gone = await client.get(base + f"g/{n}", params={"offset": "-1"})
            assert gone.status_code == 404
        assert (await client.put(base + "g/live", headers=JSON)).status_code == 201
        state = (await client.get(base + "__ds/subscriptions/s")).json()
        assert [link["path"] for link in state["streams"]] == ["g/live"]


@pytest.mark.parametrize("broker", ["memory", "redis"])
async def test_a_subscription_naming_a_mebibyte_of_explicit_paths_is_refused(
    broker: str, request: pytest.FixtureRequest
) -> None:
    """1,000 explicit streams of 1,000 characters (within the count, naming no stream) were
    a mebibyte kept per subscription, 1,000 subscriptions a gibibyte outside
    ``--max-memory-bytes`` (in Redis too): refused whole (400), and nothing is kept."""
    running, server = await _relay_on(broker, request)
    async with server, httpx.AsyncClient() as client:
        base = _http(running) + "/v1/stream/__ds/subscriptions/"
        streams = [f"{n:04d}/" + "p" * 995 for n in range(1000)]
        config = {"type": "webhook", "webhook": {"url": "http://127.0.0.1:9/"}}
        refused = await client.put(base + "big", json={**config, "streams": streams})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "INVALID_REQUEST"
        assert (await client.get(base + "big")).status_code == 404
        made = await client.put(base + "small", json={**config, "streams": streams[:60]})
        assert made.status_code == 201
        more = await client.post(base + "small/streams", json={"streams": streams[60:70]})
        assert more.status_code == 400
        state = (await client.get(base + "small")).json()
        assert len(state["streams"]) == 60
