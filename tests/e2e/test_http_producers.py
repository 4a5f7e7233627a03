"""HTTP producers over real sockets: JSON and NDJSON bodies (applied as each line arrives),
named producers whose messages continue across requests (and across processes on Redis),
and the statuses of refusals."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from redis.asyncio import Redis
from token_relay.core.grants import Role
from token_relay.tokens import mint

from ..conftest import RunningRelay, connect, recv_json, start_relay
from ..harness import Proxy, RedisServer, ServiceProcess, eventually, relay_process

SECRET = "http-producer-secret-of-at-least-32-bytes"


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def _post(
    port: int, path: str, body: bytes, content_type: str = "application/json"
) -> tuple[int, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    response = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    status = int(response.split()[1])
    payload = response.partition(b"\r\n\r\n")[2]
    return status, json.loads(payload) if payload.startswith(b"{") else payload


def _lines(*events: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(event).encode() + b"\n" for event in events)


async def test_a_json_body_is_one_frame_with_the_websocket_rules(relay: RunningRelay) -> None:
    port = _port(relay.url)
    async with relay.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        one = json.dumps({"id": "a", "delta": "single", "final": True}).encode()
        status, answer = await _post(port, "/produce?channel=c", one)
        assert status == 200
        assert answer == {
            "acks": [{"type": "ack", "id": "a", "channel": "c"}],
            "errors": [],
            "cancels": [],
        }
        batch = json.dumps(
            [
                {"id": "b", "delta": "Hel"},
                {"id": "b", "delta": "lo", "final": True},
                {"id": "x", "seq": 2},
            ]
        ).encode()
        status, answer = await _post(port, "/produce?channel=c", batch)
        assert status == 200
        assert [ack["id"] for ack in answer["acks"]] == ["b"]
        assert [(e["code"], e["index"]) for e in answer["errors"]] == [("seq_gap", 2)]
        assert [(await recv_json(sub))["text"] for _ in range(2)] == ["single", "Hello"]
        # Without a name, what is unfinished at the end of the body is aborted.
        status, _ = await _post(port, "/produce?channel=c", b'{"id": "cut", "delta": "half"}')
        aborted = await recv_json(sub)
        assert (status, aborted["type"], aborted["reason"]) == (
            200,
            "aborted",
            "producer_disconnected",
        )
        status, answer = await _post(port, "/produce?channel=c", b"{not json")
        assert (status, answer["errors"][0]["code"]) == (400, "invalid_json")


async def test_ndjson_lines_are_applied_as_they_arrive(relay: RunningRelay) -> None:
    port = _port(relay.url)
    async with relay.connect("/subscribe?channel=c&deltas=1") as sub:
        await recv_json(sub)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /produce?channel=c HTTP/1.1\r\nHost: r\r\nContent-Type: application/x-ndjson"
            b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        for n in range(5):
            line = json.dumps({"id": "s", "delta": f"{n} "}).encode() + b"\n"
            writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            await writer.drain()
            # Each delta reaches the subscriber while the body is still open.
            assert (await recv_json(sub, 2))["delta"] == f"{n} "
        last = _lines({"id": "s", "final": True}, {"id": "s", "delta": "late"})
        writer.write(f"{len(last):x}\r\n".encode() + last + b"\r\n0\r\n\r\n")
        response = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        answer = json.loads(response.partition(b"\r\n\r\n")[2])
        assert response.startswith(b"HTTP/1.1 200 ") and [a["id"] for a in answer["acks"]] == ["s"]
        assert (await recv_json(sub))["text"] == "0 1 2 3 4 "


async def test_a_named_producer_continues_across_requests_and_gets_its_cancels() -> None:
    running, relay = await start_relay(secret=SECRET)
    port = _port(running.url)
    token = mint(SECRET, Role.PRODUCE, ["c"], 60)
    other = mint(SECRET, Role.PRODUCE, ["c", "d"], 60)
    reader = mint(SECRET, Role.SUBSCRIBE, ["c"], 60)
    path = f"/produce?channel=c&producer=gw-1&token={token}"
    ndjson = "application/x-ndjson"
    async with relay, running.connect(f"/subscribe?channel=c&token={reader}") as sub:
        await recv_json(sub)
        status, answer = await _post(
            port, path, _lines({"id": "r", "delta": "one ", "seq": 1}), ndjson
        )
        assert (status, answer["errors"]) == (200, [])
        # Stop pressed while the gateway is between requests: its next response carries it.
        stop = json.dumps({"channel": "c", "id": "r"}).encode()
        assert (await _post(port, f"/cancel?token={reader}", stop))[0] == 204
        # A retry of seq 1 is a duplicate; seq 2 goes on.
        again = _lines(
            {"id": "r", "delta": "one ", "seq": 1}, {"id": "r", "delta": "two", "seq": 2}
        )
        status, answer = await _post(port, path, again, ndjson)
        assert (status, answer["errors"], answer["cancels"]) == (
            200,
            [],
            [{"type": "cancel", "channel": "c", "id": "r"}],
        )
        # Another token with the same name is another producer: the message is not its own.
        stolen = f"/produce?channel=c&producer=gw-1&token={other}"
        status, answer = await _post(port, stolen, _lines({"id": "r", "final": True}), ndjson)
        assert [error["code"] for error in answer["errors"]] == ["id_in_use"]
        status, answer = await _post(
            port, path, _lines({"id": "r", "final": True, "seq": 3}), ndjson
        )
        assert [ack["id"] for ack in answer["acks"]] == ["r"]
        assert (await recv_json(sub))["text"] == "one two"


async def test_refusals_have_their_statuses() -> None:
    running, relay = await start_relay(secret=SECRET, max_events_per_second=2, max_body_bytes=1000)
    port = _port(running.url)
    token = mint(SECRET, Role.PRODUCE, ["c"], 60)
    reader = mint(SECRET, Role.SUBSCRIBE, ["c"], 60)
    event = b'{"id": "m", "delta": "x", "final": true}'
    async with relay:
        assert (await _post(port, "/produce?channel=c", event))[0] == 401
        assert (await _post(port, f"/produce?channel=c&token={reader}", event))[0] == 403
        big = json.dumps({"id": "m", "delta": "x" * 1300}).encode()
        assert (await _post(port, f"/produce?channel=c&token={token}", big))[0] == 413
        burst = _lines(*({"id": f"m{n}", "delta": "x", "final": True} for n in range(5)))
        status, answer = await _post(
            port, f"/produce?channel=c&token={token}", burst, "application/x-ndjson"
        )
        assert status == 429 and "rate_limited" in {e["code"] for e in answer["errors"]}
        assert 1 <= len(answer["acks"]) <= 3


@pytest.mark.parametrize("latency", [0.0, 0.05], ids=["near", "slow-redis"])
async def test_a_named_producer_continues_on_another_process(
    redis_server: RedisServer, latency: float
) -> None:
    # With latency, the first process reaches Redis through a slow link: its answer must
    # still come only once what it applied is in Redis, or the other process, which reaches
    # Redis at once, would find no message to continue.
    async with Proxy(redis_server.port) as link:
        link.delay = latency
        a = relay_process("--broker", f"redis://127.0.0.1:{link.port}/0")
        b = relay_process("--broker", redis_server.url)
        await _continue_on_another_process(a, b)


async def _continue_on_another_process(a: ServiceProcess, b: ServiceProcess) -> None:
    await asyncio.gather(a.start(), b.start())
    try:
        async with running_sub(b.url) as sub:
            ndjson = "application/x-ndjson"
            path = "/produce?channel=c&producer=lambda-7"
            first = _lines({"id": "z", "delta": "from a, ", "seq": 1})
            assert (await _post(a.port, path, first, ndjson))[0] == 200
            rest = _lines(
                {"id": "z", "delta": "from b", "seq": 2}, {"id": "z", "final": True, "seq": 3}
            )
            status, answer = await _post(b.port, path, rest, ndjson)
            assert (status, [ack["id"] for ack in answer["acks"]]) == (200, ["z"]), answer
            assert (await recv_json(sub))["text"] == "from a, from b"
    finally:
        await asyncio.gather(a.stop(), b.stop())


def running_sub(url: str) -> Any:
    from contextlib import asynccontextmanager

    from websockets.asyncio.client import connect

    @asynccontextmanager
    async def subscribed() -> Any:
        async with connect(f"{url}/subscribe?channel=c") as ws:
            await recv_json(ws)
            yield ws

    return subscribed()


async def test_a_body_that_stalls_is_cut_and_its_message_aborts() -> None:
    running, relay = await start_relay(idle_timeout=0.5)
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(running.url))
        line = json.dumps({"id": "s", "delta": "then nothing"}).encode() + b"\n"
        writer.write(
            b"POST /produce?channel=c HTTP/1.1\r\nHost: r\r\nContent-Type: application/x-ndjson"
            b"\r\nTransfer-Encoding: chunked\r\n\r\n"
            + f"{len(line):x}\r\n".encode()
            + line
            + b"\r\n"
        )
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # cut, with no answer
        assert asyncio.get_running_loop().time() - started < 3
        writer.close()
        aborted = await recv_json(sub, 5)
        assert (aborted["type"], aborted["text"]) == ("aborted", "then nothing")


async def test_a_named_producers_message_idle_too_long_aborts() -> None:
    running, relay = await start_relay(idle_timeout=0.6)
    port = _port(running.url)
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        path = "/produce?channel=c&producer=slow-fn"
        first = _lines({"id": "w", "delta": "waiting", "seq": 1})
        assert (await _post(port, path, first, "application/x-ndjson"))[0] == 200
        aborted = await recv_json(sub, 5)
        assert (aborted["type"], aborted["reason"], aborted["text"]) == (
            "aborted", "idle_timeout", "waiting",
        )  # fmt: skip


async def test_a_final_the_broker_cannot_take_is_503(redis_server: RedisServer) -> None:
    relay = await relay_process("--broker", redis_server.url).start()
    try:
        redis_server.kill()
        final = json.dumps({"id": "m", "delta": "kept", "final": True}).encode()
        status, answer = 0, {}
        for _ in range(50):  # until the relay has noticed Redis is gone
            status, answer = await _post(relay.port, "/produce?channel=c", final)
            if status == 503:
                break
            await asyncio.sleep(0.1)
        assert status == 503 and answer["errors"][0]["code"] == "broker_unavailable"
    finally:
        await relay.stop()


async def _chunked(port: int, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Type: application/x-ndjson\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode()
    )
    return reader, writer


async def _chunk(writer: asyncio.StreamWriter, *events: dict[str, Any], last: bool = False) -> None:
    lines = _lines(*events)
    writer.write(f"{len(lines):x}\r\n".encode() + lines + b"\r\n" + (b"0\r\n\r\n" if last else b""))
    await writer.drain()


async def _answered(reader: asyncio.StreamReader) -> tuple[int, Any]:
    response = await asyncio.wait_for(reader.read(), 10)
    return int(response.split()[1]), json.loads(response.partition(b"\r\n\r\n")[2])


async def test_two_overlapping_requests_of_one_named_producer_both_apply_fully(
    relay: RunningRelay,
) -> None:
    port, path = _port(relay.url), "/produce?channel=c&producer=gw"
    async with relay.connect("/subscribe?channel=c&channel=d&deltas=1") as sub:
        assert [(await recv_json(sub))["type"] for _ in range(2)] == ["subscribed"] * 2
        # A long reply streams in one request...
        long_reader, long_writer = await _chunked(port, path)
        await _chunk(long_writer, {"id": "long", "delta": "one ", "seq": 1})
        assert (await recv_json(sub))["delta"] == "one "
        # ...while a second request of the same producer comes (with a channel of its own
        # for the events that name none), and is answered first.
        short = _lines(
            {"id": "short", "delta": "a", "seq": 1},
            {"id": "long", "delta": "two ", "seq": 2, "channel": "c"},
            {"id": "short", "delta": "b", "final": True, "seq": 2},
        )
        other = "/produce?channel=d&producer=gw"
        status, answer = await _post(port, other, short, "application/x-ndjson")
        assert (status, [a["id"] for a in answer["acks"]], answer["errors"]) == (200, ["short"], [])
        # The first request goes on: every later line of it applies.
        for seq, delta in [(3, "three "), (4, "four")]:
            await _chunk(long_writer, {"id": "long", "delta": delta, "seq": seq})
        await _chunk(long_writer, {"id": "long", "final": True, "seq": 5}, last=True)
        status, answer = await _answered(long_reader)
        long_writer.close()
        assert (status, [a["id"] for a in answer["acks"]], answer["errors"]) == (200, ["long"], [])
        frames = [await recv_json(sub) for _ in range(7)]
        deltas = [(f["id"], f["delta"]) for f in frames if f["type"] == "delta"]
        assert deltas == [
            ("short", "a"),
            ("long", "two "),
            ("short", "b"),
            ("long", "three "),
            ("long", "four"),
        ]
        texts = [(f["channel"], f["id"], f["text"]) for f in frames if f["type"] == "message"]
        assert texts == [("d", "short", "ab"), ("c", "long", "one two three four")]


async def _reply_chunk(port: int, n: int, seq: int, final: bool = False) -> tuple[int, Any]:
    """Chunk ``seq`` of reply ``n``, posted alone under the reply's own producer name."""
    event: dict[str, Any] = {"id": f"reply-{n}", "delta": f"{seq} ", "seq": seq}
    if final:
        event["final"] = True
    path = f"/produce?channel=c&producer=reply-{n}"
    return await _post(port, path, _lines(event), "application/x-ndjson")


