"""Structured messages across relay processes on one real redis-server: a joiner on another
process gets no snapshot of one in progress, a producer session taken over by another
process continues its parts exactly, and a message aborted by another process because its
own died carries its parts so far. "Exactly" means: the frame a single process gives for
the same events, sent under another id."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ..conftest import assert_silent, connect, open_producer, recv_json, send_json
from ..harness import LiveParts, RedisServer, ServiceProcess, relays_on
from .test_parts import ABORTED_AFTER, reply

CHANNEL = "c"


def _events(message_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A structured reply in two halves: plain text first (its implicit text part), the
    reasoning and half a tool call's input, top-level deltas ending in half a surrogate
    pair; then the pair's other half, the rest of the reply and the final."""
    chunks = reply(message_id)
    first = [
        {"id": message_id, "delta": "Hi "},
        *chunks[:ABORTED_AFTER],
        {"id": message_id, "delta": "there \ud83d"},
    ]
    return first, [{"id": message_id, "delta": "\ude00"}, *chunks[ABORTED_AFTER:]]


def _core(frame: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in frame.items() if k not in ("offset", "epoch", "id")}


async def _sync(producer: Any, message_id: str) -> None:
    """Everything sent before is applied, and in Redis: a final's ack waits for its
    terminal write, queued after every write before it."""
    await send_json(producer, {"id": message_id, "final": True})
    assert (await recv_json(producer))["id"] == message_id


async def _subscribed(url: str, query: str = "") -> Any:
    ws = await connect(f"{url}/subscribe?channel={CHANNEL}{query}")
    assert (await recv_json(ws))["type"] == "subscribed"
    return ws


async def _single_process(url: str, message_id: str, watcher: Any, final: bool) -> Any:
    """The terminal frame one process gives for the same events (completed, or aborted by
    a clean close after the first half)."""
    first, rest = _events(message_id)
    async with open_producer(f"{url}/produce?channel={CHANNEL}") as producer:
        for event in first + (rest if final else []):
            await send_json(producer, event)
        if final:
            assert (await recv_json(producer))["id"] == message_id
        else:
            await _sync(producer, f"{message_id}-sync")
            assert (await recv_json(watcher))["id"] == f"{message_id}-sync"
    return await recv_json(watcher)


async def test_a_joiner_on_another_process_gets_the_reply_compacted_then_live(
    redis_server: RedisServer,
) -> None:
    async with relays_on(redis_server.url) as (a, b):
        watcher = await _subscribed(b.url)
        async with open_producer(f"{a.url}/produce?channel={CHANNEL}") as producer:
            first, rest = _events("s")
            for event in first:
                await send_json(producer, event)
            await send_json(producer, {"id": "p", "delta": "so far"})
            await _sync(producer, "sync")
            assert (await recv_json(watcher))["id"] == "sync"
            joiner = await _subscribed(b.url, "&deltas=1")
            # Each message in progress has its snapshot: the plain one its text, the
            # structured one its parts so far, rebuilt from its log in Redis and compacted
            # (its text before its first chunk is its implicit text part).
            snapshots = {}
            for _ in range(2):
                snapshot = await recv_json(joiner)
                assert snapshot["type"] == "snapshot"
                snapshots[snapshot["id"]] = snapshot
            assert snapshots["p"] == {
                "type": "snapshot",
                "channel": CHANNEL,
                "id": "p",
                "text": "so far",
            }
            # Half a surrogate pair is held at the cut: it ends the part's one delta, and
            # the live delta after brings the other half.
            assert snapshots["s"]["chunks"][:3] == [
                {"type": "text-start", "id": "text"},
                {"type": "text-delta", "id": "text", "delta": "Hi there \ud83d"},
                {"type": "start-step"},
            ]
            assert snapshots["s"]["text"] == "Hi there "
            view = LiveParts()
            view.feed(snapshots["s"])
            for event in rest:
                await send_json(producer, event)
            assert (await recv_json(producer))["id"] == "s"
            while "s" not in view.ended:
                frame = await recv_json(joiner)
                assert frame["type"] in ("chunks", "message"), frame
                view.feed(frame)
            whole = view.ended["s"]
            assert view.parts("s", final=True) == whole["parts"]
        expected = await _single_process(b.url, "one", watcher, final=True)
        assert whole["type"] == "message"
        assert _core(whole) == _core(expected)
        assert [p["type"] for p in whole["parts"]][:2] == ["text", "step-start"]
        assert whole["text"] == "Hi there 😀It is 21 °C in Paris."
        await joiner.close()
        await watcher.close()
        assert a.tracebacks == b.tracebacks == 0, a.log + b.log


