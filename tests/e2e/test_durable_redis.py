"""Durable Streams kept in Redis, on real relay processes' servers over real sockets: two
relays on one real ``redis-server`` serve every stream, a reader on one is woken by a write
on the other, the checks hold across both, and a Redis outage is answered 503 until Redis
is back."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack

import httpx
import pytest
from redis.asyncio import Redis
from token_relay.core.durable import ENTRY_OVERHEAD

from ..conftest import RunningRelay, start_relay
from ..harness import (
    Proxy,
    RedisServer,
    ServiceProcess,
    WebhookReceiver,
    eventually,
    relay_process,
    relays_on,
)
from .test_durable import _verify

JSON = {"Content-Type": "application/json"}
TEXT = {"Content-Type": "text/plain"}


def _http(running: RunningRelay) -> str:
    return running.url.replace("ws://", "http://") + "/v1/stream/"


@pytest.fixture
async def pair(redis_server: RedisServer) -> AsyncIterator[tuple[RunningRelay, RunningRelay]]:
    """Two relays on one redis-server."""
    async with AsyncExitStack() as stack:
        relays = []
        for _ in range(2):
            running, server = await start_relay(broker=redis_server.url)
            await stack.enter_async_context(server)
            relays.append(running)
        yield relays[0], relays[1]


async def test_a_stream_made_on_one_relay_is_appended_and_read_on_the_other(
    pair: tuple[RunningRelay, RunningRelay],
) -> None:
    a, b = (_http(running) + "s" for running in pair)
    async with httpx.AsyncClient() as client:
        made = await client.put(a, headers=TEXT, content=b"hello ")
        assert made.status_code == 201
        again = await client.put(b, headers=TEXT)
        assert again.status_code == 200  # the same stream, seen from the other relay
        appended = await client.post(b, headers=TEXT, content=b"world")
        assert appended.status_code == 204
        read = await client.get(a, params={"offset": "-1"})
        assert (read.status_code, read.content) == (200, b"hello world")
        assert read.headers["stream-next-offset"] == appended.headers["stream-next-offset"]
        middle = await client.get(b, params={"offset": made.headers["stream-next-offset"]})
        assert middle.content == b"world"
        assert (await client.delete(a)).status_code == 204
        assert (await client.head(b)).status_code == 404


async def test_producer_fencing_and_sequences_hold_across_relays(
    pair: tuple[RunningRelay, RunningRelay],
) -> None:
    a, b = (_http(running) + "p" for running in pair)

    def producer(epoch: int, seq: int) -> dict[str, str]:
        return {
            **JSON,
            "Producer-Id": "w",
            "Producer-Epoch": str(epoch),
            "Producer-Seq": str(seq),
        }

    async with httpx.AsyncClient() as client:
        await client.put(a, headers=JSON)
        assert (await client.post(a, headers=producer(0, 0), content=b"[1]")).status_code == 200
        duplicate = await client.post(b, headers=producer(0, 0), content=b"[1]")
        assert duplicate.status_code == 204
        gap = await client.post(b, headers=producer(0, 2), content=b"[3]")
        assert (gap.status_code, gap.headers["producer-expected-seq"]) == (409, "1")
        assert (await client.post(b, headers=producer(1, 0), content=b"[2]")).status_code == 200
        fenced = await client.post(a, headers=producer(0, 1), content=b"[9]")
        assert (fenced.status_code, fenced.headers["producer-epoch"]) == (403, "1")
        seq = {**JSON, "Stream-Seq": "b"}
        assert (await client.post(a, headers=seq, content=b"[4]")).status_code == 204
        regress = await client.post(b, headers={**JSON, "Stream-Seq": "a"}, content=b"[5]")
        assert regress.status_code == 409
        read = await client.get(b, params={"offset": "-1"})
    assert json.loads(read.content) == [1, 2, 4]


async def test_concurrent_producers_on_both_relays_never_pass_one_check_twice(
    pair: tuple[RunningRelay, RunningRelay],
) -> None:
    urls = [_http(running) + "race" for running in pair]
    async with httpx.AsyncClient() as client:
        await client.put(urls[0], headers=JSON)

        async def send(index: int) -> int:
            headers = {**JSON, "Producer-Id": "one", "Producer-Epoch": "0", "Producer-Seq": "0"}
            answer = await client.post(urls[index % 2], headers=headers, content=f"[{index}]")
            return answer.status_code

        statuses = await asyncio.gather(*(send(index) for index in range(20)))
        read = await client.get(urls[1], params={"offset": "-1"})
    assert sorted(statuses) == [200] + [204] * 19  # one appended, every other a duplicate
    assert len(json.loads(read.content)) == 1


async def test_many_concurrent_appends_to_one_stream_on_both_relays_all_land_once(
    pair: tuple[RunningRelay, RunningRelay],
) -> None:
    urls = [_http(running) + "busy" for running in pair]
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        await client.put(urls[0], headers=JSON)

        async def send(index: int) -> int:
            answer = await client.post(urls[index % 2], headers=JSON, content=f"[{index}]")
            return answer.status_code

        statuses = await asyncio.gather(*(send(index) for index in range(200)))
        read = await client.get(urls[1], params={"offset": "-1"})
    # A relay's own writes to one stream take turns: none is refused stream_busy.
    assert statuses == [204] * 200
    assert sorted(json.loads(read.content)) == list(range(200))


async def test_a_long_poll_on_one_relay_is_woken_by_an_append_on_the_other(
    pair: tuple[RunningRelay, RunningRelay],
) -> None:
    a, b = (_http(running) + "wake" for running in pair)
    async with httpx.AsyncClient() as client:
        made = await client.put(a, headers=JSON)
        waiting = asyncio.create_task(
            client.get(
                b,
                params={"offset": made.headers["stream-next-offset"], "live": "long-poll"},
                timeout=30,
            )
        )
        # Sent once the poll on B waits with its topic subscribed: the wake must cross.
        await eventually(
            lambda: (
                bool(pair[1].relay.durable._waiters)
                and bool(pair[1].relay.durable.store._wakes._topics)
            ),  # type: ignore[attr-defined]
            what="a long-poll waiting on B",
        )
        assert (await client.post(a, headers=JSON, content=b'{"n":1}')).status_code == 204
        answer = await waiting
    assert answer.status_code == 200
    assert json.loads(answer.content) == [{"n": 1}]


async def _read_and_leave(
    port: int, target: str, leave: asyncio.Event, first: bytes = b""
) -> bytes:
    """A live read on a raw socket, closed (the client gone) once ``leave`` is set, and
    once ``first`` came of it: what came of it by then."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    came = b""
    try:
        writer.write(f"GET {target} HTTP/1.1\r\nHost: relay\r\n\r\n".encode())
        await writer.drain()
        if first:
            came = await asyncio.wait_for(reader.readuntil(first), 10)
        await leave.wait()
    finally:
        writer.close()
    return came + await reader.read()