async def test_many_concurrent_replies_of_one_gateway_all_complete(relay: RunningRelay) -> None:
    # 24 replies, each under a name of its own, chunk by chunk over separate POSTs from one
    # address: more names than --max-parked-per-ip (16) wait between their requests.
    port, replies = _port(relay.url), 24
    async with relay.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        for seq in (1, 2):
            answers = await asyncio.gather(*(_reply_chunk(port, n, seq) for n in range(replies)))
            assert answers == [(200, {"acks": [], "errors": [], "cancels": []})] * replies
        # Many replies under one name go too: 20 concurrent requests of one name.
        many = "/produce?channel=c&producer=reply-0"
        shared = await asyncio.gather(
            *(
                _post(
                    port,
                    many,
                    _lines({"id": f"shared-{n}", "delta": "s", "final": True}),
                    "application/x-ndjson",
                )
                for n in range(20)
            )
        )
        assert sorted(a["acks"][0]["id"] for _, a in shared) == sorted(
            f"shared-{n}" for n in range(20)
        )
        answers = await asyncio.gather(
            *(_reply_chunk(port, n, 3, final=True) for n in range(replies))
        )
        assert all(status == 200 and len(a["acks"]) == 1 for status, a in answers), answers
        frames = [await recv_json(sub) for _ in range(replies + 20)]
        assert {f["type"] for f in frames} == {"message"}
        texts = {f["id"]: f["text"] for f in frames}
        assert texts == {
            **{f"reply-{n}": "1 2 3 " for n in range(replies)},
            **{f"shared-{n}": "s" for n in range(20)},
        }


