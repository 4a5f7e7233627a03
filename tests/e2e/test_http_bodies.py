"""Request bodies under attack, over real sockets: bytes that are not UTF-8, lines over the
limit, bodies over the limit in any framing, bodies cut in mid-request, and bodies trickled in
tiny chunks."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from collections.abc import Sequence
from typing import Any, cast

import pytest
from token_relay import Relay
from token_relay.core.grants import Grant, Role
from token_relay.edge.httpproducer import HttpProducer

from ..conftest import RunningRelay, recv_json, start_relay
from ..harness import eventually

NDJSON = "application/x-ndjson"

HTTP_PARSERS = ("fast", "h11")
"""Every test runs under both request parsers (see ``tests/conftest.py``)."""


def _port(running: RunningRelay) -> int:
    return int(running.url.rsplit(":", 1)[1])


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event).encode() + b"\n"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _head(path: str, content_type: str, length: int | None = None) -> bytes:
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return (
        f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Type: {content_type}\r\n{framing}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()


async def _chunked(
    port: int, path: str, chunks: Sequence[bytes], content_type: str = NDJSON
) -> tuple[int, Any]:
    """POST a chunked body, one write per chunk; the status and the decoded answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_head(path, content_type))
        for piece in chunks:
            writer.write(_chunk(piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        return _parse(await asyncio.wait_for(reader.read(), 10))
    finally:
        writer.close()


def _parse(response: bytes) -> tuple[int, Any]:
    head, _, payload = response.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, json.loads(payload) if payload.startswith(b"{") else payload


def _reset(writer: asyncio.StreamWriter) -> None:
    """Cut the socket: a reset, not a close."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _http_producers(relay: Relay) -> float:
    """The producer requests in progress, as ``/metrics`` exports them."""
    value = relay.metrics.registry.get_sample_value("relay_connections", {"role": "http_producer"})
    assert value is not None
    return value


# ------------------------------------------------------------------ bytes that are not UTF-8


async def test_a_line_that_is_not_utf8_is_one_refused_event_naming_its_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    running, relay = await start_relay()
    port = _port(running)
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        body = [
            _line({"id": "u", "delta": "before "}),
            b'{"id": "u", "delta": "\xff\xfe"}\n',
            _line({"id": "u", "delta": "after", "final": True}),
        ]
        with caplog.at_level(logging.INFO, logger="token_relay"):
            status, answer = await _chunked(port, "/produce?channel=c", body)
        assert status == 200
        assert answer["errors"] == [
            {
                "type": "error",
                "code": "invalid_json",
                "message": "line 2 is not UTF-8",
                "id": None,
                "line": 2,
            }
        ]
        assert [ack["id"] for ack in answer["acks"]] == ["u"]  # the later line still applied
        assert (await recv_json(sub))["text"] == "before after"
        # A JSON body that is not UTF-8: 400, with a clear error.
        status, answer = await _chunked(
            port, "/produce?channel=c", [b'{"id": "j", "delta": "\xc3(", "final": true}'],
            "application/json",
        )  # fmt: skip
        assert (status, [e["code"] for e in answer["errors"]]) == (400, ["invalid_json"])
        assert answer["errors"][0]["message"] == "the body is not UTF-8"
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_lines_trickled_in_tiny_chunks_are_applied_whole() -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        text = "".join("abcdé€"[n % 6] for n in range(200_000))  # characters of 1 to 3 bytes
        body = (
            json.dumps({"id": "t", "delta": text}, ensure_ascii=False).encode()
            + b"\n\n \n"
            + json.dumps({"id": "t", "delta": "!", "final": True}).encode()  # no newline: the end
        )
        chunks = [body[n : n + 32] for n in range(0, len(body), 32)]
        status, answer = await _chunked(_port(running), "/produce?channel=c", chunks)
        assert (status, answer["errors"], [a["id"] for a in answer["acks"]]) == (200, [], ["t"])
        assert (await recv_json(sub))["text"] == text + "!"


class ReadSocket:
    """Whether a producer's socket is being read, as its transport would be told."""

    def __init__(self) -> None:
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return False


async def test_lines_waiting_to_be_applied_are_bounded_in_count_and_bytes() -> None:
    sock = ReadSocket()
    producer = HttpProducer(
        cast(asyncio.Transport, sock),
        path="/produce",
        client="test",
        grant=Grant(Role.PRODUCE, ("*",)),
        ndjson=True,
        named=False,
        max_line=1000,
    )
    producer.feed(b"{}\n" * 63)
    assert sock.reading
    producer.feed(b"{}\n")  # the 64th line waiting: the socket is not read
    assert not sock.reading
    for _ in range(32):
        await anext(producer)
    assert not sock.reading  # 32 still wait
    await anext(producer)  # fewer than half: read again
    assert sock.reading
    for _ in range(31):
        await anext(producer)
    half = b'"' + b"x" * 498 + b'"\n'  # a line of 500 bytes
    producer.feed(half)
    assert sock.reading
    producer.feed(half)  # 1,000 bytes waiting: the socket is not read
    assert not sock.reading
    await anext(producer)
    assert sock.reading


# ------------------------------------------------------------------ a line over the limit


async def test_a_line_over_the_limit_is_refused_whole_and_its_tail_never_applied() -> None:
    running, relay = await start_relay(max_frame_bytes=1000)
    port = _port(running)
    smuggled = _line({"id": "smuggled", "delta": "from the tail", "final": True})
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        body = [
            _line({"id": "a", "delta": "kept "}),
            b'{"id": "a", "delta": "' + b"x" * 1500,  # over the limit already
            b"x" * 1500,
            b'"}' + b" " * 10 + smuggled,  # the over-long line ends with a valid event
            _line({"id": "a", "delta": "too", "final": True}),
        ]
        status, answer = await _chunked(port, "/produce?channel=c", body)
        assert status == 413
        assert answer["errors"] == [
            {
                "type": "error",
                "code": "line_too_long",
                "message": "line 2 is over 1000 bytes; none of it was applied",
                "id": None,
                "line": 2,
            }
        ]
        assert [ack["id"] for ack in answer["acks"]] == ["a"]
        first = await recv_json(sub)
        assert (first["id"], first["text"]) == ("a", "kept too")  # nothing smuggled before it
        # A line over the limit that arrives in one piece is refused the same way.
        one = [_line({"id": "b", "delta": "y" * 2000}) + _line({"id": "b", "final": True})]
        status, answer = await _chunked(port, "/produce?channel=c", one)
        assert (status, [(e["code"], e["line"]) for e in answer["errors"]]) == (
            413,
            [("line_too_long", 1)],
        )
        assert [ack["id"] for ack in answer["acks"]] == ["b"]
        second = await recv_json(sub)
        assert (second["id"], second["text"]) == ("b", "")
        # A line of exactly the limit is not over it.
        exact = json.dumps({"id": "e", "delta": "q" * 961, "final": True}).encode()
        assert len(exact) == 1000
        status, answer = await _chunked(port, "/produce?channel=c", [exact + b"\n"])
        assert (status, answer["errors"], [a["id"] for a in answer["acks"]]) == (200, [], ["e"])


# ------------------------------------------------------------------ bodies over the limit

LIMIT = 4096


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/produce?channel=c", "application/json"),
        ("/produce?channel=c", NDJSON),
        ("/cancel", "application/json"),
        ("/ai-sdk/c/stop", "application/json"),
        ("/webhooks/dead", "application/json"),
    ],
)
async def test_a_chunked_body_over_the_limit_is_refused_as_soon_as_it_passes(
    path: str, content_type: str
) -> None:
    running, relay = await start_relay(max_body_bytes=LIMIT)
    async with relay:
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(running))
        writer.write(_head(path, content_type))
        # Valid NDJSON lines, a JSON string that never ends elsewhere: the body goes on.
        piece = _line({"id": "m", "delta": "z" * 900}) if content_type == NDJSON else b"[" * 1000
        for _ in range(6):
            writer.write(_chunk(piece))
        await writer.drain()
        # No end of the body: the answer comes as soon as the limit is passed.
        response = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        status, answer = _parse(response)
        assert status == 413 and b"\r\nConnection: close\r\n" in response
        reason = f"request body over {LIMIT} bytes"
        if path.startswith("/produce"):
            errors = [(e["code"], e["message"]) for e in answer["errors"]]
            assert errors == [("body_too_large", reason + "; the rest of it was not read")]
        else:
            assert answer.decode().strip() == reason
        assert _http_producers(relay) == 0
        assert relay.metrics.refusals.labels("413")._value.get() == 1