async def _poll_and_leave(port: int, target: str, leave: asyncio.Event) -> None:
    """A long-poll, left before its answer."""
    assert await _read_and_leave(port, target, leave) == b""  # the poll was still waiting


async def test_long_polls_whose_clients_go_away_end_at_once_mid_round_trip_or_waiting(
    pair: tuple[RunningRelay, RunningRelay],
) -> None:
    """A long-poll whose socket closes stops waiting then, not at ``--long-poll-timeout``,
    on a user stream and on a channel's stream alike: nothing of it is left on the relay.
    Half the clients go while their polls still make their first round trips to Redis,
    half once every poll waits; what runs to Redis then is never cut short, and the relay
    serves on."""
    a, b = pair
    base = _http(a)
    port = int(a.url.rsplit(":", 1)[1])
    async with httpx.AsyncClient() as client:
        made = await client.put(base + "left", headers=JSON)
        tail = made.headers["stream-next-offset"]
        channel = await client.head(base + "__channel/left")
        channel_tail = channel.headers["stream-next-offset"]
    targets = [
        f"/v1/stream/left?offset={tail}&live=long-poll",
        f"/v1/stream/__channel/left?offset={channel_tail}&live=long-poll",
    ] * 20
    early, late = asyncio.Event(), asyncio.Event()
    polls = [
        asyncio.create_task(_poll_and_leave(port, target, early if i % 4 < 2 else late))
        for i, target in enumerate(targets)
    ]
    await eventually(lambda: a.relay.durable._polls + a.relay.channels._polls > 0)
    early.set()  # some polls are still on their way to Redis: they go at once
    await eventually(
        lambda: a.relay.durable._polls == a.relay.channels._polls == 10,
        what="the polls left waiting",
    )
    late.set()
    await asyncio.gather(*polls)
    await eventually(
        lambda: (
            a.relay.durable._polls == a.relay.channels._polls == 0
            and not a.relay.durable._waiters
            and not a.relay.channels.listening("left")
        ),
        what="every poll ended and forgotten",  # within 5 s, not the timeout's 30
    )
    async with httpx.AsyncClient(timeout=30) as client:
        waiting = asyncio.create_task(
            client.get(base + "left", params={"offset": tail, "live": "long-poll"})
        )
        # Appended once the new poll is under way: at any step, its wake or its own
        # look finds the append.
        await eventually(lambda: a.relay.durable._polls == 1, what="a new poll under way")
        appended = await client.post(_http(b) + "left", headers=JSON, content=b'{"n":1}')
        assert appended.status_code == 204
        answer = await waiting
    assert (answer.status_code, json.loads(answer.content)) == (200, [{"n": 1}])


