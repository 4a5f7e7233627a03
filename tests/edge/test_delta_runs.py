"""A WebSocket producer's deltas read in a row are applied as a run, exactly as one by one.

Generated sequences of producer frames (plain deltas of a few messages, mostly in runs, and
everything that ends a run or must not join one: finals, aborts, a ``channel``, ``seq``,
``meta`` or ``chunk`` in the event, unknown and ended ids, empty deltas, non-ASCII ones and
surrogate halves, deltas past ``--max-message-chars``, arrays, frames that are not JSON,
binary frames, invalid UTF-8) are cut into reads at generated places and played through a
real relay's :class:`~token_relay.edge.connection.HttpConnection` over an in-memory
transport, with a deltas subscriber and a plain subscriber on the channel: once with runs,
once with every frame applied as it is read. The bytes written back to the producer, every
frame each subscriber was sent, the channel's history, the messages in progress and the
relay's counters must be the same, with the connection's fair share per read at its default
and cut to a few frames (so that reads rest and resume in the middle of a run).

``DELTA_RUN_EXAMPLES=N`` plays N sequences instead of the default.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from token_relay import Relay, Settings
from token_relay.edge import websocket
from token_relay.edge.connection import HttpConnection
from websockets.frames import Frame, Opcode

from tests.conftest import NO_SWEEPS
from tests.edge.played import connection, settle
from tests.edge.test_http11 import FakeTransport
from tests.edge.test_oneshot import ODD_FIELDS, _counters

EXAMPLES = int(os.environ.get("DELTA_RUN_EXAMPLES", "150"))
MAX_CHARS = 40

IDS = ["a", "a", "a", "b", "b", "c"]
DELTAS = ["tok ", "tok ", "x", "", "caf\u00e9", "\U0001f600", "\ud83d", "\ude00", "y" * 30]


def _upgrade(target: bytes) -> bytes:
    return (
        b"GET %b HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n" % target
    )


def _frame(payload: bytes, opcode: Opcode = Opcode.TEXT) -> bytes:
    return Frame(opcode, payload).serialize(mask=True)


def _upgraded(relay: Relay, target: bytes) -> tuple[HttpConnection, FakeTransport]:
    """A connection of ``relay`` upgraded to a WebSocket at ``target``, and its transport."""
    opened, transport = connection(relay)
    opened.data_received(_upgrade(target))
    return opened, transport


@st.composite
def _event(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly a plain delta; often an event that ends a run, or one that may not join it."""
    event: dict[str, Any] = {"id": draw(st.sampled_from(IDS))}
    kind = draw(st.sampled_from(["delta"] * 8 + ["final", "final", "odd"]))
    if kind != "final" or draw(st.booleans()):
        event["delta"] = draw(st.sampled_from(DELTAS))
    if kind == "final":
        event["final"] = True
    elif kind == "odd":
        name, value = draw(st.sampled_from([*ODD_FIELDS, ("final", False)]))
        event[name] = value
    return event


@st.composite
def _frames(draw: st.DrawFn) -> bytes:
    """One producer frame, as a client sends it (masked)."""
    kind = draw(st.sampled_from(["one"] * 12 + ["array", "bad", "binary", "utf8"]))
    if kind == "one":
        return _frame(json.dumps(draw(_event())).encode())
    if kind == "array":
        return _frame(json.dumps(draw(st.lists(_event(), max_size=3))).encode())
    if kind == "bad":
        return _frame(draw(st.sampled_from([b"{", b"null", b"[]", b'{"id": 1}'])))
    if kind == "binary":
        return _frame(b'{"id": "a", "delta": "b"}', Opcode.BINARY)
    return _frame(b'{"id": "a", "delta": "\xff"}')  # invalid UTF-8: closed 1007


@st.composite
def _reads(draw: st.DrawFn) -> list[bytes]:
    """A sequence of frames, cut into the reads of a socket at generated places."""
    data = b"".join(draw(st.lists(_frames(), min_size=1, max_size=60)))
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=4)))
    bounds = [0, *cuts, len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds) if end > start]


async def fed(producer: HttpConnection, written: FakeTransport, reads: list[bytes]) -> None:
    """Hand ``producer`` its socket's ``reads``, each once the socket is read again (the
    kernel holds what a paused socket is sent), until the connection closes."""
    for read in reads:
        await settle()
        for _ in range(100):
            if not written.paused:
                break
            await asyncio.sleep(0)
        if written.closing:
            break
        producer.data_received(read)


