"""SSE subscribers over real sockets: the same frames as a WebSocket, resume by the last event
id (or ?since=) exactly once, heartbeats, auth, limits and the slow-reader policy."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from token_relay.core.grants import Role
from token_relay.core.resume import decode_positions, encode_positions
from token_relay.tokens import mint

from ..conftest import RunningRelay, recv_json, send_json, start_relay
from ..harness import SseReader, eventually

SECRET = "sse-test-secret-of-at-least-32-bytes-long"


def _port(running: RunningRelay) -> int:
    return int(running.url.rsplit(":", 1)[1])


async def _produce(running: RunningRelay, channel: str, *events: dict[str, Any]) -> None:
    async with running.connect(f"/produce?channel={channel}") as producer:
        for event in events:
            await send_json(producer, event)
        if events and events[-1].get("final"):
            assert (await recv_json(producer))["type"] == "ack"


async def test_a_stream_carries_the_same_frames_as_a_websocket() -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe?channel=c&deltas=1") as ws:
        await recv_json(ws)
        async with SseReader(_port(running), "/sse?channel=c&deltas=1") as sse:
            assert sse.status == 200
            assert sse.response_headers["content-type"] == "text/event-stream; charset=utf-8"
            assert sse.response_headers["cache-control"] == "no-cache"
            assert sse.response_headers["x-accel-buffering"] == "no"
            subscribed = await sse.next()
            assert (subscribed.event, subscribed.json()["channel"]) == ("subscribed", "c")
            assert sse.retry == 1000
            async with running.connect("/produce?channel=c") as producer:
                await send_json(producer, {"id": "m", "delta": "Hel"})
                await send_json(producer, {"id": "m", "delta": "lo, wörld 👋", "final": True})
                await recv_json(producer)
                expected = [await recv_json(ws) for _ in range(3)]
            got = [await sse.next() for _ in range(3)]
            assert [event.json() for event in got] == expected
            assert [event.event for event in got] == ["delta", "delta", "message"]
            assert got[0].id is None and got[2].id is not None
            assert got[2].json()["text"] == "Hello, wörld 👋"


async def test_a_cut_stream_resumes_from_its_last_id_exactly_once() -> None:
    running, relay = await start_relay()
    port = _port(running)
    async with relay:
        async with SseReader(port, "/sse?channel=a&channel=b") as first:
            await first.next()
            await first.next()
            await _produce(running, "a", {"id": "a1", "delta": "one", "final": True})
            await _produce(running, "b", {"id": "b1", "delta": "uno", "final": True})
            seen = [await first.next() for _ in range(2)]
            last_id = seen[-1].id
            assert last_id is not None
        # Cut; meanwhile both channels move on.
        await _produce(running, "a", {"id": "a2", "delta": "two", "final": True})
        await _produce(running, "b", {"id": "b2", "delta": "dos", "final": True})
        for header in (True, False):
            path = "/sse?channel=a&channel=b" + ("" if header else f"&since={last_id}")
            headers = [("Last-Event-ID", last_id)] if header else []
            async with SseReader(port, path, headers) as again:
                # Each channel: its confirmation, then what it missed since the id.
                expected = ["a2", "b2"] if header else ["a2", "b2", "live-True"]
                frames = [(await again.next()).json() for _ in range(2 + len(expected))]
                confirmations = [f for f in frames if f["type"] == "subscribed"]
                missed = [f for f in frames if f["type"] == "message"]
                assert [f["recovered"] for f in confirmations] == [True, True]
                assert sorted(frame["id"] for frame in missed) == expected
                with_id = [frame for frame in missed if frame["id"] == "b2"]
                assert with_id[0]["text"] == "dos"
                # Nothing else: the messages before the cut are not sent again.
                await _produce(running, "a", {"id": f"live-{header}", "delta": "x", "final": True})
                assert (await again.next()).json()["id"] == f"live-{header}"


async def test_a_resumed_deltas_stream_gets_a_fresh_snapshot() -> None:
    running, relay = await start_relay()
    port = _port(running)
    async with relay, running.connect("/produce?channel=c") as producer:
        async with SseReader(port, "/sse?channel=c&deltas=1") as first:
            await first.next()
            await send_json(producer, {"id": "done", "delta": "first", "final": True})
            await recv_json(producer)
            assert (await first.next()).event == "delta"
            done = await first.next()
            assert done.event == "message" and done.id is not None
            await send_json(producer, {"id": "m", "delta": "abc"})
            assert (await first.next()).json()["delta"] == "abc"
        await send_json(producer, {"id": "m", "delta": "def"})
        resume = [("Last-Event-ID", done.id)]
        async with SseReader(port, "/sse?channel=c&deltas=1", resume) as again:
            confirmation = (await again.next()).json()
            assert (confirmation["recovered"], confirmation["offset"]) == (True, 1)
            snapshot = (await again.next()).json()
            assert (snapshot["type"], snapshot["id"], snapshot["text"]) == (
                "snapshot",
                "m",
                "abcdef",
            )
            await send_json(producer, {"id": "m", "delta": "!", "final": True})
            assert (await again.next()).json()["delta"] == "!"
            assert (await again.next()).json()["text"] == "abcdef!"


async def test_heartbeats_keep_an_idle_stream_alive() -> None:
    running, relay = await start_relay(sse_heartbeat=0.1)
    async with relay, SseReader(_port(running), "/sse?channel=quiet") as sse:
        await sse.next()
        # Idle while heartbeats (0.1 s apart) keep coming, counted as they are read: three
        # of them, then a message.
        waiting = asyncio.ensure_future(sse.next(10))
        await eventually(lambda: sse.comments >= 3, 5, what="three heartbeats")
        await _produce(running, "quiet", {"id": "m", "delta": "late", "final": True})
        assert (await waiting).json()["text"] == "late"
        assert sse.comments >= 3


async def test_streams_take_tokens_like_websockets_and_refuse_bad_requests() -> None:
    running, relay = await start_relay(secret=SECRET)
    port = _port(running)
    reader = mint(SECRET, Role.SUBSCRIBE, ["c"], 60)
    writer = mint(SECRET, Role.PRODUCE, ["c"], 60)
    async with relay:
        cases = [
            ("/sse?channel=c", [], 401),
            (f"/sse?channel=c&token={writer}", [], 403),
            ("/sse", [("Authorization", f"Bearer {reader}")], 400),
            (f"/sse?channel=c&token={reader}&since=%%%", [], 400),
        ]
        for path, headers, status in cases:
            async with SseReader(port, path, headers) as refused:
                assert refused.status == status, path
        async with SseReader(port, f"/sse?channel=c&token={reader}") as by_query:
            assert by_query.status == 200
            assert (await by_query.next()).event == "subscribed"
        bearer = [("Authorization", f"Bearer {reader}")]
        async with SseReader(port, "/sse?channel=c&channel=other", bearer) as partly:
            events = [await partly.next() for _ in range(2)]
            assert [e.event for e in events] == ["subscribed", "error"]
            assert events[1].json()["code"] == "forbidden"


async def test_a_stream_that_does_not_read_is_ended_and_others_go_on() -> None:
    running, relay = await start_relay(
        subscriber_high_water_bytes=4096, max_subscriber_buffer_bytes=65536
    )
    port = _port(running)
    async with (
        relay,
        SseReader(port, "/sse?channel=c&deltas=1") as stuck,
        SseReader(port, "/sse?channel=c") as fine,
    ):
        await stuck.next()
        await fine.next()
        assert stuck._writer is not None
        stuck._writer.transport.pause_reading()

        async def read_all() -> list[str]:
            return [(await fine.next(10)).json()["id"] for _ in range(800)]

        reading = asyncio.ensure_future(read_all())
        async with running.connect("/produce?channel=c") as producer:
            for n in range(800):
                await send_json(producer, {"id": f"m{n}", "delta": "x" * 20_000, "final": True})
                await recv_json(producer)
        assert await reading == [f"m{n}" for n in range(800)]
        assert relay.metrics.slow_closes.value == 1
        assert len(relay.hub.subscribers("c")) == 1
        stuck._writer.transport.resume_reading()
        events = []
        try:
            while True:
                events.append(await stuck.next(2))
        except EOFError:
            pass
        assert stuck.ended  # the relay ended it, and said why in a comment
        # What it got before the end was in order and whole: a prefix of the stream.
        kinds = [json.loads(e.data)["type"] for e in events]
        assert set(kinds) <= {"delta", "message"} and len(kinds) < 1600


async def _post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Length: {len(body)}\r\nConnection: close"
    writer.write(head.encode() + b"\r\n\r\n" + body)
    response = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    status = int(response.split()[1])
    return status, response.partition(b"\r\n\r\n")[2]


async def test_post_cancel_is_stop_for_a_stream_and_answers_plainly() -> None:
    running, relay = await start_relay(secret=SECRET)
    port = _port(running)
    producing = mint(SECRET, Role.PRODUCE, ["c"], 60)
    reading = mint(SECRET, Role.SUBSCRIBE, ["c"], 60)
    elsewhere = mint(SECRET, Role.SUBSCRIBE, ["other"], 60)
    async with relay, running.connect(f"/produce?channel=c&token={producing}") as producer:
        await send_json(producer, {"id": "m", "delta": "going"})
        await asyncio.sleep(0.05)
        body = json.dumps({"channel": "c", "id": "m"}).encode()
        assert (await _post(port, "/cancel", body))[0] == 401
        assert (await _post(port, f"/cancel?token={elsewhere}", body))[0] == 403
        status, answer = await _post(port, f"/cancel?token={reading}", body)
        assert (status, answer) == (204, b"")
        assert await recv_json(producer) == {"type": "cancel", "channel": "c", "id": "m"}
        gone = json.dumps({"channel": "c", "id": "never"}).encode()
        status, answer = await _post(port, f"/cancel?token={reading}", gone)
        assert (status, json.loads(answer)["code"]) == (404, "unknown_message")
        status, answer = await _post(port, f"/cancel?token={reading}", b"{not json")
        assert (status, json.loads(answer)["code"]) == (400, "invalid_json")
        status, answer = await _post(port, f"/cancel?token={reading}", b'{"channel": "c"}')
        assert (status, json.loads(answer)["code"]) == (400, "invalid_frame")
        # The producer was asked once, and its message goes on to its end.
        await send_json(producer, {"id": "m", "delta": " on", "final": True})
        assert (await recv_json(producer))["type"] == "ack"


async def test_the_eventsource_package_resumes_across_a_cut_exactly_once(
    js_clients: Path,
) -> None:
    """The `eventsource` npm package in Node: a cut mid-stream, then Last-Event-ID."""
    running, relay = await start_relay()
    http = running.url.replace("ws://", "http://")
    node = await asyncio.create_subprocess_exec(
        "node",
        str(js_clients / "eventsource_read.mjs"),
        f"{http}/sse?channel=es",
        "10",
        stdout=asyncio.subprocess.PIPE,
    )
    assert node.stdout is not None
    lines: list[dict[str, Any]] = []

    async def until(condition: Any) -> None:
        async with asyncio.timeout(15):
            while not condition():
                lines.append(json.loads(await node.stdout.readline()))  # type: ignore[union-attr]

    async with relay, running.connect("/produce?channel=es") as producer:

        async def publish(n: int) -> None:
            await send_json(producer, {"id": f"e{n}", "delta": f"text {n}", "final": True})
            await recv_json(producer)

        await until(lambda: any(line.get("opened") == 1 for line in lines))
        for n in range(4):
            await publish(n)
        await until(lambda: sum("frame" in line for line in lines) == 4)
        assert relay.server is not None
        for connection in list(relay.server.connections):
            if connection.path.startswith("/sse"):
                connection.transport.abort()  # cut, no goodbye
        for n in range(4, 7):
            await publish(n)
        await until(lambda: any(line.get("opened") == 2 for line in lines))
        for n in range(7, 10):
            await publish(n)
        await until(lambda: sum("frame" in line for line in lines) == 10)
    assert await asyncio.wait_for(node.wait(), 5) == 0
    frames = [line["frame"] for line in lines if "frame" in line]
    assert [(f["id"], f["text"]) for f in frames] == [(f"e{n}", f"text {n}") for n in range(10)]


async def test_http_surfaces_answer_cors_for_allowed_origins_only() -> None:
    running, relay = await start_relay(allowed_origins=("https://chat.example",))
    port = _port(running)
    good, evil = [("Origin", "https://chat.example")], [("Origin", "https://evil.example")]
    async with relay:
        async with SseReader(port, "/sse?channel=c", good) as allowed:
            assert allowed.status == 200
            assert allowed.response_headers["access-control-allow-origin"] == "https://chat.example"
        async with SseReader(port, "/sse?channel=c", evil) as refused:
            assert refused.status == 403
        async with SseReader(port, "/sse?channel=c") as no_origin:  # not a browser
            assert no_origin.status == 200 and "access-control-allow-origin" not in (
                no_origin.response_headers
            )
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"OPTIONS /cancel HTTP/1.1\r\nHost: r\r\nOrigin: https://chat.example\r\n"
            b"Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n"
        )
        preflight = (await asyncio.wait_for(reader.read(), 5)).decode().lower()
        writer.close()
        assert preflight.startswith("http/1.1 204 ")
        assert "access-control-allow-origin: https://chat.example" in preflight
        assert "access-control-allow-headers: authorization, content-type" in preflight
        status, _ = await _post(port, "/produce?channel=c", b'{"id": "m", "final": true}')
        assert status == 200  # no Origin: a gateway


async def test_a_fresh_stream_rewinds_and_a_resumed_one_does_not() -> None:
    running, relay = await start_relay()
    port = _port(running)
    async with relay:
        for n in range(3):
            await _produce(running, "r", {"id": f"m{n}", "delta": f"t{n}", "final": True})
        async with SseReader(port, "/sse?channel=r&rewind=2") as fresh:
            assert (await fresh.next()).event == "subscribed"
            replayed = [await fresh.next() for _ in range(2)]
            assert [e.json()["id"] for e in replayed] == ["m1", "m2"]
            token = replayed[-1].id
        assert token is not None
        await _produce(running, "r", {"id": "m3", "delta": "t3", "final": True})
        resume = [("Last-Event-ID", token)]
        async with SseReader(port, "/sse?channel=r&rewind=2", resume) as again:
            assert (await again.next()).json()["recovered"] is True
            assert (await again.next()).json()["id"] == "m3"  # since wins: nothing twice


async def test_a_stream_cut_before_its_first_message_resumes_from_its_confirmation() -> None:
    """The confirmation's id holds the join's start: nothing published during the cut is
    lost, and a stream cut during its rewind gets the whole rewind again, once."""
    running, relay = await start_relay()
    port = _port(running)
    async with relay:
        for n in range(3):
            await _produce(running, "f", {"id": f"old{n}", "delta": "x", "final": True})
        async with SseReader(port, "/sse?channel=f") as fresh:
            confirmation = await fresh.next()
        assert confirmation.event == "subscribed" and confirmation.id is not None
        await _produce(running, "f", {"id": "during", "delta": "cut", "final": True})
        async with SseReader(port, "/sse?channel=f", [("Last-Event-ID", confirmation.id)]) as again:
            assert (await again.next()).json()["recovered"] is True
            assert (await again.next()).json()["id"] == "during"

        async with SseReader(port, "/sse?channel=f&rewind=2") as rewound:
            start = await rewound.next()
            assert start.event == "subscribed" and start.id is not None
            # The confirmation says where the channel is; its id says where the replay began.
            assert start.json()["offset"] == 4
        await _produce(running, "f", {"id": "after", "delta": "cut", "final": True})
        path = "/sse?channel=f&rewind=2"
        async with SseReader(port, path, [("Last-Event-ID", start.id)]) as resumed:
            assert (await resumed.next()).json()["recovered"] is True
            ids = [(await resumed.next()).json()["id"] for _ in range(3)]
            assert ids == ["old2", "during", "after"]


async def test_a_forged_token_resumes_only_the_streams_channels_and_is_bounded() -> None:
    running, relay = await start_relay()
    port = _port(running)
    async with relay:
        async with SseReader(port, "/sse?channel=s") as first:
            confirmation = await first.next()
        assert confirmation.id is not None
        offset, epoch = confirmation.json()["offset"], confirmation.json()["epoch"]
        # A token naming 200 channels the stream doesn't follow, besides its own: ~11 KB.
        junk = {f"junk-{n:03d}": (n, "e" * 20) for n in range(200)}
        forged = encode_positions({"s": (offset, epoch), **junk})
        small = encode_positions({"s": (offset, epoch), "junk-1": (1, "e"), "junk-2": (2, "e")})
        async with SseReader(port, "/sse?channel=s", [("Last-Event-ID", small)]) as resumed:
            subscribed = await resumed.next()
            assert subscribed.json()["recovered"] is True
            await _produce(running, "s", {"id": "m", "delta": "hi", "final": True})
            message = await resumed.next()
            assert message.json()["text"] == "hi"
            # Every id holds the stream's own channel, and nothing else.
            for event in (subscribed, message):
                assert event.id is not None
                assert set(decode_positions(event.id)) == {"s"}
        async with SseReader(port, "/sse?channel=s", [("Last-Event-ID", forged)]) as refused:
            assert refused.status == 400
        async with SseReader(port, f"/sse?channel=s&since={forged}") as refused:
            assert refused.status == 400
