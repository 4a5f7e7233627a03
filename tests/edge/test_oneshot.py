"""A one-shot ``POST /produce`` answered at once is answered exactly as the general path.

Generated sequences of producer requests (one-shot messages and everything near them:
non-finals, aborts, batches, NDJSON, named producers, a ``channel``, ``seq``, ``meta`` or
``chunk`` in the event, ids reused and held by another producer's message in progress,
non-ASCII and oversized deltas, bodies that are not JSON or not UTF-8) are played through
an :class:`~token_relay.edge.connection.HttpConnection` of a real relay over an in-memory
transport, with a deltas subscriber on the channel: once with one-shot messages answered
at once, once with every request on the general path. The bytes written back to every
request, every frame the subscriber was sent, the channel's history and the relay's
counters must be the same.

``ONESHOT_EXAMPLES=N`` plays N sequences instead of the default.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from token_relay import Relay, Settings

from tests.conftest import NO_SWEEPS
from tests.edge.played import answers, settle
from tests.edge.played import connection as _connection

EXAMPLES = int(os.environ.get("ONESHOT_EXAMPLES", "200"))
MAX_CHARS = 40

# ---------------------------------------------------------------------- requests

IDS = ["a", "b", "c", "", "x" * 300, "a b"]
DELTAS = ["", "hi", "a" * MAX_CHARS, "a" * (MAX_CHARS + 1), "caf\u00e9", "\U0001f600", "\ud83d"]


ODD_FIELDS: list[tuple[str, Any]] = [
    ("channel", "c"),
    ("channel", "other"),
    ("seq", 1),
    ("seq", 2),
    ("meta", {"k": 1}),
    ("chunk", {"type": "text-delta", "id": "t", "delta": "z"}),
    ("abort", "cancelled"),
    ("unknown", 1),
    ("delta", 5),
]
"""Fields that take an event off the short ways: each changes how it is applied or refused."""


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    """One producer event: mostly a one-shot message, often not quite."""
    event: dict[str, Any] = {"id": draw(st.sampled_from(IDS))}
    if draw(st.booleans()) or draw(st.booleans()):
        event["delta"] = draw(st.sampled_from(DELTAS))
    event["final"] = draw(st.sampled_from([True] * 6 + [False, None, 1, "yes"]))
    if event["final"] is None:
        del event["final"]
    extra = draw(
        st.just([])
        | st.just([])
        | st.lists(
            st.sampled_from(ODD_FIELDS),
            min_size=1,
            max_size=2,
        )
    )
    for name, value in extra:
        event[name] = value
    return event


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """One ``POST /produce`` request."""
    kind = draw(st.sampled_from(["one", "one", "one", "one", "batch", "ndjson", "raw"]))
    if kind == "one":
        body = json.dumps(draw(events()), ensure_ascii=draw(st.booleans())).encode(
            errors="surrogatepass"
        )
    elif kind == "batch":
        body = json.dumps(draw(st.lists(events(), max_size=3))).encode()
    elif kind == "ndjson":
        body = b"\n".join(json.dumps(e).encode() for e in draw(st.lists(events(), max_size=3)))
    else:
        body = draw(st.sampled_from([b"", b"{", b"null", b"[]", b'{"id":"a"}\xff', b" " * 3]))
    query = draw(
        st.sampled_from(
            ["?channel=c"] * 6
            + ["", "?channel=c&producer=p", "?channel=c&producer=q", "?channel=d"]
        )
    )
    media = draw(
        st.sampled_from(
            [
                b"application/json",
                b"application/json",
                b"application/json",
                b"application/json; charset=utf-8",
                b"application/x-ndjson" if kind == "ndjson" else b"application/json",
                b"text/plain",
                None,
            ]
        )
    )
    head = b"POST /produce%b HTTP/1.1\r\nHost: relay\r\n" % query.encode()
    if media is not None:
        head += b"Content-Type: %b\r\n" % media
    if draw(st.integers(0, 7)) == 7:  # chunked: never one-shot, still the same answers
        chunked = b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


# ---------------------------------------------------------------------- playing them

SUBSCRIBE = (
    b"GET /subscribe?channel=c&deltas=1 HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n"
)


COUNTED = re.compile(rb"^relay_\w+(_total|_count)?(\{[^}]*\})? ", re.M)
"""The relay's counters and the counts of its timings (not their sums or buckets)."""