async def observed(
    relay: Relay,
    ends: Sequence[HttpConnection],
    seen: dict[str, FakeTransport],
    upgraded: Collection[str],
) -> dict[str, Any]:
    """What a play left: channel "c"'s history and messages in progress, the relay's
    counters, and the bytes each transport of ``seen`` was sent (those in ``upgraded``
    after their 101, whose ``Date`` may differ), with session tokens and the epoch written
    alike; the connections ``ends`` are closed first."""
    cut = await relay.broker.catch_up("c", None, live=True, rewind=1000)
    tokens = list(relay.producers.sessions.by_token)
    for one in ends:
        one.connection_lost(None)
    await settle()
    played: dict[str, Any] = {
        "history": [frame.replace(cut.epoch, "E") for frame in cut.frames],
        "live": [(m.message_id, m.text) for m in cut.live],
        "counters": _counters(relay),
    }
    for name, transport in seen.items():
        frames = bytes(transport.written)
        if name in upgraded:
            _, _, frames = frames.partition(b"\r\n\r\n")
        for token in tokens:
            frames = frames.replace(token.encode(), b"T")
        played[name] = frames.replace(cut.epoch.encode(), b"E")
    return played


async def _play(runs: bool, reads: list[bytes]) -> dict[str, Any]:
    relay = Relay(Settings(port=0, max_message_chars=MAX_CHARS, id_hold=60.0, **NO_SWEEPS))
    await relay.start()
    relay.producers.delta_runs = runs
    try:
        deltas, seen_deltas = _upgraded(relay, b"/subscribe?channel=c&deltas=1")
        messages, seen_messages = _upgraded(relay, b"/subscribe?channel=c")
        producer, written = _upgraded(relay, b"/produce?channel=c")
        await settle()
        # Frames start here: an opening message "a" in progress, so that the first deltas
        # may run at once.
        producer.data_received(_frame(b'{"id": "a", "delta": "go "}'))
        await fed(producer, written, reads)
        await settle()
        seen = {"producer": written, "deltas": seen_deltas, "messages": seen_messages}
        return await observed(relay, (deltas, messages, producer), seen, set(seen))
    finally:
        await relay.stop()


@pytest.mark.parametrize("fair_share", [websocket.FAIR_SHARE, 3])
def test_runs_of_deltas_are_applied_as_one_by_one(
    fair_share: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(websocket, "FAIR_SHARE", fair_share)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(_reads())
    def play(reads: list[bytes]) -> None:
        with_runs = asyncio.run(_play(True, reads))
        one_by_one = asyncio.run(_play(False, reads))
        assert with_runs == one_by_one

    play()


@pytest.mark.parametrize(
    "deltas",
    [("y" * 30, "tok ", "tok ", "x", "x", "x", "z"), ("y" * 30, "tok ", "\ud83d", "\ude00", "z")],
    ids=["a character past the size", "a surrogate half"],
)
def test_a_run_ends_where_a_delta_may_not_join_it_as_one_by_one(deltas: tuple[str, ...]) -> None:
    """A run that fills the message to ``--max-message-chars`` exactly, then a delta of one
    character more; or a surrogate half to hold back: the run ends there, as one by one."""
    events: list[dict[str, Any]] = [{"id": "m", "delta": delta} for delta in deltas]
    events.append({"id": "m", "final": True})
    reads = [b"".join(_frame(json.dumps(event).encode()) for event in events)]
    assert asyncio.run(_play(True, reads)) == asyncio.run(_play(False, reads))
    assert sum(map(len, deltas[:5])) == MAX_CHARS or "\ud83d" in deltas


def published_in_one_call(send: Callable[[Relay], Awaitable[FakeTransport]]) -> None:
    """``send`` has a producer of channel "c" send message "m": its delta "0" (which opens
    it), "1" to "10" in a row, then its final; it returns the producer's transport. The
    ten must reach the broker in one call, and a deltas subscriber must have each of the
    eleven, in order, before the final's message; the producer gets its ack."""
    calls: list[tuple[str, list[str]]] = []

    async def play() -> tuple[bytes, bytes]:
        relay = Relay(Settings(port=0, **NO_SWEEPS))
        await relay.start()
        deltas = relay.broker.deltas

        def counted(channel: str, owner: str, message_id: str, run: Any, count: int) -> None:
            calls.append((message_id, list(run)))
            deltas(channel, owner, message_id, run, count)

        relay.broker.deltas = counted  # type: ignore[method-assign]
        try:
            _, seen = _upgraded(relay, b"/subscribe?channel=c&deltas=1")
            written = await send(relay)
            return bytes(seen.written), bytes(written.written)
        finally:
            await relay.stop()

    seen, written = asyncio.run(play())
    assert calls == [("m", [str(n) for n in range(1, 11)])]
    for n in range(11):
        assert b'"delta":"%d"' % n in seen
    assert seen.index(b'"delta":"10"') < seen.index(b'"text":"012345678910"')
    assert b'"type":"ack"' in written


def test_a_run_is_published_with_one_call_to_the_broker() -> None:
    """The short way is taken: ten deltas of a message in one read are one run."""

    async def send(relay: Relay) -> FakeTransport:
        producer, written = _upgraded(relay, b"/produce?channel=c")
        await settle()
        producer.data_received(_frame(b'{"id": "m", "delta": "0"}'))
        await settle()
        events: list[dict[str, Any]] = [{"id": "m", "delta": str(n)} for n in range(1, 11)]
        events.append({"id": "m", "final": True})
        producer.data_received(b"".join(_frame(json.dumps(e).encode()) for e in events))
        await settle()
        return written

    published_in_one_call(send)
