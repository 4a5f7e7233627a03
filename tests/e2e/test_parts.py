"""Structured replies end to end, over real sockets: producers send AI SDK chunks on every
producer surface (a WebSocket, a JSON POST, an NDJSON POST), and every subscriber surface
(WebSocket with and without deltas, SSE, a webhook, rewind, and a second relay process on
one real redis-server) gets the completed ``message`` frame with exactly the same ``parts``;
an aborted one comes with its parts so far. A deltas subscriber gets the reply live as
``chunks`` frames, and one that joins mid-reply gets it compacted first, never a part twice.

The reply is the protocol page's own sample (``producer-parts``), and the frame expected is
the page's ``subscriber-parts``, so the page shows what the relay does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from token_relay.client import RelaySubscriber
from token_relay.core.parts import MessageParts
from token_relay.core.protocol import MessageFrame, Snapshot, Subscribed
from websockets.asyncio.client import ClientConnection

from ..conftest import connect, open_producer, recv_json, send_json, start_relay
from ..docs.blocks import docs_block
from ..harness import (
    LiveParts,
    Proxy,
    RedisServer,
    SseReader,
    WebhookReceiver,
    eventually,
    relay_process,
)
from ..test_docs import _json_values

CHANNEL = "c"


def reply(message_id: str) -> list[dict[str, Any]]:
    """The protocol page's structured reply, under ``message_id``, on the URL's channel."""
    events: list[dict[str, Any]] = []
    for value in _json_values(docs_block("producer-parts")):
        assert isinstance(value, dict)
        events.append({**{k: v for k, v in value.items() if k != "channel"}, "id": message_id})
    return events


def expected(message_id: str) -> dict[str, Any]:
    """The page's ``message`` frame for the reply, on ``CHANNEL``, without its position."""
    [frame] = _json_values(docs_block("subscriber-parts"))
    assert isinstance(frame, dict)
    del frame["offset"], frame["epoch"]
    return {**frame, "channel": CHANNEL, "id": message_id}


ABORTED_AFTER = 8
"""Events of the reply sent before its producer goes: the tool's input is half streamed."""

ABORTED_PARTS = [
    {"type": "step-start"},
    {"type": "reasoning", "id": "r1", "text": "The user wants the weather.", "state": "done"},
    {
        "type": "tool-weather",
        "toolCallId": "call-1",
        "state": "input-streaming",
        "input": {"city": "Paris"},
        "rawInput": '{"city":"Paris"}',
    },
]

PLAIN = [
    {"id": "plain", "delta": "Plain "},
    {"id": "plain", "delta": "text."},
    {"id": "plain", "final": True},
]

STRUCTURED = ("ws-reply", "json-reply", "ndjson-reply")


def _core(frame: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in frame.items() if k not in ("offset", "epoch")}


