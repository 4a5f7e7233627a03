"""An NDJSON body's deltas read in a row are applied as a run, exactly as one by one.

Generated bodies of lines (plain deltas of a few messages, mostly in runs, and every line
that ends a run or must not join one: finals, aborts, a ``channel``, ``seq``, ``meta`` or
``chunk`` in the event, unknown and ended ids, empty deltas, non-ASCII ones and surrogate
halves, deltas past ``--max-message-chars``, arrays, lines that are not JSON, blank lines,
invalid UTF-8, lines over ``--max-frame-bytes``) are posted as a named producer's two
chunked ``POST /produce`` requests on one connection, cut into chunks and into the socket's
reads at generated places, and played through a real relay's
:class:`~token_relay.edge.connection.HttpConnection` over an in-memory transport, with a
deltas subscriber and a plain subscriber on the channel: once with runs, once with every
line applied as it is read. The answers, every frame each subscriber was sent, the
channel's history, the messages in progress and the relay's counters must be the same.

``DELTA_RUN_EXAMPLES=N`` plays N bodies instead of the default.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from token_relay import Relay, Settings

from tests.conftest import NO_SWEEPS
from tests.edge.played import connection, settle
from tests.edge.test_delta_runs import (
    EXAMPLES,
    MAX_CHARS,
    _event,
    _upgraded,
    fed,
    observed,
    published_in_one_call,
)
from tests.edge.test_http11 import FakeTransport

MAX_LINE = 120
"""``--max-frame-bytes``: the longest line taken."""


@st.composite
def _line(draw: st.DrawFn) -> bytes:
    """One line of a body, without its newline."""
    kind = draw(st.sampled_from(["one"] * 14 + ["array", "bad", "blank", "utf8", "long"]))
    if kind == "one":
        return json.dumps(draw(_event())).encode()
    if kind == "array":
        return json.dumps(draw(st.lists(_event(), max_size=3))).encode()
    if kind == "bad":
        return draw(st.sampled_from([b"{", b"null", b"[]", b'{"id": 1}']))
    if kind == "blank":
        return draw(st.sampled_from([b"", b"  ", b"\r"]))
    if kind == "utf8":
        return b'{"id": "a", "delta": "\xff"}'
    return b'{"id": "a", "delta": "%b"}' % (b"z" * MAX_LINE)


def _cut(draw: st.DrawFn, data: bytes, most: int) -> list[bytes]:
    """``data`` cut at up to ``most`` generated places."""
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=most)))
    bounds = [0, *cuts, len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds) if end > start]


@st.composite
def _request(draw: st.DrawFn) -> bytes:
    """A chunked ``POST /produce`` of generated lines, in generated chunks."""
    lines = draw(st.lists(_line(), min_size=1, max_size=40))
    body = b"\n".join(lines) + draw(st.sampled_from([b"\n", b""]))
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in _cut(draw, body, 3))
    return (
        b"POST /produce?channel=c&producer=p HTTP/1.1\r\nHost: relay\r\n"
        b"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"%b0\r\n\r\n" % chunks
    )


@st.composite
def _reads(draw: st.DrawFn) -> list[bytes]:
    """Two requests on one connection, cut into the socket's reads at generated places."""
    return _cut(draw, draw(_request()) + draw(_request()), 6)


async def _play(runs: bool, reads: list[bytes]) -> dict[str, Any]:
    relay = Relay(
        Settings(
            port=0, max_message_chars=MAX_CHARS, max_frame_bytes=MAX_LINE, id_hold=60.0, **NO_SWEEPS
        )
    )
    await relay.start()
    relay.producers.delta_runs = runs
    try:
        deltas, seen_deltas = _upgraded(relay, b"/subscribe?channel=c&deltas=1")
        messages, seen_messages = _upgraded(relay, b"/subscribe?channel=c")
        producer, written = connection(relay)
        await settle()
        # An opening message "a" in progress, so that the first deltas may run at once.
        opening = b'{"id": "a", "delta": "go "}\n'
        producer.data_received(
            b"POST /produce?channel=c&producer=p HTTP/1.1\r\nHost: relay\r\n"
            b"Content-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n%b"
            % (len(opening), opening)
        )
        await fed(producer, written, reads)
        for _ in range(5):
            await settle()
        seen = {"producer": written, "deltas": seen_deltas, "messages": seen_messages}
        return await observed(relay, (deltas, messages, producer), seen, {"deltas", "messages"})
    finally:
        await relay.stop()


def test_runs_of_ndjson_deltas_are_applied_as_one_by_one() -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(_reads())
    def play(reads: list[bytes]) -> None:
        with_runs = asyncio.run(_play(True, reads))
        one_by_one = asyncio.run(_play(False, reads))
        assert with_runs == one_by_one
        # Three answers: the opening request's and the two generated ones (unless one
        # refused its body, which closes the connection: a line over the limit).
        answered = with_runs["producer"]
        assert answered.count(b"HTTP/1.1 ") == 3 or b"Connection: close" in answered

    play()


def test_a_body_s_run_is_published_with_one_call_to_the_broker() -> None:
    """The short way is taken: ten deltas of a message in one body are one run."""

    async def send(relay: Relay) -> FakeTransport:
        producer, written = connection(relay)
        await settle()
        events: list[dict[str, Any]] = [{"id": "m", "delta": str(n)} for n in range(11)]
        events.append({"id": "m", "final": True})
        body = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        producer.data_received(
            b"POST /produce?channel=c HTTP/1.1\r\nHost: relay\r\n"
            b"Content-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n%b"
            % (len(body), body)
        )
        for _ in range(5):
            await settle()
        return written

    published_in_one_call(send)