async def test_sse_readers_whose_clients_go_away_end_at_once(
    pair: tuple[RunningRelay, RunningRelay],
) -> None:
    """A Durable Streams SSE reader whose socket closes ends then, not at the response's
    lifetime (60 s), on a user stream and a channel's stream alike; a reader that stays
    gets an append made on the other relay."""
    a, b = pair
    base = _http(a)
    port = int(a.url.rsplit(":", 1)[1])
    async with httpx.AsyncClient() as client:
        assert (await client.put(base + "gone", headers=JSON)).status_code == 201
    targets = ["/v1/stream/gone?offset=-1&live=sse", "/v1/stream/__channel/gone?offset=-1&live=sse"]
    leave = asyncio.Event()
    readers = [
        asyncio.create_task(_read_and_leave(port, target, leave, b"event: control"))
        for target in targets * 10
    ]
    await eventually(
        lambda: (
            len(a.relay.durable._waiters._by_key.get("/v1/stream/gone", ())) == 10
            and a.relay.channels._readers.get("gone") == 10
        ),
        what="every reader waiting",
    )
    leave.set()
    for came in await asyncio.gather(*readers):
        assert came.startswith(b"HTTP/1.1 200 ") and b"event: control" in came
    await eventually(
        lambda: not a.relay.durable._waiters and not a.relay.channels.listening("gone"),
        what="every reader ended and forgotten",  # within 5 s, not the response's 60
    )
    async with (
        httpx.AsyncClient(timeout=10) as client,
        client.stream("GET", base + "gone", params={"offset": "-1", "live": "sse"}) as stream,
    ):
        await eventually(lambda: bool(a.relay.durable._waiters), what="a new reader waiting")
        appended = await client.post(_http(b) + "gone", headers=JSON, content=b'{"n":1}')
        assert appended.status_code == 204
        seen = ""
        async for line in stream.aiter_lines():
            seen += line + "\n"
            if '{"n":1}' in seen:
                break
    assert 'data:[{"n":1}]' in seen