def _counters(relay: Relay) -> list[bytes]:
    return sorted(
        line
        for line in relay.metrics.render().splitlines()
        if COUNTED.match(line)
        and b"_seconds_bucket" not in line
        and b"_seconds_sum" not in line
        and b"_created" not in line
        and not line.startswith(b"relay_uptime")
    )


async def _play(
    one_shot: bool, sequence: list[bytes], together: bool, overloaded: bool = False
) -> dict[str, Any]:
    relay = Relay(
        Settings(
            port=0, max_message_chars=MAX_CHARS, id_hold=60.0, max_body_bytes=4096, **NO_SWEEPS
        )
    )
    await relay.start()
    relay.producers.one_shot = one_shot
    if overloaded:  # what the rest of the relay holds is past --max-memory-bytes
        relay.producers.held_elsewhere = lambda: relay.settings.max_memory_bytes + 1
    try:
        subscriber, seen = _connection(relay)
        subscriber.data_received(SUBSCRIBE)
        await settle()
        opened = [subscriber]
        written = await answers(relay, sequence, together, opened)
        cut = await relay.broker.catch_up("c", None, live=True, rewind=1000)
        for one in opened:
            one.connection_lost(None)
        await settle()
        epoch = cut.epoch.encode()
        _, _, frames = bytes(seen.written).partition(b"\r\n\r\n")  # after the 101 (its Date)
        return {
            "answers": written,
            "subscriber": frames.replace(epoch, b"E"),
            "history": [frame.replace(cut.epoch, "E") for frame in cut.frames],
            "live": [(m.message_id, m.text) for m in cut.live],
            "counters": _counters(relay),
        }
    finally:
        await relay.stop()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(requests(), min_size=1, max_size=6), st.booleans())
def test_one_shot_answers_as_the_general_path(sequence: list[bytes], together: bool) -> None:
    at_once = asyncio.run(_play(True, sequence, together))
    general = asyncio.run(_play(False, sequence, together))
    assert at_once == general


NEAR = [
    {"id": "a", "delta": "hi", "final": True},
    {"id": "a", "final": True},
    {"id": "a", "delta": "", "final": True},
    {"id": "a", "delta": "hi"},
    {"id": "a", "delta": "hi", "final": False},
    {"id": "a", "delta": "a" * (MAX_CHARS + 1), "final": True},
    {"id": "a", "delta": "caf\u00e9 \U0001f600", "final": True},
    {"id": "a", "delta": "hi", "final": True, "channel": "c"},
    {"id": "a", "delta": "hi", "final": True, "channel": "other"},
    {"id": "a", "delta": "hi", "final": True, "seq": 1},
    {"id": "a", "delta": "hi", "final": True, "seq": 2},
    {"id": "a", "delta": "hi", "final": True, "meta": {"k": 1}},
    {"id": "a", "final": True, "chunk": {"type": "text-delta", "id": "t", "delta": "z"}},
    {"id": "a", "final": True, "chunk": {"type": "text-start", "id": "t"}},
    {"id": "a", "delta": "hi", "final": True, "abort": "cancelled"},
    {"id": "a", "abort": "cancelled"},
    {"id": "a", "delta": "hi", "final": True, "unknown": 1},
    {"id": "", "delta": "hi", "final": True},
    [{"id": "a", "delta": "hi", "final": True}],
]
"""Bodies at and near a one-shot message: one for each reason to decline it."""


def _post(body: bytes, query: str = "?channel=c") -> bytes:
    return (
        b"POST /produce%b HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (query.encode(), len(body), body)
    )


@pytest.mark.parametrize("event", NEAR, ids=[json.dumps(event)[:60] for event in NEAR])
@pytest.mark.parametrize("overloaded", [False, True])
def test_each_way_near_a_one_shot_message_answers_as_the_general_path(
    event: Any, overloaded: bool
) -> None:
    """Every body near a one-shot message, posted twice (the second a repeated id), and
    on a relay past ``--max-memory-bytes`` too: the same answers, frames and counters."""
    sequence = [_post(json.dumps(event).encode())] * 2

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        return (
            await _play(True, sequence, False, overloaded),
            await _play(False, sequence, False, overloaded),
        )

    at_once, general = asyncio.run(both())
    assert at_once == general
    if overloaded and event is NEAR[0]:  # a one-shot message, refused as any new one
        assert all(b'"code":"overloaded"' in answer for answer in at_once["answers"])


