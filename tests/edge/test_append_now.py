"""A Durable Streams append answered at once (no task) is answered exactly as from a task.

Generated sequences of requests to ``/v1/stream/`` (appends of every kind: plain ones,
idempotent producers' with retries, stale epochs and gaps, ``Stream-Seq`` regressions and
one past its bound, closes, a wrong content type, empty bodies, appends to a stream that
does not exist or to a channel's stream, with the other requests a writer sends between
them: creates, reads, deletes) are played through an
:class:`~token_relay.edge.connection.HttpConnection` of a real relay over an in-memory
transport, with a live SSE reader on the stream: once with appends answered at once, once
with every request answered from a task. The bytes written back to every request, what
the reader was sent, the stream's content and the relay's counters must be the same; and
the appends must have been answered at once in the first run, and never in the second.

``APPEND_NOW_EXAMPLES=N`` plays N sequences instead of the default.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from token_relay import Relay, Settings

from tests.conftest import NO_SWEEPS
from tests.edge.played import answers, connection, settle
from tests.edge.test_oneshot import _counters

EXAMPLES = int(os.environ.get("APPEND_NOW_EXAMPLES", "150"))
STREAM = "/v1/stream/s"
CONTROL = "/v1/stream/__ds/subscriptions"
"""The subscriptions' control API: a POST there is never an append."""
MAX_STREAM_BYTES = 200


def _request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: relay", *(f"{k}: {v}" for k, v in headers.items())]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """One request: mostly an append, of every kind."""
    kind = draw(
        st.sampled_from(
            ["plain"] * 4 + ["producer"] * 3 + ["seq"] * 2 + ["odd", "other", "elsewhere"]
        )
    )
    body = draw(st.sampled_from([b"ab", b"c", b"hello ", b"x" * 40, b"y" * 90]))
    headers = {"Content-Type": "text/plain"}
    if draw(st.integers(0, 12)) == 0:
        headers["Stream-Closed"] = draw(st.sampled_from(["true", "false", "maybe"]))
    path = STREAM
    if kind == "producer":
        headers["Producer-Id"] = draw(st.sampled_from(["w", "v"]))
        headers["Producer-Epoch"] = str(draw(st.integers(0, 2)))
        headers["Producer-Seq"] = str(draw(st.integers(0, 4)))
        if draw(st.integers(0, 6)) == 0:
            del headers[draw(st.sampled_from(["Producer-Epoch", "Producer-Seq"]))]
    elif kind == "seq":
        headers["Stream-Seq"] = draw(st.sampled_from(["a", "b", "c", "d", "z" * 300]))
    elif kind == "odd":
        odd = draw(st.sampled_from(["type", "empty", "no type"]))
        if odd == "type":
            headers["Content-Type"] = "application/json"
        elif odd == "empty":
            body = b""
        else:
            del headers["Content-Type"]
    elif kind == "other":
        path = draw(st.sampled_from(["/v1/stream/missing", CONTROL, "/v1/stream/__ds/x"]))
    else:  # what a writer sends between its appends
        return draw(
            st.sampled_from(
                [
                    _request("PUT", STREAM, {"Content-Type": "text/plain"}),
                    _request("PUT", "/v1/stream/t", {"Content-Type": "text/plain"}, b"seed"),
                    _request("GET", STREAM + "?offset=-1", {}),
                    _request("HEAD", STREAM, {}),
                    _request("DELETE", STREAM, {}),
                    _request("POST", "/v1/stream/t", {"Content-Type": "text/plain"}, b"t"),
                ]
            )
        )
    return _request("POST", path, headers, body)


DATE = re.compile(
    rb"(?m)^(Date|Stream-Cursor|ETag): [^\r]*\r\n"
    rb'|"streamCursor":"\d+"|\d{4}-\d\d-\d\dT[\d:.]+Z|"kid": "ds_[^"]*"'
)
"""What depends on the clock (a live read's cursor is the clock's interval: two runs may
straddle its change), a stream's epoch or a signing key rather than on the requests."""


