"""The answer to a producer request is bounded, as its body is, over real sockets.

``POST /produce`` answers with every frame its body earned, and the AI SDK's producer route
with every error. A short line can earn a long frame (a refused ``x`` line an error of 130
bytes, a 24-byte final an ack naming a channel of 256 characters), so without a bound a 1 MiB
body earned a 70 MB answer. Past :data:`~token_relay.edge.httpproducer.MAX_ANSWER_ERRORS`
errors or :data:`~token_relay.edge.httpproducer.MAX_ANSWER_BYTES` of frames, nothing more of
the body is applied: the answer keeps every ack earned, ends with one ``body_too_large``
saying from where nothing was applied, and comes as for a body over ``--max-body-bytes``
(413, ``Connection: close``). The relay serves everyone else as before.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from token_relay.edge.httpproducer import MAX_ANSWER_BYTES, MAX_ANSWER_ERRORS

from ..conftest import RunningRelay, recv_json, send_json, start_relay, subscribed_pair

HTTP_PARSERS = ("fast", "h11")
"""Every test runs under both request parsers (see ``tests/conftest.py``)."""

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
MIB = 1024 * 1024


def _port(running: RunningRelay) -> int:
    return int(running.url.rsplit(":", 1)[1])


def _lines(*events: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(event).encode() + b"\n" for event in events)


class Answer:
    """A response: its head (lowercased), its status and its body, raw and decoded."""

    def __init__(self, head: bytes, payload: bytes) -> None:
        self.head = head.decode("latin-1").lower()
        self.status = int(head.split()[1])
        self.payload = payload
        self.body: Any = json.loads(payload)

    @property
    def errors(self) -> list[dict[str, Any]]:
        errors: list[dict[str, Any]] = self.body["errors"]
        return errors


async def _post(
    running: RunningRelay, path: str, body: bytes, content_type: str = NDJSON, *, chunked: bool
) -> Answer:
    """POST ``body`` (declared, or chunked in pieces of 64 KiB) and read the answer; one
    that closes the connection must be followed by its clean end."""
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(running))
    try:
        framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Type: {content_type}\r\n{framing}\r\n"
            "\r\n".encode()
        )
        if chunked:
            for start in range(0, len(body), 65536):
                piece = body[start : start + 65536]
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(body)
        # The answer may come before the whole body is sent: the relay reads and drops the
        # rest meanwhile.
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        lines = head.decode("latin-1").lower().split("\r\n")
        length = next(
            int(line.split(":")[1]) for line in lines if line.startswith("content-length:")
        )
        answer = Answer(head, await asyncio.wait_for(reader.readexactly(length), 30))
        if "connection: close" in lines:
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed cleanly
        return answer
    finally:
        writer.close()


def _cut(answer: Answer) -> dict[str, Any]:
    """The answer of a body cut at its bound: 413, the connection closed, its last error the
    ``body_too_large`` saying so."""
    assert answer.status == 413
    assert "\r\nconnection: close\r\n" in answer.head + "\r\n"
    last = answer.errors[-1]
    assert last["code"] == "body_too_large"
    assert "the answer to this request reached" in last["message"]
    assert [e for e in answer.errors[:-1] if e["code"] == "body_too_large"] == []
    return last


# ------------------------------------------------------------------ a body of refused lines


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
@pytest.mark.parametrize(
    ("path", "content_type", "junk", "code", "numbered"),
    [
        # Refused once applied: not JSON.
        ("/produce?channel=c", NDJSON, b"x\n", "invalid_json", False),
        # Refused as it is read: not UTF-8, naming its line.
        ("/produce?channel=c", NDJSON, b"\xff\n", "invalid_json", True),
        # The AI SDK's route: no server-sent event field, naming its line.
        ("/ai-sdk/c/produce", SSE, b"x\n", "invalid_sse", True),
    ],
    ids=["not-json", "not-utf8", "ai-sdk"],
)
async def test_a_mebibyte_of_refused_lines_gets_a_bounded_answer_saying_where_it_stopped(
    path: str, content_type: str, junk: bytes, code: str, numbered: bool, chunked: bool
) -> None:
    running, relay = await start_relay()  # --max-body-bytes 1 MiB
    async with relay:
        answer = await _post(
            running, path, junk * (MIB // len(junk)), content_type, chunked=chunked
        )
        last = _cut(answer)
        # At most MAX_ANSWER_ERRORS errors, then the one saying so; no more.
        assert len(answer.errors) == MAX_ANSWER_ERRORS + 1
        listed = answer.errors[:-1]
        assert {e["code"] for e in listed} == {code}
        if numbered:
            assert [e["line"] for e in listed] == list(range(1, MAX_ANSWER_ERRORS + 1))
        if path.startswith("/produce"):
            assert (last["index"], answer.body["acks"]) == (MAX_ANSWER_ERRORS, [])
        else:
            assert last["line"] == MAX_ANSWER_ERRORS + 1
            assert answer.body["outcome"] == "none"
        # 70 MB before the bound; each error is short, so far under MAX_ANSWER_BYTES.
        assert len(answer.payload) < 256 * 1024 < MAX_ANSWER_BYTES


# ------------------------------------------------------------------ valid lines, then junk


async def test_the_lines_before_the_cut_are_acked_and_delivered_exactly_and_none_after() -> None:
    running, relay = await start_relay()
    async with relay, subscribed_pair(running) as (sub, other):
        # Another producer's reply streams all along.
        await send_json(other, {"id": "other", "delta": "before "})
        whole = [{"id": f"m{n}", "delta": f"text {n} é", "final": True} for n in range(50)]
        body = (
            _lines(*whole, {"id": "open", "delta": "partial"})
            + b"x\n" * (2 * MAX_ANSWER_ERRORS)
            + _lines({"id": "late", "delta": "never", "final": True})
        )
        answer = await _post(running, "/produce?channel=c", body, chunked=True)
        last = _cut(answer)
        # Every message that came whole is acked, in order, and only they.
        assert [a["id"] for a in answer.body["acks"]] == [event["id"] for event in whole]
        assert len(answer.errors) == MAX_ANSWER_ERRORS + 1
        assert {e["code"] for e in answer.errors[:-1]} == {"invalid_json"}
        assert last["index"] == len(whole) + 1 + MAX_ANSWER_ERRORS  # the first not applied
        assert len(answer.payload) < 256 * 1024
        # Each acked message reached the subscriber, exactly; what the body left unfinished
        # ended as at the end of a body.
        for event in whole:
            frame = await recv_json(sub)
            assert (frame["type"], frame["id"], frame["text"]) == (
                "message",
                event["id"],
                event["delta"],
            )
        aborted = await recv_json(sub)
        assert (aborted["type"], aborted["id"], aborted["text"], aborted["reason"]) == (
            "aborted",
            "open",
            "partial",
            "producer_disconnected",
        )
        # The relay serves on: the other reply ends whole, a new request is answered 200,
        # and nothing after the cut ("late") ever reached the subscriber.
        await send_json(other, {"id": "other", "delta": "after", "final": True})
        assert (await recv_json(other))["type"] == "ack"
        frame = await recv_json(sub)
        assert (frame["id"], frame["text"]) == ("other", "before after")
        canary = _lines({"id": "canary", "delta": "served", "final": True})
        answer = await _post(running, "/produce?channel=c", canary, chunked=False)
        assert (answer.status, answer.errors, [a["id"] for a in answer.body["acks"]]) == (
            200,
            [],
            ["canary"],
        )
        assert "connection: close" not in answer.head  # kept alive, as any success is
        frame = await recv_json(sub)
        assert (frame["id"], frame["text"]) == ("canary", "served")


async def test_acks_past_the_byte_bound_end_the_body_and_each_acked_message_lands_once() -> None:
    running, relay = await start_relay()
    channel = "k" * 256  # the longest name: each 44-byte line earns an ack of 297 bytes
    async with relay, running.connect(f"/subscribe?channel={channel}") as sub:
        await recv_json(sub)
        sent = 20_000  # 860 KB of body, some 5.9 MB of acks
        body = _lines(*({"id": f"m{n:05}", "delta": "x", "final": True} for n in range(sent)))
        assert len(body) < MIB
        answer = await _post(running, f"/produce?channel={channel}", body, chunked=False)
        last = _cut(answer)
        acked = [a["id"] for a in answer.body["acks"]]
        assert 0 < len(acked) < sent
        assert acked == [f"m{n:05}" for n in range(len(acked))]
        assert answer.errors == [last] and last["index"] == len(acked)
        assert MAX_ANSWER_BYTES <= len(answer.payload) <= MAX_ANSWER_BYTES + 1024
        # Exactly the acked messages were delivered, each once, in order; none after.
        for message_id in acked:
            frame = await recv_json(sub)
            assert (frame["type"], frame["id"]) == ("message", message_id)
        canary = _lines({"id": "canary", "delta": "next", "final": True})
        answer = await _post(running, f"/produce?channel={channel}", canary, chunked=False)
        assert answer.status == 200
        assert (await recv_json(sub))["id"] == "canary"


async def test_a_named_producer_continues_from_the_line_the_cut_names() -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        path = "/produce?channel=c&producer=gateway"
        applied = _lines(
            {"id": "r", "delta": "Hel", "seq": 1}, {"id": "r", "delta": "lo ", "seq": 2}
        )
        dropped = _lines({"id": "r", "delta": "never ", "seq": 3})
        body = applied + b"x\n" * (MAX_ANSWER_ERRORS + 100) + dropped
        answer = await _post(running, path, body, chunked=True)
        last = _cut(answer)
        assert (answer.body["acks"], last["index"]) == ([], 2 + MAX_ANSWER_ERRORS)
        # The session waits for the next request, which sends again from what the cut names.
        rest = _lines({"id": "r", "delta": "world", "seq": 3, "final": True})
        answer = await _post(running, path, rest, chunked=False)
        assert (answer.status, answer.errors, [a["id"] for a in answer.body["acks"]]) == (
            200,
            [],
            ["r"],
        )
        frame = await recv_json(sub)
        assert (frame["type"], frame["id"], frame["text"]) == ("message", "r", "Hello world")


async def test_an_ai_sdk_reply_cut_at_the_bound_aborts_with_what_came_before() -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)

        def sse(*chunks: dict[str, Any]) -> bytes:
            return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)

        before = sse(
            {"type": "start", "messageId": "m"},
            {"type": "text-start", "id": "t"},
            {"type": "text-delta", "id": "t", "delta": "Hello"},
        )  # lines 1 to 6
        after = sse(
            {"type": "text-delta", "id": "t", "delta": " never"},
            {"type": "text-end", "id": "t"},
            {"type": "finish"},
        )
        body = before + b"x\n" * (2 * MAX_ANSWER_ERRORS) + after
        answer = await _post(running, "/ai-sdk/c/produce", body, SSE, chunked=True)
        last = _cut(answer)
        assert [e["line"] for e in answer.errors[:-1]] == list(range(7, 7 + MAX_ANSWER_ERRORS))
        assert last["line"] == 7 + MAX_ANSWER_ERRORS
        assert (answer.body["id"], answer.body["outcome"], answer.body["reason"]) == (
            "m",
            "aborted",
            "producer_disconnected",
        )
        assert len(answer.payload) < 256 * 1024
        frame = await recv_json(sub)
        assert (frame["type"], frame["id"], frame["text"], frame["reason"]) == (
            "aborted",
            "m",
            "Hello",
            "producer_disconnected",
        )