async def test_an_ndjson_body_over_the_limit_keeps_what_it_applied_before() -> None:
    running, relay = await start_relay(max_body_bytes=LIMIT)
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        done = _line({"id": "done", "delta": "whole", "final": True})
        flood = [_line({"id": "open", "delta": "w" * 1000}) for _ in range(5)]
        status, answer = await _chunked(_port(running), "/produce?channel=c", [done, *flood])
        assert status == 413 and [ack["id"] for ack in answer["acks"]] == ["done"]
        assert (await recv_json(sub))["text"] == "whole"
        aborted = await recv_json(sub)  # what it left unfinished aborts, as at a body's end
        assert (aborted["type"], aborted["id"], aborted["reason"]) == (
            "aborted",
            "open",
            "producer_disconnected",
        )


# ------------------------------------------------------------------ bodies cut in mid-request


async def test_a_body_reset_in_mid_request_aborts_at_once_and_frees_everything() -> None:
    running, relay = await start_relay(idle_timeout=60)
    port = _port(running)
    async with relay, running.connect("/subscribe?channel=c&deltas=1") as sub:
        await recv_json(sub)
        assert relay.server is not None
        tasks_before = set(relay.server._tasks)
        for n in range(200):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_head("/produce?channel=c", NDJSON))
            writer.write(_chunk(_line({"id": f"r{n}", "delta": "half"})))
            assert (await recv_json(sub))["delta"] == "half"  # applied: the body is under way
            _reset(writer)
            aborted = await recv_json(sub)  # at once: long before --idle-timeout
            assert (aborted["type"], aborted["id"], aborted["reason"], aborted["text"]) == (
                "aborted",
                f"r{n}",
                "producer_disconnected",
                "half",
            )
        await eventually(lambda: _http_producers(relay) == 0, what="every producer ended")
        assert set(relay.server._tasks) <= tasks_before
        assert not relay.sessions.by_owner and not relay.sessions.parked