async def _play(at_once: bool, sequence: list[bytes], together: bool) -> dict[str, Any]:
    relay = Relay(Settings(port=0, max_durable_stream_bytes=MAX_STREAM_BYTES, **NO_SWEEPS))
    server = await relay.start()
    answered_at_once = 0
    read_now = server.read_now
    assert read_now is not None

    def counted(reading: Any, body: bytes) -> Any:
        nonlocal answered_at_once
        reply = read_now(reading, body)
        answered_at_once += reply is not None
        return reply

    server.read_now = counted if at_once else None
    try:
        create, created = connection(relay)
        create.data_received(_request("PUT", STREAM, {"Content-Type": "text/plain"}))
        await settle()
        assert created.written.startswith(b"HTTP/1.1 201")
        reader, seen = connection(relay)
        reader.data_received(_request("GET", STREAM + "?offset=-1&live=sse", {}))
        await settle()
        opened = [create, reader]
        written = await answers(relay, sequence, together, opened)
        content, read = connection(relay)
        content.data_received(_request("GET", STREAM + "?offset=-1", {}))
        await settle()
        opened.append(content)
        for one in opened:
            one.connection_lost(None)
        await settle()
        return {
            "answers": [DATE.sub(b"", answer) for answer in written],
            "reader": DATE.sub(b"", bytes(seen.written)),
            "content": DATE.sub(b"", bytes(read.written)),
            "counters": _counters(relay),
            "appended at once": answered_at_once > 0,
        }
    finally:
        await relay.stop()


def _compare(sequence: list[bytes], together: bool) -> bool:
    """Play ``sequence`` both ways, require the same outcome; whether any request was
    answered at once."""
    at_once = asyncio.run(_play(True, sequence, together))
    from_tasks = asyncio.run(_play(False, sequence, together))
    assert from_tasks.pop("appended at once") is False
    answered = at_once.pop("appended at once")
    assert at_once == from_tasks
    return bool(answered)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(requests(), min_size=1, max_size=12), st.booleans())
def test_appends_answered_at_once_are_answered_as_from_a_task(
    sequence: list[bytes], together: bool
) -> None:
    _compare(sequence, together)


def test_appends_of_every_kind_are_answered_at_once() -> None:
    plain = {"Content-Type": "text/plain"}
    producer = {**plain, "Producer-Id": "w", "Producer-Epoch": "0", "Producer-Seq": "0"}
    for request in [
        _request("POST", STREAM, plain, b"ok"),
        _request("POST", STREAM, producer, b"once"),
        _request("POST", STREAM, {**plain, "Stream-Seq": "a"}, b"seq"),
        _request("POST", STREAM, {**plain, "Stream-Closed": "true"}, b""),
        _request("POST", STREAM, {"Content-Type": "application/json"}, b"[1]"),  # 409
        _request("POST", STREAM, plain, b"z" * (MAX_STREAM_BYTES + 1)),  # 413
        _request("POST", "/v1/stream/missing", plain, b"ok"),  # 404
    ]:
        assert _compare([request], together=False)


def test_what_is_not_an_append_to_this_process_is_answered_from_a_task() -> None:
    plain = {"Content-Type": "text/plain"}
    for request in [
        _request("POST", STREAM, {**plain, "Stream-Seq": "z" * 300}, b"long seq"),
        _request("POST", CONTROL, {"Content-Type": "application/json"}, b"{}"),
        _request("PUT", "/v1/stream/t", plain, b"seed"),
    ]:
        assert not _compare([request], together=False)
    # A subscription that an append concerns is told of it, from the task. (What the
    # subscription's own answers say depends on when its webhook is tried: not compared.)
    hook = {"type": "webhook", "pattern": "jobs/*", "webhook": {"url": "http://127.0.0.1:9/"}}
    body = json.dumps(hook).encode()
    sequence = [
        _request("PUT", CONTROL + "/jobs", {"Content-Type": "application/json"}, body),
        _request("PUT", "/v1/stream/jobs/1", plain),
        _request("POST", "/v1/stream/jobs/1", plain, b"work"),
    ]
    at_once = asyncio.run(_play(True, sequence, together=False))
    from_tasks = asyncio.run(_play(False, sequence, together=False))
    assert at_once["appended at once"] is from_tasks["appended at once"] is False
    assert at_once["answers"][0].startswith(b"HTTP/1.1 201")
    assert at_once["answers"][1:] == from_tasks["answers"][1:]
