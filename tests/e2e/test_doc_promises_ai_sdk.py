"""Documented promises of the AI SDK's WebSocket chat route (``/ai-sdk/ws``) and of named
HTTP producers, each proved over real sockets against a real relay (docs/reference/protocol.md
and docs/reference/errors.md): ``producer_busy`` for the 257th request of one name and for a
producer over its high-water mark, ``no_reply``, ``too_many_requests``, ``unknown_sequence``
once a request is forgotten (or on another process), a binary frame closing with 1003, and a
``send`` of more than 10,000 messages refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any

import pytest
from token_relay import Settings
from token_relay.edge import aisdkws
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from ..conftest import (
    NO_SWEEPS,
    RunningRelay,
    connect,
    open_producer,
    recv_json,
    send_json,
    start_relay,
)
from ..harness import RedisServer, eventually, relays_on
from .test_ai_sdk_ws import CHAT, _frames_until_end, _relay, _send, _ws, takes_requests
from .test_ai_sdk_ws_cluster import _ws as _process_ws
from .test_http_producers import _answered, _chunk, _chunked, _lines, _port, _post


def _resume(request_id: str, chat: str = CHAT, last: int | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "resume", "requestId": request_id, "id": chat}
    if last is not None:
        frame["lastSequence"] = last
    return frame


async def _next_request(producer: ClientConnection) -> dict[str, Any]:
    """The next ``request`` frame a producer gets (other frames passed over)."""
    while True:
        frame = await recv_json(producer, 10)
        if frame["type"] == "request":
            return frame


def _producer_connection(running: RunningRelay, chat: str) -> Any:
    """The relay's side of the producer connection that takes ``chat``'s requests."""
    (connection,) = [c for ch, c in running.relay.producers.takers.values() if ch == chat]
    return connection


# errors.md: `producer_busy` -- 256 requests of this named producer are in progress; nothing
# of this one was applied. protocol.md: at most 256 requests of one name at a time: one more
# is refused whole with `producer_busy` (409), nothing of it applied.
async def test_the_257th_request_of_one_named_producer_is_producer_busy() -> None:
    # 256 requests held open, one more, and a subscriber: past the default 256 per address.
    running, relay = await start_relay(max_connections_per_ip=1024)
    async with relay, connect(f"{running.url}/subscribe?channel=c&deltas=1") as sub:
        assert (await recv_json(sub))["type"] == "subscribed"
        port, path = _port(running.url), "/produce?channel=c&producer=gw"
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for n in range(256):
                held.append(await _chunked(port, path))
                await _chunk(held[-1][1], {"id": f"m{n}", "delta": "x"})
                # In progress: its first line is applied while its body is still open.
                assert (await recv_json(sub))["id"] == f"m{n}"
            late = _lines({"id": "late", "delta": "y", "final": True})
            status, answer = await _post(port, path, late, "application/x-ndjson")
            assert status == 409
            assert [error["code"] for error in answer["errors"]] == ["producer_busy"]
            assert answer["acks"] == []
            # One ends: 255 are in progress, and the next request is taken.
            reader, writer = held[0]
            await _chunk(writer, {"id": "m0", "final": True}, last=True)
            assert (await _answered(reader))[0] == 200
            again = _lines({"id": "again", "delta": "z", "final": True})
            status, answer = await _post(port, path, again, "application/x-ndjson")
            assert (status, [a["id"] for a in answer["acks"]]) == (200, ["again"])
            for n, (reader, writer) in enumerate(held[1:], 1):
                await _chunk(writer, {"id": f"m{n}", "final": True}, last=True)
                assert (await _answered(reader))[0] == 200
        finally:
            for _, writer in held:
                writer.close()
        ended: list[str] = []
        while len(ended) < 257:
            frame = await recv_json(sub)
            assert frame["id"] != "late", frame  # nothing of the refused request was applied
            if frame["type"] == "message":
                ended.append(frame["id"])
    assert sorted(ended) == sorted([*(f"m{n}" for n in range(256)), "again"])


# protocol.md: a producer whose socket is over its high-water mark is not handed the request
# (`producer_busy`). errors.md: (`/ai-sdk/ws`, to the transport's client) the channel's
# producer is not reading: the `send` was not handed to it.
async def test_a_send_to_a_producer_over_its_high_water_mark_is_producer_busy() -> None:
    high_water = Settings().subscriber_high_water_bytes
    async with _relay(**NO_SWEEPS) as running, contextlib.AsyncExitStack() as stack:
        port = _port(running.url)
        # A producer that stops reading, with a small receive buffer: once the kernel's
        # buffers are full, what it is sent waits in the relay's socket buffer.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        producer = await stack.enter_async_context(
            running.connect(f"/produce?channel={CHAT}", sock=sock, max_size=None)
        )
        await eventually(lambda: takes_requests(running, CHAT))
        relayed = _producer_connection(running, CHAT)
        producer.transport.pause_reading()
        big = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "x" * 900_000}]}
        handed: list[str] = []
        while relayed.transport.get_write_buffer_size() <= high_water:
            assert len(handed) < 64, "the producer's socket never filled"
            # One chat per connection is in progress: each send on a connection of its own.
            ws = await stack.enter_async_context(connect(_ws(running)))
            await send_json(ws, {**_send(f"filler-{len(handed)}"), "messages": [big]})
            # Frames of a connection are answered in order: once this resume is, the send
            # before it was handed (a refused one would have had its error first).
            await send_json(ws, _resume("sync", "elsewhere"))
            assert await recv_json(ws) == {"type": "no-active", "requestId": "sync"}
            handed.append(f"filler-{len(handed)}")
        probe = await stack.enter_async_context(connect(_ws(running)))
        await send_json(probe, _send("probe"))
        refused = await recv_json(probe)
        assert refused["type"] == "error" and refused["requestId"] == "probe"
        assert refused["errorText"].startswith("producer_busy: ")
        # Once the producer reads again, it has every send handed, then the next one: the
        # refused one was never handed to it.
        producer.transport.resume_reading()
        assert [(await _next_request(producer))["request"] for _ in handed] == handed
        await send_json(probe, _send("probe-2"))
        assert (await _next_request(producer))["request"] == "probe-2"


# errors.md: `no_reply` -- the producer handed a `send` started no reply within 30 seconds.
async def test_a_handed_send_with_no_reply_in_time_is_no_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert aisdkws.REPLY_START_SECONDS == 30.0  # the documented 30 seconds
    monkeypatch.setattr(aisdkws, "REPLY_START_SECONDS", 0.3)
    async with (
        _relay() as running,
        running.connect(f"/produce?channel={CHAT}") as producer,
        connect(_ws(running)) as ws,
    ):
        await eventually(lambda: takes_requests(running, CHAT))
        await send_json(ws, _send("q"))
        handed = await _next_request(producer)
        assert (handed["request"], handed["channel"]) == ("q", CHAT)
        # The producer never starts the reply under handed["id"].
        failed = await recv_json(ws)
        assert failed["type"] == "error" and failed["requestId"] == "q"
        assert failed["errorText"].startswith("no_reply: ")


# errors.md: `too_many_requests` -- 16 requests are in progress on this connection; this one
# was not started. protocol.md (Bounds): 16 requests in progress per connection.
async def test_the_17th_request_in_progress_on_one_connection_is_too_many_requests() -> None:
    async with (
        _relay() as running,
        running.connect("/produce") as producer,
        connect(_ws(running)) as ws,
    ):
        # 17 chats, each with a reply in progress: a resume of each stays in progress.
        for n in range(17):
            await send_json(producer, {"id": f"m{n}", "delta": "so far", "channel": f"chat-{n}"})
        await eventually(lambda: len(running.relay.owned_messages()) == 17)
        for n in range(16):
            await send_json(ws, _resume(f"r{n}", f"chat-{n}"))
        frames = [await recv_json(ws) for _ in range(16 * 4)]  # start, then 3 chunks each
        started = {f["requestId"] for f in frames if f["type"] == "start"}
        assert started == {f"r{n}" for n in range(16)}
        await send_json(ws, _resume("r16", "chat-16"))
        refused = await recv_json(ws)
        assert refused["type"] == "error" and refused["requestId"] == "r16"
        assert refused["errorText"].startswith("too_many_requests: ")
        # One ends: the 17th is taken now.
        await send_json(producer, {"id": "m0", "final": True, "channel": "chat-0"})
        assert (await _frames_until_end(ws))[-1] == {"type": "end", "requestId": "r0"}
        await send_json(ws, _resume("r16", "chat-16"))
        assert await recv_json(ws) == {"type": "start", "requestId": "r16"}


async def _replay(ws: ClientConnection, request_id: str, chat: str = CHAT) -> list[Any]:
    """Resume ``chat`` from its start as request ``request_id``: its first three chunks
    (start, text-start, the text so far), once its ``start`` came."""
    await send_json(ws, _resume(request_id, chat))
    assert await recv_json(ws) == {"type": "start", "requestId": request_id}
    chunks = [await recv_json(ws) for _ in range(3)]
    assert [c["sequence"] for c in chunks] == [0, 1, 2]
    return [c["chunk"] for c in chunks]


async def _resumed(ws: ClientConnection, request_id: str, last: int) -> dict[str, Any]:
    """The first answer to a resume of CHAT's request ``request_id`` after ``last``."""
    await send_json(ws, _resume(request_id, CHAT, last))
    return await recv_json(ws)