async def _http_text(port: int, request: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request.encode())
        data = (await asyncio.wait_for(reader.read(), 10)).decode("latin-1")
    finally:
        writer.close()
    return int(data.split(" ", 2)[1]), data


async def _live_reads(relays: Sequence[ServiceProcess]) -> dict[str, float]:
    """Durable Streams live reads in progress on all ``relays`` (every worker of each), by
    kind, from their /metrics."""
    found = {"long_poll": 0.0, "sse": 0.0}
    for relay in relays:
        _, text = await _http_text(
            relay.port, "GET /metrics HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n"
        )
        samples = re.findall(r"^relay_durable_live_reads\{([^}]*)\} (\S+)$", text, re.M)
        assert samples, text
        for labels, value in samples:
            kind = re.search(r'kind="([^"]*)"', labels)
            assert kind is not None and kind.group(1) in found, labels
            found[kind.group(1)] += float(value)
    return found


async def live_reads_end_with_their_clients(
    port: int, relays: Sequence[ServiceProcess], cut: Callable[[], object] | None = None
) -> None:
    """Long-polls and SSE reads, through ``port``, on a user stream and a channel's, three
    of each; then their clients go (each closes its socket, or ``cut()`` drops them all):
    every read must end on ``relays`` within 5 s, not at its timeout (30 s for a long-poll,
    60 s for an SSE response)."""
    status, _ = await _http_text(
        port,
        "PUT /v1/stream/left HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n"
        "Content-Type: application/json\r\nContent-Length: 0\r\n\r\n",
    )
    assert status == 201
    assert await _live_reads(relays) == {"long_poll": 0.0, "sse": 0.0}
    reads = [
        ("/v1/stream/left?offset=now&live=long-poll", b""),
        ("/v1/stream/__channel/left?offset=now&live=long-poll", b""),
        ("/v1/stream/left?offset=-1&live=sse", b"event: control"),
        ("/v1/stream/__channel/left?offset=-1&live=sse", b"event: control"),
    ] * 3
    sockets = []
    try:
        for target, first in reads:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            sockets.append(writer)
            writer.write(f"GET {target} HTTP/1.1\r\nHost: relay\r\n\r\n".encode())
            if first:
                await asyncio.wait_for(reader.readuntil(first), 10)

        async def all_reading() -> bool:
            return await _live_reads(relays) == {"long_poll": 6.0, "sse": 6.0}

        await eventually(all_reading, what="every read in progress on the relays")
        if cut is not None:
            cut()
    finally:
        for writer in sockets:
            writer.close()

    async def all_ended() -> bool:
        return await _live_reads(relays) == {"long_poll": 0.0, "sse": 0.0}

    await eventually(all_ended, what="every read ended on the relays")  # within 5 s


async def test_live_reads_whose_clients_go_end_on_workers_of_one_relay(
    redis_server: RedisServer,
) -> None:
    """``--workers 2`` on Redis: the workers share the port, and each read ends on the
    worker that serves it (/metrics sums every worker's)."""
    relay = relay_process("--broker", redis_server.url, "--workers", "2")
    await relay.start()
    try:
        await live_reads_end_with_their_clients(relay.port, [relay])
    finally:
        await relay.stop()


async def test_live_reads_end_when_a_proxy_cuts_their_connections(
    redis_server: RedisServer,
) -> None:
    """A proxy between the clients and the relay drops every connection at once, as a
    network failure would: the relay sees its sockets reset, and each read ends then."""
    relay = relay_process("--broker", redis_server.url)
    await relay.start()
    try:
        async with Proxy(relay.port) as proxy:
            await live_reads_end_with_their_clients(proxy.port, [relay], proxy.cut)
    finally:
        await relay.stop()