async def _first_half_sent(
    a: ServiceProcess, b: ServiceProcess
) -> tuple[Any, Any, str, list[dict[str, Any]]]:
    """A watcher on ``b``; a producer on ``a`` that sent the first half of the reply ``m``,
    known in Redis (a message after it reached the watcher): ``(watcher, producer, its
    session's token, the rest of the reply)``."""
    watcher = await _subscribed(b.url)
    first_half, rest = _events("m")
    producer = await connect(f"{a.url}/produce?channel={CHANNEL}")
    token = (await recv_json(producer))["session"]
    for event in first_half:
        await send_json(producer, event)
    await _sync(producer, "sync")
    assert (await recv_json(watcher))["id"] == "sync"
    return watcher, producer, token, rest


async def test_a_websocket_session_taken_over_continues_its_parts_exactly(
    redis_server: RedisServer,
) -> None:
    async with relays_on(redis_server.url, "--session-grace", "15") as (a, b):
        watcher, producer, token, rest = await _first_half_sent(a, b)
        # Late events for a message that completed change nothing, here or in Redis.
        await send_json(producer, {"id": "sync", "delta": "late", "seq": 2})
        await send_json(producer, {"id": "sync", "chunk": {"type": "start-step"}, "seq": 3})
        await _sync(producer, "sync2")
        assert (await recv_json(watcher))["id"] == "sync2"
        assert producer.transport is not None
        producer.transport.abort()  # vanished: its session waits to be resumed
        async with connect(f"{b.url}/produce?channel={CHANNEL}&session={token}") as second:
            assert (await recv_json(second))["resumed"] is True
            for event in rest:
                await send_json(second, event)
            assert (await recv_json(second))["id"] == "m"
        moved = await recv_json(watcher)
        await assert_silent(watcher, 0.3)  # no aborted, nothing twice
        expected = await _single_process(b.url, "one", watcher, final=True)
        assert moved["type"] == "message"
        assert _core(moved) == _core(expected)
        await watcher.close()
        assert a.tracebacks == b.tracebacks == 0, a.log + b.log


async def _post_lines(port: int, path: str, events: list[dict[str, Any]]) -> tuple[int, Any]:
    body = b"".join(json.dumps(event).encode() + b"\n" for event in events)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Type: application/x-ndjson\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    raw = await reader.read()
    writer.close()
    head, _, answer = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(answer)


async def test_a_named_producer_continues_its_parts_on_another_process(
    redis_server: RedisServer,
) -> None:
    async with relays_on(redis_server.url) as (a, b):
        watcher = await _subscribed(b.url)
        path = f"/produce?channel={CHANNEL}&producer=lambda-7"
        first_half, rest = _events("n")
        status, answer = await _post_lines(a.port, path, first_half)
        assert (status, answer["errors"]) == (200, []), answer
        status, answer = await _post_lines(b.port, path, rest)
        assert (status, [ack["id"] for ack in answer["acks"]]) == (200, ["n"]), answer
        moved = await recv_json(watcher)
        expected = await _single_process(b.url, "one", watcher, final=True)
        assert _core(moved) == _core(expected)
        await watcher.close()


