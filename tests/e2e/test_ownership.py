"""One owner per id, over real sockets: two producers racing for one id on one channel get
exactly one message delivered, and the loser gets ``id_in_use`` for its delta and its final,
whichever final comes first; an HTTP producer and a WebSocket one, both ways round. The same
when the second producer starts only once the first one's message ended: within
``--id-hold`` the id is still the first one's."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from ..conftest import (
    RunningRelay,
    assert_silent,
    recv_json,
    send_json,
    subscribed_pair,
)
from ..harness import relay_process

ROUNDS = 50


async def _first_reply(producers: tuple[ClientConnection, ClientConnection]) -> int:
    """Which producer is answered first (the other's pending read is cancelled: safe)."""
    reads = [asyncio.ensure_future(recv_json(ws)) for ws in producers]
    done, pending = await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
    for read in pending:
        read.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    (answered,) = done
    frame = answered.result()
    assert (frame["type"], frame["code"]) == ("error", "id_in_use"), frame
    return reads.index(answered)


async def race(
    producers: tuple[ClientConnection, ClientConnection], watcher: ClientConnection, rounds: int
) -> None:
    """Both producers send a delta, then a final, for one id per round; the watcher gets
    exactly one message per id, the winner's, and nothing of the loser's."""
    winners: dict[str, str] = {}
    for n in range(rounds):
        message_id = f"r{n}"
        letters = ("a", "b")
        sends = zip(producers, letters, strict=True)
        await asyncio.gather(*(send_json(ws, {"id": message_id, "delta": x}) for ws, x in sends))
        loser = await _first_reply(producers)
        winner = 1 - loser
        winners[message_id] = letters[winner] + "!"
        final = {"id": message_id, "delta": "!", "final": True}
        if n % 2:  # the winner's final is published before the loser's comes
            await send_json(producers[winner], final)
            assert (await recv_json(producers[winner]))["type"] == "ack"
            await send_json(producers[loser], final)
        else:  # both at once
            await asyncio.gather(*(send_json(ws, final) for ws in producers))
            assert (await recv_json(producers[winner]))["type"] == "ack"
        refused = await recv_json(producers[loser])
        assert (refused["code"], refused["id"]) == ("id_in_use", message_id)
    messages, deltas = await _delivered(producers[0], watcher)
    assert messages == {message_id: [text] for message_id, text in winners.items()}
    assert deltas == {**winners, "end": "end"}


async def _delivered(
    producer: ClientConnection, watcher: ClientConnection
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Once ``producer`` completed a last message, ``end``: every message the watcher got
    before it (its texts, by id) and the deltas of each id, joined."""
    await send_json(producer, {"id": "end", "delta": "end", "final": True})
    assert (await recv_json(producer))["type"] == "ack"
    messages: dict[str, list[str]] = {}
    deltas: dict[str, str] = {}
    while True:
        frame = await recv_json(watcher)
        assert frame["type"] in ("delta", "message"), frame
        if frame["type"] == "delta":
            deltas[frame["id"]] = deltas.get(frame["id"], "") + frame["delta"]
        elif frame["id"] == "end":
            return messages, deltas
        else:
            messages.setdefault(frame["id"], []).append(frame["text"])


async def one_after_the_other(
    producers: tuple[ClientConnection, ClientConnection], watcher: ClientConnection, rounds: int
) -> None:
    """Per round, one producer sends a delta, then a final, for one id, and once its final
    is acked the other sends a delta, then a final, for that id (who goes first alternates):
    the watcher gets exactly one message per id, the first producer's, and the second gets
    ``id_in_use`` for both its events."""
    firsts: dict[str, str] = {}
    for n in range(rounds):
        message_id = f"s{n}"
        first, second = producers if n % 2 == 0 else producers[::-1]
        letter = "a" if first is producers[0] else "b"
        await send_json(first, {"id": message_id, "delta": letter})
        await send_json(first, {"id": message_id, "delta": "!", "final": True})
        assert (await recv_json(first))["type"] == "ack"
        firsts[message_id] = letter + "!"
        await send_json(second, {"id": message_id, "delta": "late"})
        await send_json(second, {"id": message_id, "delta": "?", "final": True})
        for _ in range(2):
            refused = await recv_json(second)
            assert (refused["type"], refused["code"], refused["id"]) == (
                "error",
                "id_in_use",
                message_id,
            )
    messages, deltas = await _delivered(producers[0], watcher)
    assert messages == {message_id: [text] for message_id, text in firsts.items()}
    assert deltas == {**firsts, "end": "end"}
    for ws in producers:
        await assert_silent(ws)


@pytest.mark.parametrize("play", [race, one_after_the_other], ids=["racing", "one_after_the_other"])
async def test_two_websocket_producers_under_one_id_deliver_one_message(
    relay: RunningRelay, play: Callable[..., Awaitable[None]]
) -> None:
    async with (
        subscribed_pair(relay, deltas=True) as (watcher, a),
        relay.connect("/produce?channel=c") as b,
    ):
        await play((a, b), watcher, ROUNDS)


async def _open_ndjson(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /produce?channel=c HTTP/1.1\r\nHost: r\r\nContent-Type: application/x-ndjson"
        b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    return reader, writer


async def _line(writer: asyncio.StreamWriter, event: dict[str, Any], last: bool = False) -> None:
    line = json.dumps(event).encode() + b"\n"
    writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n" + (b"0\r\n\r\n" if last else b""))
    await writer.drain()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, Any]:
    response = await asyncio.wait_for(reader.read(), 5)
    return int(response.split()[1]), json.loads(response.partition(b"\r\n\r\n")[2])


async def test_an_http_producer_and_a_websocket_one_race_for_one_id(relay: RunningRelay) -> None:
    port = int(relay.url.rsplit(":", 1)[1])
    async with subscribed_pair(relay, deltas=True) as (watcher, ws):
        # The WebSocket producer holds "w"; the HTTP one's delta and final are refused,
        # its final coming once the holder's message is delivered.
        await send_json(ws, {"id": "w", "delta": "ws "})
        assert (await recv_json(watcher))["delta"] == "ws "
        reader, writer = await _open_ndjson(port)
        await _line(writer, {"id": "w", "delta": "http"})
        await _line(writer, {"id": "w", "delta": "also"})
        await _line(writer, {"id": "sync", "delta": "s"})  # seen: the lines before it applied
        assert (await recv_json(watcher))["delta"] == "s"
        await send_json(ws, {"id": "w", "delta": "wins", "final": True})
        assert (await recv_json(ws))["type"] == "ack"
        assert (await recv_json(watcher))["delta"] == "wins"
        assert (await recv_json(watcher))["text"] == "ws wins"
        # A one-shot message under an id another producer holds is refused too.
        await send_json(ws, {"id": "h", "delta": "held"})
        assert (await recv_json(watcher))["delta"] == "held"
        await _line(writer, {"id": "h", "delta": "shot", "final": True})
        await _line(writer, {"id": "w", "final": True})
        await _line(writer, {"id": "sync", "final": True}, last=True)
        status, answer = await _answer(reader)
        writer.close()
        assert (status, [a["id"] for a in answer["acks"]]) == (200, ["sync"])
        assert [(e["code"], e["id"]) for e in answer["errors"]] == [
            ("id_in_use", "w"),
            ("id_in_use", "w"),
            ("id_in_use", "h"),
            ("id_in_use", "w"),
        ]
        assert (await recv_json(watcher))["text"] == "s"
        await send_json(ws, {"id": "h", "final": True})
        assert (await recv_json(ws))["type"] == "ack"
        assert (await recv_json(watcher))["text"] == "held"
        # The other way round: the HTTP producer holds "x", the WebSocket one is refused.
        reader, writer = await _open_ndjson(port)
        await _line(writer, {"id": "x", "delta": "http "})
        assert (await recv_json(watcher))["delta"] == "http "
        await send_json(ws, {"id": "x", "delta": "ws"})
        assert ((await recv_json(ws))["code"]) == "id_in_use"
        await _line(writer, {"id": "x", "delta": "wins", "final": True}, last=True)
        status, answer = await _answer(reader)
        writer.close()
        assert (status, [a["id"] for a in answer["acks"]], answer["errors"]) == (200, ["x"], [])
        assert (await recv_json(watcher))["delta"] == "wins"
        assert (await recv_json(watcher))["text"] == "http wins"
        await send_json(ws, {"id": "x", "delta": "late", "final": True})
        assert ((await recv_json(ws))["code"]) == "id_in_use"
        await send_json(ws, {"id": "end", "final": True})
        assert (await recv_json(ws))["type"] == "ack"
        end = await recv_json(watcher)
        assert (end["type"], end["id"], end["text"]) == ("message", "end", "")


@pytest.mark.parametrize("broker", ["memory", "redis"])
async def test_the_same_message_from_another_producer_is_refused_unless_sent_whole(
    broker: str, request: pytest.FixtureRequest
) -> None:
    """Within the hold, another producer sending the very message the first one published,
    as its deltas and final (in frames of their own, then in one array frame), is refused
    ``id_in_use`` and nothing of it is delivered; the same message as one whole event is
    acked as it was published. With Redis, on two relay processes (the first producer on
    one, the others on the other), where deltas and a final handed over together once went
    to Redis as one script and were taken for a whole message sent again."""
    events = [{"id": "m", "delta": "hel"}, {"id": "m", "delta": "lo"}, {"id": "m", "final": True}]
    flags: tuple[str, ...] = ()
    if broker == "redis":
        flags = ("--broker", request.getfixturevalue("redis_server").url)
    first = relay_process(*flags)
    second = first if broker == "memory" else relay_process(*flags)
    relays = list({id(first): first, id(second): second}.values())
    await asyncio.gather(*(relay.start() for relay in relays))
    try:
        async with (
            connect(f"{second.url}/subscribe?channel=c&deltas=1") as watcher,
            connect(f"{first.url}/produce?channel=c") as owner,
        ):
            await recv_json(watcher)
            await recv_json(owner)
            for event in events:
                await send_json(owner, event)
            assert (await recv_json(owner))["type"] == "ack"
            for array in (False, True):
                async with connect(f"{second.url}/produce?channel=c") as again:
                    await recv_json(again)
                    if array:
                        await send_json(again, events)
                    else:
                        for event in events:
                            await send_json(again, event)
                    replies = [await recv_json(again)]
                    with contextlib.suppress(TimeoutError):
                        while True:
                            replies.append(await recv_json(again, 0.5))
                    # Refused, and never acked (on Redis the delta's refusal may come a
                    # round trip late, so not one per event).
                    assert {(r["type"], r["code"], r["id"]) for r in replies} == {
                        ("error", "id_in_use", "m")
                    }, replies
            async with connect(f"{second.url}/produce?channel=c") as whole:
                await recv_json(whole)
                await send_json(whole, {"id": "m", "delta": "hello", "final": True})
                ack = await recv_json(whole)
                assert (ack["type"], ack["id"]) == ("ack", "m")
                await send_json(whole, {"id": "end", "delta": "end", "final": True})
                assert (await recv_json(whole))["type"] == "ack"
            seen: list[tuple[str, str, str]] = []
            while not seen or seen[-1][:2] != ("message", "end"):
                frame = await recv_json(watcher)
                seen.append((frame["type"], frame["id"], frame.get("delta", frame.get("text"))))
            # The first producer's deltas (Redis may join them into one) and message, once.
            deltas = "".join(text for kind, key, text in seen if kind == "delta" and key == "m")
            messages = [(key, text) for kind, key, text in seen if kind == "message"]
            assert deltas == "hello"
            assert messages == [("m", "hello"), ("end", "end")]
    finally:
        await asyncio.gather(*(relay.stop() for relay in relays))