async def test_a_named_producer_past_the_limit_is_refused_and_none_is_aborted() -> None:
    running, relay = await start_relay(max_named_producers_per_ip=4, max_parked_per_ip=1)
    port = _port(running.url)
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        for n in range(4):
            assert (await _reply_chunk(port, n, 1))[0] == 200
        # One name more is refused whole, with a clear status: nothing of it is applied.
        status, answer = await _reply_chunk(port, 4, 1, final=True)
        assert (status, [e["code"] for e in answer["errors"]], answer["acks"]) == (
            429,
            ["too_many_producers"],
            [],
        )
        assert "--max-named-producers-per-ip" in answer["errors"][0]["message"]
        for n in range(4):
            status, answer = await _reply_chunk(port, n, 2, final=True)
            assert (status, [a["id"] for a in answer["acks"]]) == (200, [f"reply-{n}"])
        frames = [await recv_json(sub) for _ in range(4)]
        assert [(f["type"], f["id"], f["text"]) for f in frames] == [
            ("message", f"reply-{n}", "1 2 ") for n in range(4)
        ]


async def test_a_named_producer_taken_over_on_another_process_says_what_it_did_not_apply(
    redis_server: RedisServer,
) -> None:
    flags = ("--broker", redis_server.url)
    a, b = relay_process(*flags), relay_process(*flags)
    await asyncio.gather(a.start(), b.start())
    try:
        async with connect(f"{b.url}/subscribe?channel=c&deltas=1") as sub:
            await recv_json(sub)
            path = "/produce?channel=c&producer=gw-moving"
            reader, writer = await _chunked(a.port, path)
            await _chunk(writer, {"id": "first", "delta": "on a", "seq": 1})
            assert (await recv_json(sub))["type"] == "delta"  # the line was applied on a
            # A second request of the same producer reaches the other process: it takes the
            # session over there, and applies its own lines.
            rest = _lines({"id": "second", "delta": "on b", "final": True, "seq": 1})
            status, answer = await _post(b.port, path, rest, "application/x-ndjson")
            assert (status, [ack["id"] for ack in answer["acks"]]) == (200, ["second"])
            # The first request is answered at once: nothing more of it applies, and the
            # answer says from which of its lines on.
            status, answer = await _answered(reader)
            writer.close()
            (moved,) = answer["errors"]
            assert (status, moved["code"], moved["index"], answer["acks"]) == (
                409,
                "producer_moved",
                1,
                [],
            )
            # The message it began goes on where the session is now.
            end = _lines({"id": "first", "delta": ", then b", "final": True, "seq": 2})
            status, answer = await _post(b.port, path, end, "application/x-ndjson")
            assert (status, [ack["id"] for ack in answer["acks"]]) == (200, ["first"])
            frames = [await recv_json(sub) for _ in range(4)]
            assert [(f["type"], f["id"], f.get("text")) for f in frames] == [
                ("delta", "second", None),
                ("message", "second", "on b"),
                ("delta", "first", None),
                ("message", "first", "on a, then b"),
            ]
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def test_one_shot_posts_across_relay_processes_on_redis_each_land_once(
    redis_server: RedisServer,
) -> None:
    """Serverless gateways post whole replies to two relay processes, one of them
    ``--workers 2``, on one Redis, over real sockets, many at once: every post is acked,
    and a subscriber on a third process gets each message once, in the offsets' order,
    with its exact text; the channel's history holds each once."""
    a = relay_process("--broker", redis_server.url)
    w = relay_process("--broker", redis_server.url, "--workers", "2")
    b = relay_process("--broker", redis_server.url)
    await asyncio.gather(a.start(), w.start(), b.start())
    count = 90  # within --history-size (100), so the history holds every one
    try:
        async with running_sub(b.url) as sub:
            # ASCII, as a one-shot message's delta is (any other text takes the general path).
            texts = {f"m{n}": f"reply {n}; " * (n % 5 + 1) for n in range(count)}

            async def post(n: int) -> tuple[int, Any]:
                port = (a.port, w.port)[n % 2]
                body = {"id": f"m{n}", "delta": texts[f"m{n}"], "final": True}
                return await _post(port, "/produce?channel=c", json.dumps(body).encode())

            answers = await asyncio.gather(*(post(n) for n in range(count)))
            assert all(status == 200 for status, _ in answers), answers
            acked = sorted(ack["id"] for _, answer in answers for ack in answer["acks"])
            assert acked == sorted(texts)
            frames = [await recv_json(sub) for _ in range(count)]
            assert [f["offset"] for f in frames] == list(range(1, count + 1))
            assert {f["id"]: f["text"] for f in frames} == texts
        async with connect(f"{a.url}/subscribe?channel=c&rewind={count + 10}") as late:
            confirmed = await recv_json(late)
            assert (confirmed["type"], confirmed["replayed"]) == ("subscribed", count)
            history = [await recv_json(late) for _ in range(count)]
        assert [f["offset"] for f in history] == list(range(1, count + 1))
        assert {f["id"]: f["text"] for f in history} == texts
        # One-shot messages all: no producer session was saved (its MULTI/EXEC) or left.
        client = Redis.from_url(redis_server.url)
        try:
            assert "cmdstat_exec" not in await client.info("commandstats")
            assert await client.keys("tr:session*") == []
        finally:
            await client.aclose()
    finally:
        await asyncio.gather(a.stop(), w.stop(), b.stop())