def _unknown(frame: dict[str, Any], request_id: str) -> bool:
    return bool(
        frame["type"] == "error"
        and frame["requestId"] == request_id
        and frame["errorText"].startswith("unknown_sequence: ")
    )


# protocol.md (Sequences): a process remembers the chunks it sent for its last 1,024
# requests; a `requestId` it does not remember is `unknown_sequence`.
async def test_a_request_past_the_last_1024_is_forgotten() -> None:
    async with (
        _relay(max_subscribes_per_second=100_000.0) as running,
        running.connect(f"/produce?channel={CHAT}") as producer,
    ):
        await send_json(producer, {"id": "m1", "delta": "so far"})
        await eventually(lambda: len(running.relay.owned_messages()) == 1)
        for request_id in ("oldest", "second"):
            async with connect(_ws(running)) as ws:
                await _replay(ws, request_id)
        async with connect(_ws(running)) as ws:
            # 1,023 requests more: 1,025 in all, of which the oldest is forgotten.
            for n in range(1023):
                await send_json(ws, _resume(f"n{n}", "empty"))
            for n in range(1023):
                assert await recv_json(ws) == {"type": "no-active", "requestId": f"n{n}"}
            assert _unknown(await _resumed(ws, "oldest", 2), "oldest")
            assert await _resumed(ws, "second", 2) == {"type": "start", "requestId": "second"}