def test_a_one_shot_message_is_answered_on_the_next_pass_without_a_task() -> None:
    """The short way is taken: no task is made, and the answer is written on the loop's next
    pass, with the message in the channel's history; an NDJSON body of the same event takes
    the general path (a task of its own). A second request pipelined behind a one-shot one
    is read once the first is answered."""

    async def play() -> None:
        relay = Relay(Settings(port=0))
        await relay.start()
        try:
            body = b'{"id":"m","delta":"hi","final":true}'
            post = (
                b"POST /produce?channel=c HTTP/1.1\r\nHost: relay\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
            )
            connection, transport = _connection(relay)
            tasks = len(asyncio.all_tasks())
            connection.data_received(
                post % (len(body), body) + post % (len(body), body.replace(b'"m"', b'"p"'))
            )
            assert not transport.written and len(asyncio.all_tasks()) == tasks
            await asyncio.sleep(0)
            assert len(asyncio.all_tasks()) == tasks
            assert transport.written.count(b"HTTP/1.1 200 ") == 1
            assert transport.written.endswith(
                b'{"acks":[{"type":"ack","id":"m","channel":"c"}],"errors":[],"cancels":[]}'
            )
            await asyncio.sleep(0)
            assert transport.written.count(b"HTTP/1.1 200 ") == 2
            assert transport.written.endswith(b'"id":"p","channel":"c"}],"errors":[],"cancels":[]}')
            cut = await relay.broker.catch_up("c", None, live=False, rewind=10)
            assert [json.loads(frame)["id"] for frame in cut.frames] == ["m", "p"]
            ndjson, later = _connection(relay)
            ndjson.data_received(
                b"POST /produce?channel=c HTTP/1.1\r\nHost: relay\r\n"
                b"Content-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n%b"
                % (len(body), body.replace(b'"m"', b'"n"'))
            )
            assert len(asyncio.all_tasks()) == tasks + 1
            await settle()
            assert later.written.endswith(b'"channel":"c"}],"errors":[],"cancels":[]}')
        finally:
            await relay.stop()

    asyncio.run(play())


def test_a_one_shot_message_is_applied_even_if_its_socket_is_gone_before_its_answer() -> None:
    """The body came whole: its message is published though the socket closed before the
    loop's next pass, and nothing is written to the closed socket."""

    async def play() -> None:
        relay = Relay(Settings(port=0))
        await relay.start()
        try:
            errors: list[dict[str, Any]] = []
            asyncio.get_running_loop().set_exception_handler(lambda _, c: errors.append(c))
            body = b'{"id":"m","delta":"hi","final":true}'
            connection, transport = _connection(relay)
            connection.data_received(_post(body))
            transport.closing = True
            connection.connection_lost(None)
            await settle()
            assert not transport.written and errors == []
            cut = await relay.broker.catch_up("c", None, live=False, rewind=10)
            assert [json.loads(frame)["text"] for frame in cut.frames] == ["hi"]
        finally:
            await relay.stop()

    asyncio.run(play())


@pytest.mark.parametrize("one_shot", [True, False])
def test_an_id_in_progress_elsewhere_is_refused(one_shot: bool) -> None:
    """A one-shot message under an id another producer's message holds is refused with
    ``id_in_use`` (409-free: the answer's status is 200 with the error), either way."""

    async def play() -> bytes:
        relay = Relay(Settings(port=0))
        await relay.start()
        relay.producers.one_shot = one_shot
        try:
            holder, _ = _connection(relay)
            opening = b'{"id":"m","delta":"x"}'
            holder.data_received(_post(opening, "?channel=c&producer=p"))
            await settle()
            body = b'{"id":"m","delta":"hi","final":true}'
            connection, transport = _connection(relay)
            connection.data_received(_post(body))
            await settle()
            return bytes(transport.written)
        finally:
            await relay.stop()

    written = asyncio.run(play())
    assert b'"acks":[]' in written
    assert b'"code":"id_in_use"' in written