@pytest.mark.parametrize("first", ["slow-redis", "workers-2"])
async def test_a_named_producers_runs_of_deltas_survive_a_cut_and_continue_elsewhere(
    redis_server: RedisServer, first: str
) -> None:
    """A named producer's plain deltas, read in a row (applied as runs), on a first process:
    one whole request, then one that a proxy cuts in mid-line once its whole lines are
    applied; then the rest of the message on another process on the same Redis. Every delta
    that came whole is kept, once and in order; the cut line is not."""
    async with Proxy(redis_server.port) as link:
        if first == "slow-redis":
            link.delay = 0.05
            a = relay_process("--broker", f"redis://127.0.0.1:{link.port}/0")
        else:
            a = relay_process("--broker", redis_server.url, "--workers", "2")
        b = relay_process("--broker", redis_server.url)
        await asyncio.gather(a.start(), b.start())
        try:
            async with connect(f"{b.url}/subscribe?channel=c&deltas=1") as sub:
                await recv_json(sub)
                path, ndjson = "/produce?channel=c&producer=gateway-9", "application/x-ndjson"
                whole = _lines(*({"id": "z", "delta": f"{n} "} for n in range(6)))
                assert (await _post(a.port, path, whole, ndjson))[0] == 200
                async with Proxy(a.port) as front:
                    _, writer = await asyncio.open_connection("127.0.0.1", front.port)
                    lines = _lines(*({"id": "z", "delta": f"{n} "} for n in range(6, 12)))
                    chunk = lines + b'{"id": "z", "delta": "never '
                    writer.write(
                        f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Type: {ndjson}\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n".encode()
                        + b"%x\r\n%b\r\n" % (len(chunk), chunk)
                    )
                    # Deltas may reach a subscriber merged (a run is one write to Redis).
                    seen = ""
                    while not seen.endswith("11 "):
                        seen += (await asyncio.wait_for(recv_json(sub), 10))["delta"]
                    front.cut()
                    writer.close()
                rest = _lines({"id": "z", "delta": "end"}, {"id": "z", "final": True})
                status, answer = await _post(b.port, path, rest, ndjson)
                assert (status, [ack["id"] for ack in answer["acks"]]) == (200, ["z"]), answer
                while (frame := await asyncio.wait_for(recv_json(sub), 10))["type"] == "delta":
                    seen += frame["delta"]
            whole_lines = "".join(f"{n} " for n in range(12)) + "end"
            assert (seen, frame["type"], frame["text"]) == (whole_lines, "message", whole_lines)
        finally:
            await asyncio.gather(a.stop(), b.stop())


