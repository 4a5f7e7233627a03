"""A producer's finals are published while it goes on: replies keep the order of its frames.

On Redis a final's message is published in a round trip; the relay applies the producer's
next events meanwhile, and holds each reply back until the ones before it are sent. These
tests play bursts of frames (messages, bad frames, repeated finals, batches) written all at
once against a relay in memory and one on a real redis-server, and against Redis killed
in the middle of a burst.

HTTP/1.1 pipelining: requests written in one go on one connection are answered in order,
on every route (plain GETs, ``POST /produce`` as JSON and NDJSON, ``POST /cancel``, the AI
SDK's Stop and stream, the dead letters), each read by a client-side h11 that parses the
responses off one raw socket. And ``Expect: 100-continue``: the relay asks for the body
(``100 Continue``) before it is sent, or refuses the request at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h11
from redis.asyncio import Redis
from token_relay.edge.producers import MAX_PENDING_REPLIES
from websockets.asyncio.client import ClientConnection, connect

from ..conftest import RunningRelay, recv_json, send_json, start_relay, subscribed_pair
from ..harness import (
    RedisServer,
    ServiceProcess,
    SseReader,
    eventually,
    relay_process,
    relays_on,
    rss_bytes,
)

MESSAGES = 300

HTTP_PARSERS = ("fast", "h11")
"""Every test runs under both request parsers (see ``tests/conftest.py``)."""


def _script(count: int) -> tuple[list[Any], dict[str, str], int]:
    """Frames to send, the texts they complete, and how many replies they call for."""
    frames: list[Any] = []
    texts: dict[str, str] = {}
    replies = 0
    for n in range(count):
        message_id = f"m{n}"
        pieces = [f"#{n} ", "ça ", "va 🚀", ""]
        frames += [{"id": message_id, "delta": piece} for piece in pieces]
        frames.append({"id": message_id, "final": True})
        texts[message_id] = "".join(pieces)
        replies += 1
        if n % 17 == 5:
            frames.append({"id": 5})  # refused as it is read: an error frame, in its place
            replies += 1
        if n % 19 == 3:
            frames.append({"id": f"gap{n}", "seq": 3})  # refused by the rules, in its place
            replies += 1
        if n % 23 == 7:
            frames.append({"id": f"m{n - 3}", "final": True})  # repeated: acked again
            replies += 1
        if n % 31 == 11:
            first, second = f"b{n}a", f"b{n}b"
            frames.append(
                [
                    {"id": first, "delta": "one "},
                    {"id": second, "delta": "two", "final": True},
                    {"id": first, "delta": "done", "final": True},
                ]
            )
            texts[second], texts[first] = "two", "one done"
            replies += 1
    return frames, texts, replies


def _shape(reply: dict[str, Any]) -> Any:
    """A reply without what differs between runs (the error's words are kept)."""
    return json.dumps(reply, sort_keys=True)


@asynccontextmanager
async def _relay(*flags: str) -> AsyncIterator[ServiceProcess]:
    relay = relay_process("--max-events-per-second", "1000000", *flags)
    await relay.start()
    try:
        yield relay
    finally:
        await relay.stop()


async def _burst(
    relay: ServiceProcess, channel: str, frames: list[Any], replies: int
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Write every frame at once; the producer's replies, and what a subscriber got."""
    async with subscribed_pair(relay, channel=channel) as (sub, producer):
        await asyncio.gather(*(producer.send(json.dumps(frame)) for frame in frames))
        got = [json.loads(await asyncio.wait_for(producer.recv(), 20)) for _ in range(replies)]
        received = await _messages(sub, len(_acked(got)))
    return got, received


def _acked(replies: list[dict[str, Any]]) -> set[str]:
    """The ids the replies acknowledge."""
    ids: set[str] = set()
    for reply in replies:
        if reply["type"] == "ack":
            ids.add(reply["id"])
        elif reply["type"] == "acks":
            ids.update(ack["id"] for ack in reply["acks"])
    return ids


async def _messages(sub: ClientConnection, count: int) -> dict[str, str]:
    received: dict[str, str] = {}
    offsets: list[int] = []
    while len(received) < count:
        frame = json.loads(await asyncio.wait_for(sub.recv(), 20))
        assert frame["type"] == "message", frame
        assert frame["id"] not in received, f"{frame['id']} delivered twice"
        received[frame["id"]] = frame["text"]
        offsets.append(frame["offset"])
    assert offsets == list(range(1, count + 1))
    return received


async def test_replies_on_redis_are_those_in_memory_in_the_same_order(
    redis_server: RedisServer,
) -> None:
    frames, texts, replies = _script(MESSAGES)
    async with _relay() as memory, _relay("--broker", redis_server.url) as shared:
        for _ in range(2):  # twice: the second burst meets a warm relay
            channel = f"burst-{uuid.uuid4().hex[:8]}"
            in_memory, delivered_memory = await _burst(memory, channel, frames, replies)
            on_redis, delivered_redis = await _burst(shared, channel, frames, replies)
            assert [_shape(r) for r in on_redis] == [_shape(r) for r in in_memory]
            kinds = {r["type"] for r in on_redis}
            assert kinds == {"ack", "acks", "error"}
            assert delivered_redis == delivered_memory == texts


async def test_redis_killed_mid_burst_every_final_is_answered_once_in_order(
    redis_server: RedisServer,
) -> None:
    frames = []
    for n in range(MESSAGES):
        frames += [{"id": f"k{n}", "delta": f"text {n}"}, {"id": f"k{n}", "final": True}]
    async with (
        _relay("--broker", redis_server.url) as relay,
        connect(f"{relay.url}/produce?channel=killed") as producer,
    ):
        assert json.loads(await producer.recv())["type"] == "session"
        # Half the burst, then Redis dies under the first reply, while that half is being
        # published; the other half follows into a relay whose broker is gone.
        half = len(frames) // 2
        sending = asyncio.gather(*(producer.send(json.dumps(f)) for f in frames[:half]))
        first = json.loads(await asyncio.wait_for(producer.recv(), 20))
        redis_server.kill()
        await sending
        for frame in frames[half:]:
            await producer.send(json.dumps(frame))
        got = [first]
        got += [
            json.loads(await asyncio.wait_for(producer.recv(), 30)) for _ in range(MESSAGES - 1)
        ]
        ids = [reply["id"] for reply in got]
        assert ids == [f"k{n}" for n in range(MESSAGES)]  # one reply per final, in order
        refused = [r["id"] for r in got if r["type"] == "error"]
        assert {r["code"] for r in got if r["type"] == "error"} <= {"broker_unavailable"}
        assert refused, "Redis died mid-burst, yet every final was acked"
        redis_server.start()
        # A final refused while Redis was away is acked once it is back (the text was kept).
        for message_id in refused[:20]:
            for _ in range(100):
                await producer.send(json.dumps({"id": message_id, "final": True}))
                reply = json.loads(await asyncio.wait_for(producer.recv(), 30))
                if reply["type"] == "ack":
                    break
                assert reply["code"] == "broker_unavailable"
                await asyncio.sleep(0.1)
            assert reply == {"type": "ack", "id": message_id, "channel": "killed"}


async def _frames_in(relay: ServiceProcess) -> int:
    """The producer frames the relay has taken in (handled), from its /metrics."""
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
    body = (await reader.read()).decode()
    writer.close()
    line = next(
        x for x in body.splitlines() if x.startswith('relay_frames_in_total{role="producer"}')
    )
    return int(float(line.split()[-1]))


async def test_a_stalled_redis_holds_at_most_the_reply_limit_then_every_final_is_answered(
    redis_server: RedisServer,
) -> None:
    count = 3 * MAX_PENDING_REPLIES
    filler = "x" * 16_000  # enough bytes that a producer the relay stops reading backs up
    frames = [{"id": f"s{n}", "delta": filler, "final": True} for n in range(count)]
    async with (
        _relay("--broker", redis_server.url) as relay,
        connect(f"{relay.url}/produce?channel=stalled", max_queue=None) as producer,
    ):
        assert json.loads(await producer.recv())["type"] == "session"
        before = await _frames_in(relay)
        assert redis_server.process is not None
        redis_server.process.send_signal(signal.SIGSTOP)  # alive, but answers nothing
        try:
            sending = asyncio.ensure_future(
                asyncio.gather(*(producer.send(json.dumps(frame)) for frame in frames))
            )

            # The relay reads past the reply limit (its replies wait for Redis)...
            async def past_the_limit() -> bool:
                return await _frames_in(relay) - before > MAX_PENDING_REPLIES

            await eventually(past_the_limit, 30, what="the relay read past the reply limit")
            # ... and then stops reading: nothing more than a queue's worth within a second.
            await asyncio.sleep(1.0)
            taken = await _frames_in(relay) - before
            # The replies waiting for Redis stop the reading: a queue's worth more at most.
            assert MAX_PENDING_REPLIES < taken <= MAX_PENDING_REPLIES + 64, taken
            assert not sending.done()
        finally:
            redis_server.process.send_signal(signal.SIGCONT)
        await asyncio.wait_for(sending, 30)
        got = [json.loads(await asyncio.wait_for(producer.recv(), 30)) for _ in range(count)]
    assert [reply["id"] for reply in got] == [f"s{n}" for n in range(count)]
    assert {r["type"] for r in got} <= {"ack", "error"}
    assert {r["code"] for r in got if r["type"] == "error"} <= {"broker_unavailable"}
    assert sum(r["type"] == "ack" for r in got) >= MAX_PENDING_REPLIES


async def test_a_final_written_to_a_redis_that_stops_answering_fails_by_its_deadline(
    redis_server: RedisServer,
) -> None:
    """The writer times each pipeline as a whole: a final whose write Redis never answers
    is refused (broker_unavailable) once the deadline passes, not left waiting. When Redis
    answers again, the retried final lands, once, with the whole text."""
    async with (
        _relay("--broker", redis_server.url) as relay,
        subscribed_pair(relay, channel="hung") as (sub, producer),
    ):
        await producer.send(json.dumps({"id": "h", "delta": "all of "}))
        await producer.send(json.dumps({"id": "h", "delta": "it"}))
        # The deltas are in Redis: the message's text there is all of them.
        async with Redis.from_url(redis_server.url) as redis:

            async def in_redis() -> bool:
                keys = [key async for key in redis.scan_iter(match="tr:text:*|h")]
                return [await redis.get(key) for key in keys] == [b"all of it"]

            await eventually(in_redis, 10, what="the deltas in Redis")
        assert redis_server.process is not None
        redis_server.process.send_signal(signal.SIGSTOP)  # alive, but answers nothing
        try:
            started = asyncio.get_running_loop().time()
            await producer.send(json.dumps({"id": "h", "final": True}))
            reply = json.loads(await asyncio.wait_for(producer.recv(), 15))
            waited = asyncio.get_running_loop().time() - started
        finally:
            redis_server.process.send_signal(signal.SIGCONT)
        assert (reply["type"], reply.get("code"), reply.get("id")) == (
            "error",
            "broker_unavailable",
            "h",
        )
        assert waited < 10, waited  # the deadline (5 s), not a wait without end
        for _ in range(100):
            if await relay.http_status("/readyz") == 200:
                break
            await asyncio.sleep(0.1)
        await producer.send(json.dumps({"id": "h", "final": True}))
        assert json.loads(await asyncio.wait_for(producer.recv(), 10)) == {
            "type": "ack",
            "id": "h",
            "channel": "hung",
        }
        texts = []
        while True:
            frame = json.loads(await asyncio.wait_for(sub.recv(), 10))
            if frame["type"] == "message":
                texts.append(frame["text"])
                break
    assert texts == ["all of it"]


# ---------------------------------------------------------------------- HTTP/1.1 pipelining


def _request(
    method: str, target: str, body: bytes = b"", headers: tuple[tuple[str, str], ...] = ()
) -> h11.Request:
    fields = [("Host", "relay"), *headers]
    if method == "POST" and not any(name.lower() == "transfer-encoding" for name, _ in headers):
        fields.append(("Content-Length", str(len(body))))
    return h11.Request(method=method, target=target, headers=fields)


class _Pipeline:
    """One raw socket: requests written in one go, their responses parsed in order by a
    client-side h11."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.client = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, running: RunningRelay | ServiceProcess) -> _Pipeline:
        port = int(running.url.rsplit(":", 1)[1])
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def write(self, requests: list[tuple[h11.Request, bytes]]) -> None:
        """Every request, with its body, in one write."""
        data = b""
        for head, body in requests:
            data += _wire(head, body)
        self.writer.write(data)

    async def response(
        self, request: h11.Request, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """The next response (its request was written before), as status, headers, body."""
        client = self.client
        if client.our_state is h11.DONE and client.their_state is h11.DONE:
            client.start_next_cycle()
        # Only so that h11 knows what it parses the response to: it was written already.
        client.send(request)
        if body:
            client.send(h11.Data(data=body))
        client.send(h11.EndOfMessage())
        status, headers, body = 0, {}, b""
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(self.reader.read(65536), 10)
                client.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return status, headers, body
            else:
                raise AssertionError(f"unexpected {event!r}")

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


def _wire(head: h11.Request, body: bytes) -> bytes:
    """What a client writes for ``head`` and ``body``."""
    client = h11.Connection(h11.CLIENT)
    data = client.send(head) or b""
    if body:
        data += client.send(h11.Data(data=body)) or b""
    return data + (client.send(h11.EndOfMessage()) or b"")


async def _answers(
    running: RunningRelay, requests: list[tuple[h11.Request, bytes]]
) -> list[tuple[int, dict[str, str], bytes]]:
    """Write every request at once on one connection; each response, in order."""
    pipe = await _Pipeline.open(running)
    try:
        pipe.write(requests)
        return [await pipe.response(head, body) for head, body in requests]
    finally:
        await pipe.close()


HEALTH = (_request("GET", "/healthz"), b"")
JSON = (("Content-Type", "application/json"),)


async def test_plain_gets_written_at_once_are_answered_in_order() -> None:
    running, relay = await start_relay()
    async with relay:
        ready = (_request("GET", "/readyz"), b"")
        got = await _answers(running, [HEALTH, ready, HEALTH])
    assert [(status, body) for status, _, body in got] == [
        (200, b"ok\n"),
        (200, b"ready\n"),
        (200, b"ok\n"),
    ]


async def test_requests_pipelined_behind_produce_posts_are_answered_in_order() -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe?channel=p") as sub:
        assert (await recv_json(sub))["type"] == "subscribed"
        event = json.dumps({"id": "j", "delta": "json", "final": True}).encode()
        lines = b'{"id": "n", "delta": "nd"}\n{"id": "n", "delta": "json", "final": true}\n'
        ndjson = (("Content-Type", "application/x-ndjson"), ("Transfer-Encoding", "chunked"))
        json_head = (("Content-Type", "application/json"),)
        got = await _answers(
            running,
            [
                (_request("POST", "/produce?channel=p", event, json_head), event),
                HEALTH,
                (_request("POST", "/produce?channel=p", lines, ndjson), lines),
                HEALTH,
            ],
        )
        assert [status for status, _, _ in got] == [200, 200, 200, 200]
        assert [json.loads(got[0][2])["acks"], json.loads(got[2][2])["acks"]] == [
            [{"type": "ack", "id": "j", "channel": "p"}],
            [{"type": "ack", "id": "n", "channel": "p"}],
        ]
        assert got[1][2] == got[3][2] == b"ok\n"
        texts = [(await recv_json(sub))["text"] for _ in range(2)]
    assert texts == ["json", "ndjson"]


async def test_requests_pipelined_behind_cancel_and_stop_are_answered_in_order() -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/produce?channel=c") as producer:
        await send_json(producer, {"id": "a", "delta": "first"})
        await send_json(producer, {"id": "b", "delta": "second"})
        # Both are in progress once a joiner sees their snapshots.
        async with running.connect("/subscribe?channel=c&deltas=1") as probe:
            seen = [await recv_json(probe) for _ in range(3)]
        assert {frame.get("id") for frame in seen[1:]} == {"a", "b"}
        cancel = json.dumps({"channel": "c", "id": "a"}).encode()
        got = await _answers(
            running,
            [
                (_request("POST", "/cancel", cancel, JSON), cancel),
                HEALTH,
                (_request("POST", "/ai-sdk/c/stop?id=b"), b""),
                HEALTH,
            ],
        )
        assert [(status, body) for status, _, body in got] == [
            (204, b""),
            (200, b"ok\n"),
            (204, b""),
            (200, b"ok\n"),
        ]
        cancels = [await recv_json(producer) for _ in range(2)]
    assert [(frame["type"], frame["id"]) for frame in cancels] == [("cancel", "a"), ("cancel", "b")]


async def test_requests_pipelined_behind_the_dead_letters_are_answered_in_order() -> None:
    running, relay = await start_relay(webhooks=("http://127.0.0.1:9/hook",))
    async with relay:
        dead = (_request("GET", "/webhooks/dead"), b"")
        got = await _answers(running, [dead, HEALTH, dead])
    assert [(status, body) for status, _, body in got] == [
        (200, b'{"dead": []}'),
        (200, b"ok\n"),
        (200, b'{"dead": []}'),
    ]


async def test_a_request_pipelined_behind_an_ai_sdk_stream_is_answered_after_it() -> None:
    running, relay = await start_relay()
    async with relay:
        stream = (_request("GET", "/ai-sdk/quiet/stream"), b"")
        got = await _answers(running, [stream, HEALTH, stream, HEALTH])
    assert [(status, body) for status, _, body in got] == [
        (204, b""),
        (200, b"ok\n"),
        (204, b""),
        (200, b"ok\n"),
    ]


async def test_what_a_client_sends_behind_a_stream_is_not_read_past_a_bound() -> None:
    """Bytes pipelined behind a stream wait in the kernel, not in the relay: past 16 KiB the
    socket is no longer read until the stream ends. Then they are read as the next request."""
    async with _relay() as relay, connect(f"{relay.url}/produce?channel=held") as producer:
        assert json.loads(await producer.recv())["type"] == "session"
        await producer.send(json.dumps({"id": "h", "delta": "held "}))
        async with connect(f"{relay.url}/subscribe?channel=held&deltas=1") as probe:
            assert [json.loads(await probe.recv())["type"] for _ in range(2)] == [
                "subscribed",
                "snapshot",
            ]
        async with SseReader(relay.port, "/ai-sdk/held/stream") as sse:
            assert sse.status == 200
            assert (await sse.next()).json()["type"] == "start"
            before = rss_bytes(relay.pid)
            assert sse._writer is not None
            junk = sse._writer
            junk.write(b"x" * (64 * 1024 * 1024))
            sending = asyncio.ensure_future(junk.drain())
            # Give the relay the time to read it all, were it reading.
            done, _ = await asyncio.wait({sending}, timeout=2.0)
            assert not done, "the relay read 64 MiB sent behind a stream"
            assert rss_bytes(relay.pid) - before < 16 * 1024 * 1024
            await producer.send(json.dumps({"id": "h", "delta": "whole", "final": True}))
            parts = []
            while not sse.ended:
                with contextlib.suppress(EOFError):
                    parts.append((await sse.next()).data)
            sending.cancel()
        assert json.loads(parts[1]) == {"type": "text-delta", "id": "text", "delta": "held "}
        assert parts[-3:] == ['{"type":"text-end","id":"text"}', '{"type":"finish"}', "[DONE]"]


async def test_a_request_sent_while_a_stream_runs_is_answered_once_it_ends() -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/produce?channel=run") as producer:
        await send_json(producer, {"id": "r", "delta": "so far "})
        async with running.connect("/subscribe?channel=run&deltas=1") as probe:
            assert [(await recv_json(probe))["type"] for _ in range(2)] == [
                "subscribed",
                "snapshot",
            ]
        port = int(running.url.rsplit(":", 1)[1])
        async with SseReader(port, "/ai-sdk/run/stream") as sse:
            assert (await sse.next()).json() == {"type": "start", "messageId": "r"}
            assert sse._writer is not None
            sse._writer.write(b"GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n")
            await send_json(producer, {"id": "r", "delta": "and the rest", "final": True})
            parts = []
            while not sse.ended:
                with contextlib.suppress(EOFError):
                    parts.append((await sse.next()).data)
            client = sse._http
            client.start_next_cycle()
            client.send(h11.Request(method="GET", target="/healthz", headers=[("Host", "r")]))
            client.send(h11.EndOfMessage())
            response = await sse._next_http()
            body = await sse._next_http()
        assert parts[-1] == "[DONE]"
        assert (response.status_code, bytes(body.data)) == (200, b"ok\n")


# ---------------------------------------------------------------------- Expect: 100-continue


async def test_a_body_is_asked_for_with_100_continue_before_it_is_sent() -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe?channel=e") as sub:
        assert (await recv_json(sub))["type"] == "subscribed"
        event = json.dumps({"id": "e", "delta": "asked for", "final": True}).encode()
        head = _request(
            "POST",
            "/produce?channel=e",
            event,
            (("Content-Type", "application/json"), ("Expect", "100-continue")),
        )
        pipe = await _Pipeline.open(running)
        try:
            client = pipe.client
            pipe.writer.write(client.send(head) or b"")
            # Nothing of the body is sent until the relay asks for it.
            event_in = None
            while event_in is None:
                got = client.next_event()
                if got is h11.NEED_DATA:
                    client.receive_data(await asyncio.wait_for(pipe.reader.read(65536), 10))
                else:
                    event_in = got
            assert isinstance(event_in, h11.InformationalResponse)
            assert event_in.status_code == 100
            body_out = client.send(h11.Data(data=event)) or b""
            pipe.writer.write(body_out + (client.send(h11.EndOfMessage()) or b""))
            status, _, body = await _final_response(pipe)
        finally:
            await pipe.close()
        assert status == 200
        assert json.loads(body)["acks"] == [{"type": "ack", "id": "e", "channel": "e"}]
        assert (await recv_json(sub))["text"] == "asked for"


async def _final_response(pipe: _Pipeline) -> tuple[int, dict[str, str], bytes]:
    status, headers, body = 0, {}, b""
    while True:
        event = pipe.client.next_event()
        if event is h11.NEED_DATA:
            pipe.client.receive_data(await asyncio.wait_for(pipe.reader.read(65536), 10))
        elif isinstance(event, h11.Response):
            status = event.status_code
            headers = {k.decode(): v.decode() for k, v in event.headers}
        elif isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            return status, headers, body


async def test_a_refused_body_gets_its_final_status_at_once_not_100() -> None:
    running, relay = await start_relay(max_body_bytes=1000)
    async with relay:
        head = _request(
            "POST",
            "/produce?channel=e",
            b"x" * 5000,
            (("Content-Type", "application/json"), ("Expect", "100-continue")),
        )
        pipe = await _Pipeline.open(running)
        try:
            pipe.writer.write(pipe.client.send(head) or b"")
            status, headers, _ = await _final_response(pipe)
        finally:
            await pipe.close()
    assert (status, headers.get("connection")) == (413, "close")


async def test_curl_uploads_without_waiting_for_expect() -> None:
    curl = shutil.which("curl")
    assert curl is not None, "this test needs curl"
    running, relay = await start_relay()
    base = running.url.replace("ws://", "http://")
    async with relay, running.connect("/subscribe?channel=u") as sub:
        assert (await recv_json(sub))["type"] == "subscribed"
        lines = b'{"id": "u", "delta": "up"}\n{"id": "u", "delta": "loaded", "final": true}\n'
        # -T - sends a chunked body and Expect: 100-continue; curl waits up to
        # --expect100-timeout for the 100 before it sends the body anyway: made long, so
        # only a 100 lets it go on within the test's time.
        process = await asyncio.create_subprocess_exec(
            curl, "-sS", "-X", "POST", "-T", "-", "--expect100-timeout", "60",
            "-H", "Content-Type: application/x-ndjson", "-w", "\n%{http_code}",
            f"{base}/produce?channel=u",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(process.communicate(lines), 20)
        body, _, code = out.decode().rpartition("\n")
        assert code == "200"
        assert json.loads(body)["acks"] == [{"type": "ack", "id": "u", "channel": "u"}]
        assert (await recv_json(sub))["text"] == "uploaded"


# ---------------------------------------------------------------------- a client's half-close


async def _answer_then_close(
    running: RunningRelay | ServiceProcess, requests: list[tuple[h11.Request, bytes]]
) -> tuple[list[tuple[int, dict[str, str], bytes]], bytes]:
    """Write every request at once, then close the client's side of the socket (a
    half-close, ``shutdown(SHUT_WR)``): each response, in order, and what came after them
    before the relay closed the connection (nothing, for a relay that answers and closes)."""
    pipe = await _Pipeline.open(running)
    try:
        pipe.write(requests)
        pipe.writer.write_eof()
        got = [await pipe.response(head, body) for head, body in requests]
        rest = await asyncio.wait_for(pipe.reader.read(), 10)  # b"" once the relay closes
        return got, pipe.client.trailing_data[0] + rest
    finally:
        await pipe.close()


async def _half_closed_requests_are_answered(
    running: RunningRelay | ServiceProcess, watched: RunningRelay | ServiceProcess | None = None
) -> None:
    """One-shot and general ``POST /produce``, a Durable Streams create and append, and a
    plain GET, each on a socket that the client half-closes right after its requests: every
    one is answered, then the relay closes the socket. The messages reach a subscriber of
    ``watched`` (by default the same relay)."""
    event = json.dumps({"id": "h", "delta": "half", "final": True}).encode()
    lines = b'{"id": "n", "delta": "nd"}\n{"id": "n", "delta": "json", "final": true}\n'
    text = (("Content-Type", "text/plain"),)
    one_shot = (_request("POST", "/produce?channel=h", event, JSON), event)
    ndjson = (("Content-Type", "application/x-ndjson"),)
    general = (_request("POST", "/produce?channel=h", lines, ndjson), lines)
    create = (_request("PUT", "/v1/stream/half", b"", text), b"")
    append = (_request("POST", "/v1/stream/half", b"hi", text), b"hi")
    async with connect((watched or running).url + "/subscribe?channel=h") as sub:
        assert (await recv_json(sub))["type"] == "subscribed"
        plays = [
            ([one_shot], [200]),
            ([general], [200]),
            ([create], [201]),
            ([append], [204]),
            ([HEALTH], [200]),
            ([HEALTH, append], [200, 204]),
        ]
        answers = []
        for requests, statuses in plays:
            got, rest = await _answer_then_close(running, requests)
            assert [status for status, _, _ in got] == statuses, got
            assert rest == b""
            answers.append(got)
        assert [json.loads(answers[n][0][2])["acks"] for n in (0, 1)] == [
            [{"type": "ack", "id": "h", "channel": "h"}],
            [{"type": "ack", "id": "n", "channel": "h"}],
        ]
        assert answers[4][0][2] == b"ok\n"
        texts = [(await recv_json(sub))["text"] for _ in range(2)]
    assert texts == ["half", "ndjson"]


async def test_a_client_that_closes_its_side_after_its_request_is_answered_then_closed() -> None:
    running, relay = await start_relay()
    async with relay:
        await _half_closed_requests_are_answered(running)


async def test_a_half_closed_client_is_answered_when_the_answer_waits_for_redis(
    redis_server: RedisServer,
) -> None:
    running, relay = await start_relay(broker=redis_server.url)
    async with relay:
        await _half_closed_requests_are_answered(running)


async def test_half_closed_clients_are_answered_across_processes_on_redis(
    redis_server: RedisServer,
) -> None:
    """Posted to one relay process while a subscriber holds another, on one Redis; and to
    ``--workers 2``, whose workers share the port."""
    async with relays_on(redis_server.url) as (first, second):
        await _half_closed_requests_are_answered(first, second)
    async with Redis.from_url(redis_server.url) as redis:
        await redis.flushall()  # the same streams and ids again, anew
    async with _relay("--broker", redis_server.url, "--workers", "2") as workers:
        await _half_closed_requests_are_answered(workers)


async def test_a_half_close_ends_an_sse_stream() -> None:
    """The exception: a streamed response has no end of its own, and the client's close of
    its side ends it."""
    running, relay = await start_relay()
    async with relay:
        pipe = await _Pipeline.open(running)
        try:
            pipe.writer.write(_wire(_request("GET", "/sse?channel=s"), b""))
            head = await asyncio.wait_for(pipe.reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200 ") and b"text/event-stream" in head
            pipe.writer.write_eof()
            rest = await asyncio.wait_for(pipe.reader.read(), 10)  # up to the relay's close
        finally:
            await pipe.close()
    assert b"event: subscribed\n" in rest  # it streamed, then ended at the half-close


async def test_a_half_close_ends_a_long_poll_and_frees_its_place() -> None:
    """A read that waits is taken as the client gone when it half-closes: no answer, the
    socket closed at once, and its place counted against its address freed."""
    running, relay = await start_relay(long_poll_timeout=30)
    async with relay:
        text = (("Content-Type", "text/plain"),)
        ((made, _, _),) = await _answers(
            running, [(_request("PUT", "/v1/stream/poll", b"", text), b"")]
        )
        assert made == 201
        pipe = await _Pipeline.open(running)
        try:
            poll = _request("GET", "/v1/stream/poll?offset=now&live=long-poll")
            pipe.writer.write(_wire(poll, b""))
            await eventually(lambda: running.relay.durable._polls == 1)
            assert running.relay.gate.per_address.get("127.0.0.1") == 1
            pipe.writer.write_eof()
            rest = await asyncio.wait_for(pipe.reader.read(), 5)  # not the poll's 30 s
        finally:
            await pipe.close()
        assert rest == b""
        await eventually(lambda: "127.0.0.1" not in running.relay.gate.per_address)
        # and the poll stops waiting (not at its 30 s): nothing of it is left
        await eventually(
            lambda: running.relay.durable._polls == 0 and not running.relay.durable._waiters
        )
