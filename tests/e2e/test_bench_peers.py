"""The benchmark's Node peers do the job they are compared on: the ``ws`` relay
(``bench/wsrelay``) assembles by the seed's rules and speaks the frames the ingest and
fan-out cases check; ``POST /produce`` under ``wrk`` counts every answer that is no ack."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from bench import cases, produceload, wsrelay
from bench.wire import BenchError, build_messages
from tests.harness import ServiceProcess, relay_process


@contextlib.asynccontextmanager
async def _service(module: str, name: str) -> AsyncIterator[ServiceProcess]:
    """``python -m MODULE``, started on a free port, until the block ends."""
    service = ServiceProcess(module, name=name)
    await service.start()
    try:
        yield service
    finally:
        await service.terminate()


@pytest.fixture
async def peer() -> AsyncIterator[ServiceProcess]:
    await wsrelay.install()
    async with _service("bench.wsrelay", "Node ws relay") as service:
        yield service


async def recv(ws: ClientConnection) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 10))
    return frame


async def test_the_ws_relay_assembles_by_the_seed_rules(peer: ServiceProcess) -> None:
    async with (
        connect(f"{peer.url}/subscribe?channel=c") as plain,
        connect(f"{peer.url}/subscribe?channel=c&deltas=1") as live,
        connect(f"{peer.url}/produce?channel=c") as producer,
    ):
        for ws in (plain, live):
            assert await recv(ws) == {"type": "subscribed", "channel": "c", "offset": 0}
        for event in (
            {"id": "m", "delta": "hel"},
            {"id": "e"},
            {"id": "m", "delta": ""},
            {"id": "m", "delta": "lo", "final": True},
            {"id": "m", "delta": "ignored", "final": True},
            {"id": "m", "delta": "ignored too"},
            {"id": "e", "final": True},
        ):
            await producer.send(json.dumps(event))
        acks = [await recv(producer) for _ in range(3)]
        assert acks == [{"type": "ack", "id": i, "channel": "c"} for i in ("m", "m", "e")]
        messages = [
            {"type": "message", "channel": "c", "id": "m", "text": "hello", "offset": 1},
            {"type": "message", "channel": "c", "id": "e", "text": "", "offset": 2},
        ]
        assert [await recv(plain) for _ in range(2)] == messages
        deltas = [
            {"type": "delta", "channel": "c", "id": "m", "delta": piece}
            for piece in ("hel", "", "lo")
        ]
        got = [await recv(live) for _ in range(5)]
        assert got == [*deltas, messages[0], messages[1]]
        # A subscribe frame without deltas: subscribed again, at the channel's offset.
        await live.send(json.dumps({"type": "subscribe", "channel": "c", "deltas": False}))
        assert await recv(live) == {"type": "subscribed", "channel": "c", "offset": 2}


async def test_the_ingest_case_drives_the_ws_relay_unchanged(peer: ServiceProcess) -> None:
    messages = build_messages(200, 10)
    record = await cases.stream(peer, peer, "ingest", messages)
    assert record["events"] == 200 * 11


async def test_wrk_counts_an_answer_without_its_ack_as_a_failure(peer: ServiceProcess) -> None:
    # The ws relay answers plain HTTP with 426: every request is a failure, none an ack.
    url = f"http://127.0.0.1:{peer.port}/produce?channel=c"
    summary = await asyncio.to_thread(produceload.wrk, url, 1, "t")
    assert summary["requests"] > 0
    assert summary["unacked"] == summary["requests"]


async def test_wrk_posts_to_the_relay_are_each_acked_and_stored() -> None:
    relay = relay_process(*cases.RELAY_FLAGS)
    await relay.start()
    try:
        # produce_load fails unless every answer acked its message and the channel's offset
        # moved by the requests wrk counted.
        record = await produceload.produce_load(relay.port, relay.pid, "wrk", 1)
    finally:
        await relay.terminate()
    assert record["posts"] > 0


async def test_the_edge_load_counts_answers_and_refuses_a_failing_route(
    peer: ServiceProcess,
) -> None:
    """``GET /healthz`` under wrk (the relay's edge alone) counts its requests; against a
    server that answers it with no 200 (the ws relay's 426), the load fails."""
    relay = relay_process(*cases.RELAY_FLAGS)
    await relay.start()
    try:
        record = await produceload.edge_load(relay.port, relay.pid, 1)
    finally:
        await relay.terminate()
    assert record["requests"] > 0 and record["requests_per_second"] > 0
    with pytest.raises(BenchError, match="GET /healthz under wrk"):
        await produceload.edge_load(peer.port, peer.pid, 1)


@pytest.fixture
async def floor() -> AsyncIterator[ServiceProcess]:
    async with _service("bench.producefloor", "produce floor") as service:
        yield service


async def _post(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, body: bytes) -> Any:
    writer.write(
        b"POST /produce HTTP/1.1\r\nHost: f\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200 ")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return json.loads(await reader.readexactly(length))


async def _last(port: int) -> Any:
    return json.loads(await produceload.floor_get(port, "/last"))


async def test_the_produce_floor_assembles_by_the_seed_and_acks_as_the_relay(
    floor: ServiceProcess,
) -> None:
    """The Python floor of ``POST /produce`` does the job it is compared on: the seed's
    assembly (empty deltas count, an unseen id finalizes to ""), an ack with the message's
    offset for each final, nothing for a delta, over one keep-alive connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", floor.port)
    try:
        before = await produceload.floor_count(floor.port)
        empty = {"acks": [], "errors": [], "cancels": []}
        for delta in ("hel", "", "lo"):
            body = json.dumps({"id": "m", "delta": delta}).encode()
            assert await _post(writer, reader, body) == empty
        answer = await _post(writer, reader, json.dumps({"id": "m", "final": True}).encode())
        assert answer["acks"] == [{"type": "ack", "id": "m", "offset": before + 1}]
        assert await _last(floor.port) == {
            "type": "message", "id": "m", "text": "hello", "offset": before + 1
        }  # fmt: skip
        answer = await _post(writer, reader, json.dumps({"id": "u", "final": True}).encode())
        assert answer["acks"] == [{"type": "ack", "id": "u", "offset": before + 2}]
        assert (await _last(floor.port))["text"] == ""
        assert await produceload.floor_count(floor.port) == before + 2
    finally:
        writer.close()


async def test_wrk_posts_to_the_produce_floor_are_each_acked_and_counted(
    floor: ServiceProcess,
) -> None:
    # floor_load fails unless every answer acked its message and the floor completed as
    # many messages as wrk counted requests.
    record = await produceload.floor_load(floor.port, floor.pid, 1)
    assert record["posts"] > 0 and record["cpu_us_per_post"] > 0


@pytest.fixture
async def ws_floor() -> AsyncIterator[ServiceProcess]:
    async with _service("bench.floor", "os.write floor") as service:
        yield service


async def test_the_ws_floor_assembles_by_the_seed_rules_in_any_frames(
    ws_floor: ServiceProcess,
) -> None:
    """The Python floor of the ingest job does the job it is compared on, as the Node ws
    relay does: empty deltas count, a repeated final is acked again and not sent again, an
    unseen id completes as "", events come one per frame or in array frames, and each
    final's ack follows its message."""
    async with (
        connect(f"{ws_floor.url}/subscribe?channel=c") as plain,
        connect(f"{ws_floor.url}/subscribe?channel=c&deltas=1") as live,
        connect(f"{ws_floor.url}/produce?channel=c") as producer,
    ):
        for ws in (plain, live):
            assert await recv(ws) == {
                "type": "subscribed", "channel": "c", "offset": 0, "epoch": "floor"
            }  # fmt: skip
        assert (await recv(producer))["type"] == "session"
        await producer.send(json.dumps({"id": "m", "delta": "hel"}))
        await producer.send(json.dumps([{"id": "e"}, {"id": "m", "delta": ""}]))
        await producer.send(json.dumps({"id": "m", "delta": "lo", "final": True}))
        await producer.send(
            json.dumps(
                [
                    {"id": "m", "delta": "ignored", "final": True},
                    {"id": "m", "delta": "ignored too"},
                    {"id": "e", "final": True},
                    {"id": "u", "final": True},
                ]
            )
        )
        acks = [await recv(producer) for _ in range(4)]
        assert acks == [{"type": "ack", "id": i, "channel": "c"} for i in ("m", "m", "e", "u")]
        messages = [
            {"type": "message", "channel": "c", "id": i, "text": text, "offset": offset}
            | {"epoch": "floor"}
            for i, text, offset in (("m", "hello", 1), ("e", "", 2), ("u", "", 3))
        ]
        assert [await recv(plain) for _ in range(3)] == messages
        deltas = [
            {"type": "delta", "channel": "c", "id": "m", "delta": piece}
            for piece in ("hel", "", "lo")
        ]
        assert [await recv(live) for _ in range(6)] == [*deltas, *messages]


@pytest.mark.parametrize("batch", [None, 100])
async def test_the_ingest_case_drives_the_ws_floor_unchanged(
    ws_floor: ServiceProcess, batch: int | None
) -> None:
    messages = build_messages(300, 10)
    record = await cases.stream(ws_floor, ws_floor, f"ingest-{batch}", messages, batch=batch)
    assert record["events"] == 300 * 11