async def test_an_sse_reader_on_one_relay_gets_appends_made_on_the_other(
    pair: tuple[RunningRelay, RunningRelay],
) -> None:
    a, b = (_http(running) + "sse" for running in pair)
    async with httpx.AsyncClient(timeout=30) as client:
        await client.put(a, headers=TEXT, content=b"one")
        async with client.stream("GET", b, params={"offset": "-1", "live": "sse"}) as events:
            lines = events.aiter_lines()
            seen: list[str] = []
            while "data:one" not in seen:
                seen.append(await anext(lines))
            await client.post(a, headers={**TEXT, "Stream-Closed": "true"}, content=b"two")
            async for line in lines:
                seen.append(line)
    assert "data:two" in seen
    assert any('"streamClosed":true' in line for line in seen)


async def test_bounds_are_counted_in_redis_for_every_relay(redis_server: RedisServer) -> None:
    async with AsyncExitStack() as stack:
        urls = []
        for _ in range(2):
            running, server = await start_relay(
                broker=redis_server.url, max_durable_streams=2, max_durable_stream_bytes=10
            )
            await stack.enter_async_context(server)
            urls.append(_http(running))
        async with httpx.AsyncClient() as client:
            assert (await client.put(urls[0] + "x", headers=TEXT)).status_code == 201
            assert (await client.put(urls[1] + "y", headers=TEXT)).status_code == 201
            third = await client.put(urls[1] + "z", headers=TEXT)
            assert (third.status_code, third.json()["code"]) == (507, "too_many_streams")
            full = await client.post(urls[1] + "x", headers=TEXT, content=b"12345678901")
            assert (full.status_code, full.json()["code"]) == (413, "stream_full")
            assert (await client.delete(urls[0] + "y")).status_code == 204
            assert (await client.put(urls[1] + "z", headers=TEXT)).status_code == 201


async def test_streams_refuse_503_while_redis_is_down_and_serve_once_it_is_back(
    redis_server: RedisServer,
) -> None:
    running, server = await start_relay(broker=redis_server.url)
    url = _http(running) + "down"
    async with server, httpx.AsyncClient() as client:
        assert (await client.put(url, headers=TEXT, content=b"x")).status_code == 201
        async with client.stream("GET", url, params={"offset": "-1", "live": "sse"}) as events:
            lines = events.aiter_lines()
            while await anext(lines) != "data:x":
                pass
            await eventually(
                lambda: bool(running.relay.durable._waiters), what="the SSE read waiting"
            )
            redis_server.kill()
            rest = [line async for line in lines]  # the live read ends: Redis is gone
        assert "data:x" not in rest
        down = await client.get(url, params={"offset": "-1"})
        assert (down.status_code, down.json()["code"]) == (503, "broker_unavailable")
        refused = await client.post(url, headers=TEXT, content=b"y")
        assert (refused.status_code, refused.json()["code"]) == (503, "broker_unavailable")
        redis_server.start()  # a restart loses every stream: Redis keeps none on disk

        async def made() -> bool:
            return (await client.put(url, headers=TEXT, content=b"z")).status_code == 201

        await eventually(made, timeout=20, what="a stream made once Redis is back")
        read = await client.get(url, params={"offset": "-1"})
    assert (read.status_code, read.content) == (200, b"z")


async def test_keys_are_named_as_documented_and_expire_after_the_stream(
    pair: tuple[RunningRelay, RunningRelay], redis_server: RedisServer
) -> None:
    url = _http(pair[0]) + "keys"
    async with httpx.AsyncClient() as client:
        made = await client.put(url, headers={**TEXT, "Stream-TTL": "100"}, content=b"abc")
        assert made.status_code == 201
    redis = Redis.from_url(redis_server.url)
    try:
        stream_id = await redis.get("tr:ds:p:/v1/stream/keys")
        assert stream_id is not None
        fields = await redis.hgetall(f"tr:ds:s:{stream_id.decode()}")
        counted = b"%d" % (3 + ENTRY_OVERHEAD)  # its data and one entry's overhead
        assert (fields[b"bytes"], fields[b"ttl"], fields[b"path"]) == (
            counted,
            b"100",
            b"/v1/stream/keys",
        )
        assert await redis.hgetall(f"tr:ds:l:{stream_id.decode()}") == {b"0": b"abc"}
        assert await redis.mget("tr:ds:count", "tr:ds:bytes") == [b"1", counted]
        for key in ("tr:ds:p:/v1/stream/keys", f"tr:ds:s:{stream_id.decode()}"):
            # The stream's TTL, and the sweep's minute of grace after it.
            assert 100_000 < await redis.pttl(key) <= 160_000
    finally:
        await redis.aclose()