async def _post(port: int, body: bytes, content_type: str) -> tuple[int, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /produce?channel={CHANNEL} HTTP/1.1\r\nHost: r\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    response = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return int(response.split()[1]), json.loads(response.partition(b"\r\n\r\n")[2])


async def _produce_everywhere(base: str, port: int) -> None:
    """The reply over a WebSocket (with a plain reply interleaved), then as a JSON batch,
    then as NDJSON lines; every final acked."""
    async with open_producer(f"{base}/produce?channel={CHANNEL}") as producer:
        structured = reply("ws-reply")
        for index, event in enumerate(structured):
            await send_json(producer, event)
            if index < len(PLAIN):
                await send_json(producer, PLAIN[index])
        acks = [await recv_json(producer) for _ in range(2)]
        assert sorted(ack["id"] for ack in acks) == ["plain", "ws-reply"]
    status, answer = await _post(port, json.dumps(reply("json-reply")).encode(), "application/json")
    assert (status, answer["errors"]) == (200, [])
    assert [ack["id"] for ack in answer["acks"]] == ["json-reply"]
    lines = b"".join(json.dumps(event).encode() + b"\n" for event in reply("ndjson-reply"))
    status, answer = await _post(port, lines, "application/x-ndjson")
    assert (status, answer["errors"]) == (200, [])
    assert [ack["id"] for ack in answer["acks"]] == ["ndjson-reply"]


async def _abort_one(base: str) -> None:
    """Half a reply, then its producer goes (a clean close: aborted at once)."""
    async with open_producer(f"{base}/produce?channel={CHANNEL}") as producer:
        for event in reply("cut-reply")[:ABORTED_AFTER]:
            await send_json(producer, event)
        await send_json(producer, {"id": "cut-plain", "delta": "half"})
        # Everything is applied once a final's ack comes back.
        await send_json(producer, {"id": "sync", "delta": "", "final": True})
        assert (await recv_json(producer))["id"] == "sync"


async def _terminal_frames(ws: ClientConnection, count: int) -> list[dict[str, Any]]:
    """The next ``count`` message and aborted frames; the other frames are returned apart."""
    frames: list[dict[str, Any]] = []
    while len([f for f in frames if f["type"] in ("message", "aborted")]) < count:
        frames.append(await recv_json(ws, 10))
    return frames


def _check_terminals(frames: list[dict[str, Any]]) -> None:
    """The four completed replies and the two aborted ones, exactly."""
    terminal = {f["id"]: _core(f) for f in frames if f["type"] in ("message", "aborted")}
    for message_id in STRUCTURED:
        assert terminal[message_id] == expected(message_id)
    assert terminal["plain"] == {
        "type": "message",
        "channel": CHANNEL,
        "id": "plain",
        "text": "Plain text.",
    }
    assert terminal["sync"] == {"type": "message", "channel": CHANNEL, "id": "sync", "text": ""}
    assert terminal["cut-reply"] == {
        "type": "aborted",
        "channel": CHANNEL,
        "id": "cut-reply",
        "text": "",
        "parts": ABORTED_PARTS,
        "reason": "producer_disconnected",
    }
    assert terminal["cut-plain"] == {
        "type": "aborted",
        "channel": CHANNEL,
        "id": "cut-plain",
        "text": "half",
        "reason": "producer_disconnected",
    }


def _check_deltas(frames: list[dict[str, Any]]) -> None:
    """A deltas subscriber's live frames: the plain replies' deltas, none of the others
    (with Redis, deltas written in one batch arrive joined)."""
    texts: dict[str, str] = {}
    for frame in frames:
        if frame["type"] == "delta":
            texts[frame["id"]] = texts.get(frame["id"], "") + frame["delta"]
    assert texts == {"plain": "Plain text.", "cut-plain": "half"}
    assert [f for f in frames if f["type"] == "snapshot"] == []


TERMINALS = 7
"""ws-reply, plain, json-reply, ndjson-reply, sync, cut-reply, cut-plain."""


@asynccontextmanager
async def _subscribers(base: str, port: int) -> AsyncIterator[tuple[Any, Any, SseReader]]:
    async with (
        connect(f"{base}/subscribe?channel={CHANNEL}") as whole,
        connect(f"{base}/subscribe?channel={CHANNEL}&deltas=1") as live,
        SseReader(port, f"/sse?channel={CHANNEL}&deltas=1") as sse,
    ):
        for ws in (whole, live):
            assert (await recv_json(ws))["type"] == "subscribed"
        assert (await sse.next()).event == "subscribed"
        yield whole, live, sse


async def _sse_frames(sse: SseReader) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while len([f for f in frames if f["type"] in ("message", "aborted")]) < TERMINALS:
        frames.append((await sse.next(10)).json())
    return frames


async def test_every_surface_gets_the_parts_whole_from_every_producer_surface() -> None:
    with WebhookReceiver() as receiver:
        running, relay = await start_relay(webhooks=(receiver.url,), webhook_backoff=0.05)
        async with relay:
            base = running.url
            port = int(base.rsplit(":", 1)[1])
            async with _subscribers(base, port) as (whole, live, sse):
                await _produce_everywhere(base, port)
                await _abort_one(base)
                whole_frames = await _terminal_frames(whole, TERMINALS)
                live_frames = await _terminal_frames(live, TERMINALS)
                sse_frames = await _sse_frames(sse)
            for frames in (whole_frames, live_frames, sse_frames):
                _check_terminals(frames)
            _check_deltas(live_frames)
            _check_deltas(sse_frames)
            assert [f["type"] for f in whole_frames] == ["message"] * 5 + ["aborted"] * 2

            # The history holds the same frames: a page that opens later rewinds to them.
            async with connect(f"{base}/subscribe?channel={CHANNEL}&rewind={TERMINALS}") as late:
                assert (await recv_json(late))["replayed"] == TERMINALS
                rewound = [await recv_json(late) for _ in range(TERMINALS)]
            _check_terminals(rewound)
            assert rewound == [f for f in whole_frames if f["type"] in ("message", "aborted")]

            await eventually(lambda: len(receiver.received) == TERMINALS, timeout=10)
            payloads = {r.json()["id"]: r.json() for r in receiver.received}
            for message_id in STRUCTURED:
                assert payloads[message_id]["parts"] == expected(message_id)["parts"]
                assert payloads[message_id]["text"] == expected(message_id)["text"]
            assert payloads["cut-reply"]["parts"] == ABORTED_PARTS
            assert "parts" not in payloads["plain"] and "parts" not in payloads["cut-plain"]


async def test_a_second_process_on_redis_gets_the_same_frames(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path)
    redis.start()
    flags = ("--broker", redis.url)
    a, b = relay_process(*flags, name="a"), relay_process(*flags, name="b")
    try:
        await asyncio.gather(a.start(), b.start())
        async with (
            _subscribers(b.url, b.port) as (whole, live, sse),
            connect(f"{a.url}/subscribe?channel={CHANNEL}") as local,
        ):
            assert (await recv_json(local))["type"] == "subscribed"
            await _produce_everywhere(a.url, a.port)
            await _abort_one(a.url)
            frames = [await _terminal_frames(ws, TERMINALS) for ws in (whole, live, local)]
            sse_frames = await _sse_frames(sse)
        for seen in [*frames, sse_frames]:
            _check_terminals(seen)
        _check_deltas(frames[1])
        # Both processes delivered the same frames, offsets included.
        assert frames[0] == frames[2]
        async with connect(f"{b.url}/subscribe?channel={CHANNEL}&rewind={TERMINALS}") as late:
            assert (await recv_json(late))["replayed"] == TERMINALS
            assert [await recv_json(late) for _ in range(TERMINALS)] == frames[0]
        assert a.tracebacks == b.tracebacks == 0, a.log + b.log
    finally:
        await asyncio.gather(a.stop(), b.stop())
        redis.kill()


async def test_a_joiner_at_every_point_of_a_reply_gets_it_compacted_then_live_and_exact() -> None:
    """A deltas subscriber joins after each event of the reply: it gets the reply so far
    as one compacted snapshot, then the live chunks, and rebuilds every part exactly once
    (rebuilding applies each chunk, so a part sent twice is refused and fails the test)."""
    running, relay = await start_relay()
    async with relay, open_producer(f"{running.url}/produce?channel={CHANNEL}") as producer:
        events = reply("r")
        for cut in range(1, len(events)):
            message_id = f"r{cut}"
            for event in reply(message_id)[:cut]:
                await send_json(producer, event)
            await send_json(producer, {"id": f"{message_id}-sync", "final": True})
            assert (await recv_json(producer))["id"] == f"{message_id}-sync"
            joiner = await connect(f"{running.url}/subscribe?channel={CHANNEL}&deltas=1")
            view = LiveParts()
            assert (await recv_json(joiner))["type"] == "subscribed"
            snapshot = await recv_json(joiner)
            assert (snapshot["type"], snapshot["id"]) == ("snapshot", message_id)
            view.feed(snapshot)
            for event in reply(message_id)[cut:]:
                await send_json(producer, event)
            assert (await recv_json(producer))["id"] == message_id
            while message_id not in view.ended:
                view.feed(await recv_json(joiner))
            final = view.ended[message_id]
            assert _core(final) == expected(message_id)
            assert view.parts(message_id, final=True) == final["parts"]
            await joiner.close()


async def test_a_joiner_after_seven_events_gets_the_documented_snapshot_then_chunks() -> None:
    documented = _json_values(docs_block("subscriber-live-parts"))
    running, relay = await start_relay()
    async with relay, open_producer(f"{running.url}/produce?channel=chat-42") as producer:
        events = [{k: v for k, v in e.items() if k != "channel"} for e in reply("reply-7")]
        for event in events[:7]:
            await send_json(producer, event)
        await send_json(producer, {"id": "sync", "final": True})
        assert (await recv_json(producer))["id"] == "sync"
        async with connect(f"{running.url}/subscribe?channel=chat-42&deltas=1") as joiner:
            assert (await recv_json(joiner))["type"] == "subscribed"
            assert await recv_json(joiner) == documented[0]
            await send_json(producer, events[7])
            assert await recv_json(joiner) == documented[1]


async def test_a_plain_message_that_turns_structured_goes_on_in_the_part_its_deltas_built() -> None:
    running, relay = await start_relay()
    async with (
        relay,
        open_producer(f"{running.url}/produce?channel={CHANNEL}") as producer,
        connect(f"{running.url}/subscribe?channel={CHANNEL}&deltas=1") as watcher,
    ):
        assert (await recv_json(watcher))["type"] == "subscribed"
        view = LiveParts()
        await send_json(producer, {"id": "m", "delta": "Hi "})
        await send_json(producer, {"id": "m", "chunk": {"type": "start-step"}})
        await send_json(producer, {"id": "m", "delta": "there"})
        await send_json(producer, {"id": "e", "delta": ""})  # an empty delta: no frame
        await send_json(producer, {"id": "e", "chunk": {"type": "reasoning-start", "id": "r"}})
        await send_json(producer, {"id": "e", "delta": "x"})
        frames = [await recv_json(watcher) for _ in range(5)]
        assert [(f["type"], f["id"]) for f in frames] == [
            ("delta", "m"),
            ("chunks", "m"),
            ("chunks", "m"),
            ("chunks", "e"),
            ("chunks", "e"),
        ]
        assert frames[2]["chunks"] == [{"type": "text-delta", "id": "text", "delta": "there"}]
        # The empty delta opened the part before the reasoning: a start tells so.
        assert frames[3]["chunks"] == [
            {"type": "text-start", "id": "text"},
            {"type": "reasoning-start", "id": "r"},
        ]
        for frame in frames:
            view.feed(frame)
        await send_json(producer, {"id": "m", "final": True})
        await send_json(producer, {"id": "e", "final": True})
        while len(view.ended) < 2:
            view.feed(await recv_json(watcher))
        for message_id in ("m", "e"):
            parts = view.ended[message_id]["parts"]
            assert view.parts(message_id, final=True) == parts
        assert view.ended["m"]["text"] == "Hi there"
        assert [p["type"] for p in view.ended["e"]["parts"]] == ["text", "reasoning"]


async def test_every_refused_chunk_is_answered_and_the_connection_goes_on() -> None:
    running, relay = await start_relay()
    url = f"{running.url}/produce?channel={CHANNEL}"
    async with relay, connect(f"{running.url}/subscribe?channel={CHANNEL}") as sub:
        assert (await recv_json(sub))["type"] == "subscribed"
        async with open_producer(url) as producer:
            await send_json(producer, {"id": "good", "chunk": {"type": "text-start", "id": "t"}})
            await send_json(producer, {"id": "bad", "chunk": {"type": "text-start", "id": "t"}})
            await send_json(producer, {"id": "bad", "chunk": {"type": "text-end", "id": "t"}})
            refusals: list[tuple[Any, str]] = [
                ({"type": "finish"}, "invalid_chunk"),
                ({"type": "text-delta", "id": "nope", "delta": "x"}, "unknown_part"),
                ({"type": "text-delta", "id": "t", "delta": "x"}, "part_ended"),
                ({"type": "tool-input-start", "toolCallId": "c", "toolName": "a"}, ""),
                ({"type": "tool-input-start", "toolCallId": "c", "toolName": "a"}, "part_exists"),
                ({"type": "data-big", "data": "x" * 70_000}, "part_too_large"),
            ]
            for chunk, code in refusals:
                await send_json(producer, {"id": "bad", "chunk": chunk})
                if code:
                    error = await recv_json(producer)
                    assert (error["type"], error["code"], error["id"]) == ("error", code, "bad")
                # The other message on the connection is untouched.
                delta = {"type": "text-delta", "id": "t", "delta": code[:1]}
                await send_json(producer, {"id": "good", "chunk": delta})
            both = {"id": "bad", "delta": "x", "chunk": {"type": "start-step"}}
            await send_json(producer, both)
            error = await recv_json(producer)
            assert (error["code"], error["id"]) == ("invalid_event", "bad")
            # 255 more parts fit (the message has 2), the 256th does not.
            await send_json(producer, [{"id": "bad", "chunk": {"type": "start-step"}}] * 255)
            error = await recv_json(producer)
            assert (error["code"], error["index"]) == ("too_many_parts", 254)
            await send_json(producer, {"id": "good", "final": True})
            await send_json(producer, {"id": "bad", "final": True})
            assert [(await recv_json(producer))["id"] for _ in range(2)] == ["good", "bad"]
        good, bad = await recv_json(sub), await recv_json(sub)
        assert _core(good) == {
            "type": "message",
            "channel": CHANNEL,
            "id": "good",
            "text": "iuppp",
            "parts": [{"type": "text", "text": "iuppp", "state": "done"}],
        }
        # The final completes the tool whose input never came: it failed, saying why.
        assert "valid JSON" in bad["parts"][1]["errorText"]
        assert bad["parts"][:2] == [
            {"type": "text", "text": "", "state": "done"},
            {
                "type": "tool-a",
                "toolCallId": "c",
                "state": "output-error",
                "errorText": bad["parts"][1]["errorText"],
            },
        ]
        assert bad["parts"][2:] == [{"type": "step-start"}] * 254


async def test_a_part_too_large_in_a_post_is_413_as_a_message_too_large_is() -> None:
    running, relay = await start_relay()
    async with relay:
        port = int(running.url.rsplit(":", 1)[1])
        body = json.dumps({"id": "m", "chunk": {"type": "data-x", "data": "y" * 70_000}})
        status, answer = await _post(port, body.encode(), "application/json")
        assert status == 413
        assert [error["code"] for error in answer["errors"]] == ["part_too_large"]
        body = json.dumps({"id": "m", "chunk": {"type": "text-end", "id": "t"}})
        status, answer = await _post(port, body.encode(), "application/json")
        assert status == 200
        assert [error["code"] for error in answer["errors"]] == ["unknown_part"]


async def test_an_sse_reader_cut_mid_reply_resumes_with_the_reply_compacted() -> None:
    """An SSE deltas reader reads half a structured reply live, is cut, and comes back with
    Last-Event-ID: a fresh compacted snapshot replaces what it held, then the rest live; it
    ends with exactly the message's parts."""
    running, relay = await start_relay()
    port = int(running.url.rsplit(":", 1)[1])
    events = reply("r")
    async with relay, open_producer(f"{running.url}/produce?channel={CHANNEL}") as producer:
        view = LiveParts()
        async with SseReader(port, f"/sse?channel={CHANNEL}&deltas=1") as first:
            confirmation = await first.next()
            assert confirmation.event == "subscribed"
            for event in events[:6]:
                await send_json(producer, event)
            for _ in range(6):
                got = await first.next()
                assert got.event == "chunks"
                view.feed(got.json())
        for event in events[6:12]:  # while it is away
            await send_json(producer, event)
        resume = [("Last-Event-ID", str(confirmation.id))]
        async with SseReader(port, f"/sse?channel={CHANNEL}&deltas=1", resume) as again:
            assert (await again.next()).event == "subscribed"
            snapshot = await again.next()
            assert snapshot.event == "snapshot" and "chunks" in snapshot.json()
            view.feed(snapshot.json())
            for event in events[12:]:
                await send_json(producer, event)
            while "r" not in view.ended:
                view.feed((await again.next()).json())
        assert view.ended["r"]["parts"] == expected("r")["parts"]
        assert view.parts("r", final=True) == view.ended["r"]["parts"]


async def test_the_python_subscriber_holds_a_structured_reply_live_across_a_cut() -> None:
    """RelaySubscriber rebuilds a reply's parts from its live frames: the text before its
    first chunk as the implicit text part, the chunks, and after a dropped connection the
    compacted snapshot in their place; mid-reply and at its end they are exact."""
    running, relay = await start_relay()
    events = [{"id": "r", "delta": "Hi "}, *reply("r")]
    async with (
        relay,
        Proxy(int(running.url.rsplit(":", 1)[1])) as proxy,
        open_producer(f"{running.url}/produce?channel={CHANNEL}") as producer,
        RelaySubscriber(proxy.url, [CHANNEL], backoff=(0.05, 0.2)) as feed,
    ):
        frames = aiter(feed)
        assert isinstance(await anext(frames), Subscribed)
        core = MessageParts()
        for n, event in enumerate(events[:9]):
            await send_json(producer, event)
            if "chunk" in event:
                core.apply(event["chunk"])
            else:
                core.delta(event["delta"])
            await anext(frames)
            if n:
                assert feed.parts(CHANNEL, "r") == core.parts(), n
        assert feed.text(CHANNEL, "r") == "Hi "
        proxy.cut()
        for event in events[9:12]:  # while it is away
            await send_json(producer, event)
            core.apply(event["chunk"])
        while not isinstance(frame := await anext(frames), Snapshot):
            pass
        assert frame.chunks == core.catch_up()
        assert feed.parts(CHANNEL, "r") == core.parts()
        for event in events[12:]:
            await send_json(producer, event)
            if "chunk" in event:
                core.apply(event["chunk"])
        while not isinstance(frame := await anext(frames), MessageFrame):
            pass
        core.finalize()
        assert frame.parts == core.parts()
        assert frame.parts[0] == {"type": "text", "text": "Hi ", "state": "done"}
        assert feed.parts(CHANNEL, "r") is None  # it ended