async def test_a_message_whose_process_died_is_aborted_with_its_parts(
    redis_server: RedisServer,
) -> None:
    async with relays_on(redis_server.url, "--session-grace", "0.5", "--lease-seconds", "1") as (
        a,
        b,
    ):
        watcher = await _subscribed(b.url)
        async with open_producer(f"{a.url}/produce?channel={CHANNEL}") as producer:
            first_half, _ = _events("k")
            for event in first_half:
                await send_json(producer, event)
            await _sync(producer, "sync")
            assert (await recv_json(watcher))["id"] == "sync"
            await a.kill()  # kill -9: no abort from A itself
            aborted = await recv_json(watcher, 15)
        await assert_silent(watcher, 1.0)  # exactly once
        expected = await _single_process(b.url, "one", watcher, final=False)
        assert (aborted["type"], aborted["reason"]) == ("aborted", "relay_lost")
        assert (expected["type"], expected["reason"]) == ("aborted", "producer_disconnected")
        assert _core(aborted) | {"reason": ""} == _core(expected) | {"reason": ""}
        # The half pair still waiting for its other half is left out, as it is there.
        assert aborted["text"] == "Hi there "
        assert aborted["parts"][0] == {"type": "text", "text": "Hi there ", "state": "streaming"}
        assert len(aborted["parts"]) == 4
        await watcher.close()


async def test_a_session_taken_over_aborts_a_message_whose_log_was_cut(
    redis_server: RedisServer,
) -> None:
    from redis.asyncio import Redis

    async with relays_on(redis_server.url, "--session-grace", "15") as (a, b):
        watcher, producer, token, _ = await _first_half_sent(a, b)
        redis = Redis.from_url(redis_server.url)
        try:
            [key] = await redis.keys("tr:text:*|m")
            await redis.setrange(key, 1, "x")  # as the script cuts a log past its bound
        finally:
            await redis.aclose()
        assert producer.transport is not None
        producer.transport.abort()
        async with connect(f"{b.url}/produce?channel={CHANNEL}&session={token}") as second:
            assert (await recv_json(second))["resumed"] is True
            aborted = await recv_json(watcher)
            # Its parts can't be continued: it is aborted, with the text it had before its
            # first chunk and no parts, and a later event for it is refused.
            assert (aborted["type"], aborted["id"], aborted["reason"]) == (
                "aborted",
                "m",
                "relay_lost",
            )
            assert (aborted["text"], "parts" in aborted) == ("Hi ", False)
            await send_json(second, {"id": "m", "delta": "more"})
            assert (await recv_json(second))["code"] == "message_aborted"
        await assert_silent(watcher, 0.3)
        assert a.tracebacks == b.tracebacks == 0, a.log + b.log


async def test_a_redis_restart_mid_reply_leaves_the_structured_reply_exact(
    redis_server: RedisServer,
) -> None:
    """Redis is killed while a structured reply streams and its events keep coming; once it
    is back (empty), the producer's process rewrites the reply's log from its own parts and
    sends the compacted snapshot: a deltas subscriber on the other process joining then
    rebuilds the reply, and ends with exactly its parts."""
    async with relays_on(redis_server.url) as (a, b):
        events = reply("m")
        async with open_producer(f"{a.url}/produce?channel={CHANNEL}") as producer:
            for event in [{"id": "m", "delta": "Hi "}, *events[:4]]:
                await send_json(producer, event)
            await _sync(producer, "sync")
            redis_server.kill()
            for relay in (a, b):  # each has seen the outage: it resumes its subscribers after
                await eventually_async(lambda relay=relay: relay.http_status("/readyz"), 503)
            for event in events[4:9]:  # applied here; their writes fail
                await send_json(producer, event)
            redis_server.start()
            for relay in (a, b):
                await eventually_async(lambda relay=relay: relay.http_status("/readyz"), 200)
            joiner = await _subscribed(b.url, "&deltas=1")
            view = LiveParts()
            for event in events[9:]:
                await send_json(producer, event)
            while "m" not in view.ended:
                frame = await recv_json(joiner, 10)
                assert frame["type"] in ("snapshot", "chunks", "message"), frame
                view.feed(frame)
            assert "m" in view.snapshots  # it joined mid-reply: compacted first
        final = view.ended["m"]
        assert final["type"] == "message"
        assert view.parts("m", final=True) == final["parts"]
        assert final["text"] == "Hi It is 21 °C in Paris."
        await joiner.close()


async def eventually_async(probe: Any, wanted: object, within: float = 20.0) -> None:
    """Poll ``probe()`` until it returns ``wanted``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while (got := await probe()) != wanted:
        assert loop.time() < deadline, f"still {got!r}, not {wanted!r}"
        await asyncio.sleep(0.05)