async def test_two_relay_processes_a_long_poll_on_one_woken_by_an_append_on_the_other(
    redis_server: RedisServer,
) -> None:
    topic = "tr:ds:w:/v1/stream/procs"
    redis = Redis.from_url(redis_server.url)
    async with relays_on(redis_server.url, "--long-poll-timeout", "60") as (first, second):
        a, b = (
            relay.url.replace("ws://", "http://") + "/v1/stream/procs" for relay in (first, second)
        )
        try:
            async with httpx.AsyncClient(timeout=90) as client:
                made = await client.put(a, headers=JSON)
                offset = made.headers["stream-next-offset"]
                waiting = asyncio.create_task(
                    client.get(b, params={"offset": offset, "live": "long-poll"})
                )

                async def subscribed() -> bool:
                    return dict(await redis.pubsub_numsub(topic)).get(topic.encode()) == 1

                # B listens on the path's topic only while its long-poll waits, and it looked
                # at the tail once subscribed: the append sent now reaches it through Redis.
                await eventually(subscribed, what="the long-poll on B waiting")
                assert not waiting.done()
                assert (await client.post(a, headers=JSON, content=b'"hi"')).status_code == 204
                answer = await waiting
        finally:
            await redis.aclose()
        assert (first.tracebacks, second.tracebacks) == (0, 0)
    assert (answer.status_code, json.loads(answer.content)) == (200, ["hi"])


async def test_a_webhook_subscription_made_on_one_relay_is_woken_and_called_back_on_the_other(
    pair: tuple[RunningRelay, RunningRelay], redis_server: RedisServer
) -> None:
    one, other = _http(pair[0]), _http(pair[1])
    with WebhookReceiver() as receiver:
        async with httpx.AsyncClient() as client:
            config = {"type": "webhook", "pattern": "jobs/*", "webhook": {"url": receiver.url}}
            made = await client.put(one + "__ds/subscriptions/jobs", json=config)
            assert made.status_code == 201
            again = await client.put(other + "__ds/subscriptions/jobs", json=config)
            assert again.status_code == 200  # the same subscription, seen from the other
            stream = await client.put(other + "jobs/1", headers=TEXT, content=b"work")
            tail = stream.headers["stream-next-offset"]
            await eventually(lambda: len(receiver.received) == 1, timeout=15, what="a wake")
            (post,) = receiver.received
            jwks = [(await client.get(base + "__ds/jwks.json")).json() for base in (one, other)]
            assert jwks[0] == jwks[1]
            for keys in jwks:
                assert _verify(post.headers["webhook-signature"], post.body, keys)
            wake = post.json()
            assert (wake["subscription_id"], wake["generation"]) == ("jobs", 1)
            assert [row["tail_offset"] for row in wake["streams"]] == [tail]
            # The wake's callback URL names the relay the subscription was made on: the
            # callback is sent to the other one, and its token holds there too.
            assert wake["callback_url"] == one + "__ds/subscriptions/jobs/callback"
            callback = other + "__ds/subscriptions/jobs/callback"
            bearer = {"Authorization": f"Bearer {wake['callback_token']}"}
            ack = {
                "wake_id": wake["wake_id"],
                "generation": 1,
                "acks": [{"stream": "jobs/1", "offset": tail}],
            }
            extended = await client.post(callback, json=ack, headers=bearer)
            assert (extended.status_code, extended.json()) == (
                200,
                {"ok": True, "next_wake": False},
            )
            done = await client.post(
                one + "__ds/subscriptions/jobs/callback", json={**ack, "done": True}, headers=bearer
            )
            assert (done.status_code, done.json()) == (200, {"ok": True, "next_wake": False})
            fenced = await client.post(callback, json={**ack, "done": True}, headers=bearer)
            assert (fenced.status_code, fenced.json()["error"]["code"]) == (409, "FENCED")
            states = [
                (await client.get(base + "__ds/subscriptions/jobs")).json() for base in (one, other)
            ]
            assert states[0] == states[1]
            assert states[0]["streams"] == [
                {"path": "jobs/1", "link_type": "glob", "acked_offset": tail}
            ]
            gone = await client.delete(other + "__ds/subscriptions/jobs")
            assert gone.status_code == 204
            missing = await client.get(one + "__ds/subscriptions/jobs")
            assert (missing.status_code, missing.json()["error"]["code"]) == (404, "NOT_FOUND")
    assert len(receiver.received) == 1
    redis = Redis.from_url(redis_server.url)
    try:
        assert await redis.hlen("tr:ds:subs") == 0
        assert sorted(await redis.hkeys("tr:ds:subs:keys")) == [b"ed25519", b"hmac"]
    finally:
        await redis.aclose()