# protocol.md (Sequences): ... (the first 10,000 chunks and 1 MiB of each); an `N` past them
# is `unknown_sequence`.
async def test_chunks_past_the_first_10000_of_a_request_are_not_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert aisdkws.MAX_LOGGED_CHUNKS == 10_000  # the documented 10,000 chunks
    monkeypatch.setattr(aisdkws, "MAX_LOGGED_CHUNKS", 4)
    async with (
        _relay() as running,
        running.connect(f"/produce?channel={CHAT}") as producer,
    ):
        await send_json(producer, {"id": "m1", "delta": "a"})
        await eventually(lambda: len(running.relay.owned_messages()) == 1)
        async with connect(_ws(running)) as ws:
            await _replay(ws, "q")
            for delta in ("b", "c", "d"):
                await send_json(producer, {"id": "m1", "delta": delta})
            sent = [(await recv_json(ws))["sequence"] for _ in range(3)]
            assert sent == [3, 4, 5]
        async with connect(_ws(running)) as ws:
            assert _unknown(await _resumed(ws, "q", 4), "q")  # chunk 4 is the 5th
            assert await _resumed(ws, "q", 3) == {"type": "start", "requestId": "q"}
            assert (await recv_json(ws))["sequence"] == 4


# protocol.md (Sequences): "... and at most 64 MiB for all of them together: past that, a
# request's new chunks are not remembered until older requests are forgotten".
async def test_chunks_past_64_mib_for_all_requests_together_are_not_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert aisdkws.MAX_LOGGED_TOTAL_BYTES == 64 << 20  # the documented 64 MiB in all
    async with (
        _relay() as running,
        running.connect(f"/produce?channel={CHAT}") as producer,
    ):
        await send_json(producer, {"id": "m1", "delta": "a"})
        await eventually(lambda: len(running.relay.owned_messages()) == 1)
        async with connect(_ws(running)) as first, connect(_ws(running)) as second:
            await _replay(first, "p")  # remembered: within every bound
            # What p's chunks hold already takes the process past a total of one byte.
            monkeypatch.setattr(aisdkws, "MAX_LOGGED_TOTAL_BYTES", 1)
            await _replay(second, "q")
        async with connect(_ws(running)) as ws:
            assert _unknown(await _resumed(ws, "q", 0), "q")  # none of q's chunks kept
            assert await _resumed(ws, "p", 2) == {"type": "start", "requestId": "p"}