async def test_a_stalled_body_s_producer_ends_with_its_cut_socket() -> None:
    running, relay = await start_relay(idle_timeout=0.5)
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(running))
        writer.write(_head("/produce?channel=c", NDJSON) + _chunk(_line({"id": "s", "delta": "x"})))
        assert await asyncio.wait_for(reader.read(), 5) == b""  # cut, with no answer
        writer.close()
        assert (await recv_json(sub))["type"] == "aborted"
        await eventually(lambda: _http_producers(relay) == 0, what="the producer ended")
        assert not relay.sessions.by_owner


async def test_a_named_producer_s_body_reset_leaves_its_session_for_the_next_request() -> None:
    running, relay = await start_relay(idle_timeout=60)
    port = _port(running)
    path = "/produce?channel=c&producer=gw"
    async with relay, running.connect("/subscribe?channel=c&deltas=1") as sub:
        await recv_json(sub)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head(path, NDJSON) + _chunk(_line({"id": "n", "delta": "one ", "seq": 1})))
        assert (await recv_json(sub))["delta"] == "one "
        assert _http_producers(relay) == 1  # the request is in progress
        _reset(writer)
        await eventually(lambda: _http_producers(relay) == 0, what="the request ended")
        assert len(relay.sessions.parked) == 1
        rest = [_line({"id": "n", "delta": "two", "seq": 2}), _line({"id": "n", "final": True})]
        status, answer = await _chunked(port, path, rest)
        assert (status, answer["errors"], [a["id"] for a in answer["acks"]]) == (200, [], ["n"])
        assert (await recv_json(sub))["delta"] == "two"
        assert (await recv_json(sub))["text"] == "one two"


async def test_a_body_whose_framing_breaks_ends_its_producer_at_once() -> None:
    running, relay = await start_relay(idle_timeout=60)
    async with relay, running.connect("/subscribe?channel=c&deltas=1") as sub:
        await recv_json(sub)
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(running))
        writer.write(_head("/produce?channel=c", NDJSON) + _chunk(_line({"id": "f", "delta": "x"})))
        assert (await recv_json(sub))["delta"] == "x"
        writer.write(b"not a chunk size\r\n")
        status, _ = _parse(await asyncio.wait_for(reader.read(), 5))
        writer.close()
        aborted = await recv_json(sub)
        assert (status, aborted["type"], aborted["reason"]) == (
            400,
            "aborted",
            "producer_disconnected",
        )
        await eventually(lambda: _http_producers(relay) == 0, what="the producer ended")