async def test_claims_raced_on_both_relays_give_each_wake_to_one_worker(
    pair: tuple[RunningRelay, RunningRelay],
) -> None:
    one, other = _http(pair[0]), _http(pair[1])
    async with httpx.AsyncClient() as client:
        wakes = await client.put(one + "wakes", headers={"Content-Type": "application/json"})
        assert wakes.status_code == 201
        names = [f"s{n}" for n in range(8)]
        for name in names:
            config = {"type": "pull-wake", "streams": [f"tasks/{name}"], "wake_stream": "wakes"}
            made = await client.put(other + f"__ds/subscriptions/{name}", json=config)
            assert made.status_code == 201
            task = await client.put(one + f"tasks/{name}", headers=TEXT, content=b"job")
            assert task.status_code == 201

        async def claim(base: str, name: str, worker: str) -> httpx.Response:
            url = base + f"__ds/subscriptions/{name}/claim"
            return await client.post(url, json={"worker": worker})

        for name in names:
            first, second = await asyncio.gather(
                claim(one, name, "worker-a"), claim(other, name, "worker-b")
            )
            statuses = sorted([first.status_code, second.status_code])
            assert statuses == [200, 409], (name, first.text, second.text)
            won, lost = (first, second) if first.status_code == 200 else (second, first)
            assert lost.json()["error"]["code"] == "ALREADY_CLAIMED"
            assert lost.json()["error"]["current_holder"] in ("worker-a", "worker-b")
            wake = won.json()
            assert wake["generation"] == 1
            # Acked and done through the relay that lost the claim: one wake, one end.
            bearer = {"Authorization": f"Bearer {wake['token']}"}
            tail = wake["streams"][0]["tail_offset"]
            ack = {
                "wake_id": wake["wake_id"],
                "generation": 1,
                "acks": [{"stream": f"tasks/{name}", "offset": tail}],
                "done": True,
            }
            acked = await asyncio.gather(
                client.post(one + f"__ds/subscriptions/{name}/ack", json=ack, headers=bearer),
                client.post(other + f"__ds/subscriptions/{name}/ack", json=ack, headers=bearer),
            )
            assert sorted(response.status_code for response in acked) == [200, 409]
            nothing = await claim(one, name, "worker-a")
            assert nothing.json()["error"]["code"] == "NO_PENDING_WORK"
        events = await client.get(one + "wakes", params={"offset": "-1"})
    woken = sorted(event["subscription_id"] for event in events.json())
    assert woken == names