async def test_chunks_past_the_first_mib_of_a_request_are_not_remembered() -> None:
    assert aisdkws.MAX_LOGGED_BYTES == 1 << 20  # the documented 1 MiB
    async with (
        _relay() as running,
        running.connect(f"/produce?channel={CHAT}") as producer,
    ):
        await send_json(producer, {"id": "m1", "delta": "a"})
        await eventually(lambda: len(running.relay.owned_messages()) == 1)
        sizes: list[int] = []
        async with connect(_ws(running), max_size=None) as ws:
            await send_json(ws, _resume("q"))
            assert await recv_json(ws) == {"type": "start", "requestId": "q"}
            for _ in range(12):
                # Two bytes of UTF-8 per character: 1.2 MB of chunks, under a text's bound.
                await send_json(producer, {"id": "m1", "delta": "é" * 50_000})
            while len(sizes) < 3 + 12:
                raw = await asyncio.wait_for(ws.recv(), 10)
                assert json.loads(raw)["sequence"] == len(sizes)
                sizes.append(len(raw.encode()))
        # The chunks whose frames, together, fit in 1 MiB are the ones remembered.
        kept = max(k for k in range(len(sizes) + 1) if sum(sizes[:k]) <= 1 << 20)
        assert 3 < kept < len(sizes)
        async with connect(_ws(running), max_size=None) as ws:
            assert _unknown(await _resumed(ws, "q", kept), "q")
            assert await _resumed(ws, "q", kept - 1) == {"type": "start", "requestId": "q"}
            assert (await recv_json(ws))["sequence"] == kept


# protocol.md (Sequences): behind a load balancer, a `resume` with `lastSequence` that lands
# on another process is `unknown_sequence`, and a resume without it (a replay from sequence
# 0) is exact on every process.
async def test_a_last_sequence_on_another_process_is_unknown_sequence(
    redis_server: RedisServer,
) -> None:
    async with (
        relays_on(redis_server.url) as (first, second),
        open_producer(f"{first.url}/produce?channel={CHAT}") as producer,
        connect(f"{first.url}/subscribe?channel={CHAT}&deltas=1") as here,
        connect(f"{second.url}/subscribe?channel={CHAT}&deltas=1") as there,
    ):
        assert [(await recv_json(sub))["type"] for sub in (here, there)] == ["subscribed"] * 2
        await send_json(producer, {"id": "m1", "delta": "so far"})
        # The reply is under way on both processes.
        assert [(await recv_json(sub))["delta"] for sub in (here, there)] == ["so far"] * 2
        async with connect(_process_ws(first)) as ws:
            replayed = await _replay(ws, "q")
        async with connect(_process_ws(second)) as ws:
            assert _unknown(await _resumed(ws, "q", 2), "q")
            assert await _replay(ws, "q-again") == replayed
        async with connect(_process_ws(first)) as ws:
            assert await _resumed(ws, "q", 2) == {"type": "start", "requestId": "q"}


# protocol.md (Errors): a binary frame [closes the connection] with 1003.
async def test_a_binary_frame_closes_the_connection_with_1003() -> None:
    async with _relay() as running, connect(_ws(running)) as ws:
        await send_json(ws, _resume("q"))
        assert await recv_json(ws) == {"type": "no-active", "requestId": "q"}
        await ws.send(json.dumps(_resume("r")).encode())
        with pytest.raises(ConnectionClosed):
            await recv_json(ws)
        assert ws.close_code == 1003


# protocol.md (Bounds): a `send` carries at most 10,000 messages; (Errors) a bad field gets
# `error` with its `requestId`, `invalid_frame`.
async def test_a_send_of_more_than_10000_messages_is_refused() -> None:
    message = {"id": "u", "role": "user", "parts": []}
    async with (
        _relay() as running,
        running.connect(f"/produce?channel={CHAT}") as producer,
        connect(_ws(running)) as ws,
    ):
        await eventually(lambda: takes_requests(running, CHAT))
        await send_json(ws, {**_send("many"), "messages": [message] * 10_001})
        refused = await recv_json(ws)
        assert refused["type"] == "error" and refused["requestId"] == "many"
        assert refused["errorText"].startswith("invalid_frame: messages")
        await send_json(ws, {**_send("most"), "messages": [message] * 10_000})
        handed = await _next_request(producer)
        assert handed["request"] == "most" and len(handed["messages"]) == 10_000