async def test_a_redis_restart_mid_body_leaves_every_ndjson_reply_exact(
    redis_server: RedisServer,
) -> None:
    """NDJSON bodies of plain deltas, a few lines a chunk (applied as runs), streaming to
    two processes on one Redis, which is killed while every body is under way, stays down
    while more chunks come, and restarts empty. Every reply is acked in its answer and ends
    in exactly one message, with its whole text."""
    a, b = relay_process("--broker", redis_server.url), relay_process("--broker", redis_server.url)
    await asyncio.gather(a.start(), b.start())
    expected = {f"r{n}": "".join(f"{n}.{t} " for t in range(24)) for n in range(8)}
    chunks_sent: dict[str, int] = {}
    down, restarted = asyncio.Event(), asyncio.Event()

    async def gateway(port: int, message_id: str) -> tuple[int, Any]:
        reader, writer = await _chunked(port, "/produce?channel=restart")
        tokens = [token + " " for token in expected[message_id].split(" ")[:-1]]
        for at in range(0, len(tokens), 3):
            if at == 12:
                await down.wait()  # the next chunks come while Redis is down
            elif at == 18:
                await restarted.wait()
            await _chunk(writer, *({"id": message_id, "delta": t} for t in tokens[at : at + 3]))
            chunks_sent[message_id] = chunks_sent.get(message_id, 0) + 1
            await asyncio.sleep(0.01)
        await _chunk(writer, {"id": message_id, "final": True}, last=True)
        answer = await _answered(reader)
        writer.close()
        return answer

    try:
        ids = sorted(expected)
        gateways = asyncio.gather(
            *(gateway((a, b)[n % 2].port, message_id) for n, message_id in enumerate(ids))
        )
        await eventually(
            lambda: all(chunks_sent.get(message_id, 0) >= 4 for message_id in ids),
            15,
            what="every body under way",
        )
        redis_server.kill()  # empty on restart: a new epoch for the channel
        down.set()
        await eventually(
            lambda: all(chunks_sent.get(message_id, 0) >= 6 for message_id in ids),
            15,
            what="every body's chunks sent while Redis is down",
        )
        for relay in (a, b):  # each has seen Redis go, with chunks of runs applied since
            await eventually(
                lambda relay=relay: _readyz_is(relay, 503), 15, what="the relay seeing Redis gone"
            )
        redis_server.start()
        for relay in (a, b):
            await eventually(
                lambda relay=relay: _readyz_is(relay, 200), 15, what="the relay ready again"
            )
        restarted.set()
        answers = await asyncio.wait_for(gateways, 30)
        assert [(status, [ack["id"] for ack in answer["acks"]]) for status, answer in answers] == [
            (200, [message_id]) for message_id in ids
        ], answers
        # Every final came after the restart: the new epoch's history holds every reply.
        async with connect(f"{a.url}/subscribe") as replay:
            await replay.send(json.dumps({"type": "subscribe", "channel": "restart"}))
            current = await recv_json(replay)
            await replay.send(json.dumps({"type": "unsubscribe", "channel": "restart"}))
            await recv_json(replay)
            since = {"offset": 0, "epoch": current["epoch"]}
            await replay.send(
                json.dumps({"type": "subscribe", "channel": "restart", "since": since})
            )
            assert (await recv_json(replay))["recovered"] is True
            history = [await recv_json(replay) for _ in range(current["offset"])]
        assert sorted(frame["id"] for frame in history) == ids  # each exactly once
        assert {frame["id"]: (frame["type"], frame["text"]) for frame in history} == {
            message_id: ("message", text) for message_id, text in expected.items()
        }
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def _readyz_is(relay: ServiceProcess, status: int) -> bool:
    return await relay.http_status("/readyz") == status
