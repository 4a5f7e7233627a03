"""The producer's short ways for a batch's run of deltas of one message, applied together
(``MessageStreams.plain_deltas``, ``Broker.deltas``), for a plain message's first delta
(``MessageStreams.plain_open``) and for its final (``MessageStreams.plain_final``):
differential tests against the general path.

Generated batches and single frames (plain deltas, empty ones, non-ASCII and surrogate
halves, finals, other channels, numbered events, aborts, deltas past the message's size) are
played through two relays in memory over real connections: one as it is, one that never
takes a short way. Every frame the producer and both subscribers (one with deltas, one
without) receive must be the same bytes, and so must the counters."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st
from token_relay import Relay
from token_relay.core.settings import Settings
from token_relay.core.streams import MessageStreams
from token_relay.edge import producers
from token_relay.edge.connection import HttpConnection

from bench.wire import client_frame, upgrade_request
from tests.conftest import NO_SWEEPS
from tests.core.test_streams_hot_path import DELTAS, IDS, OPTIONAL
from tests.edge.played import settle
from tests.edge.test_http11 import FakeTransport

plain = st.fixed_dictionaries({"id": st.sampled_from(IDS), "delta": DELTAS})
other = st.fixed_dictionaries(
    {"id": st.sampled_from(IDS)}, optional={**OPTIONAL, "abort": st.just("stop")}
)
# Runs of one message's deltas, as a gateway's batch holds them, between other events.
run = st.tuples(st.sampled_from(IDS), st.lists(DELTAS, min_size=1, max_size=6)).map(
    lambda pair: [{"id": pair[0], "delta": delta} for delta in pair[1]]
)
# Finals: plain ones (the short way), and ones with a delta, a seq, meta or a channel.
closing = st.fixed_dictionaries(
    {"id": st.sampled_from(IDS), "final": st.just(True)},
    optional={
        "delta": DELTAS,
        "seq": st.integers(1, 3),
        "meta": st.fixed_dictionaries({"k": st.just("v")}),
        "channel": st.sampled_from(["room", "other"]),
    },
)
batch = st.lists(
    st.one_of(
        run,
        run,
        st.lists(plain, max_size=3),
        st.lists(other, max_size=2),
        st.lists(closing, min_size=1, max_size=2),
    ),
    max_size=6,
).map(lambda parts: [event for part in parts for event in part])

_MASKED = re.compile(rb'\A.*?\r\n\r\n|"(session|epoch)":"[^"]*"', re.DOTALL)
"""The upgrade's answer (its date and key differ), the session's name and the history's
epoch, which differ between two relays."""


def _connect(relay: Relay, target: str) -> tuple[HttpConnection, FakeTransport]:
    assert relay.server is not None
    connection, transport = HttpConnection(relay.server), FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.data_received(upgrade_request(1, target)[1])
    return connection, transport


async def _quiet(*transports: FakeTransport) -> None:
    """Until nothing more is written for 50 ms (a relay on Redis answers later)."""
    previous: list[int] = []
    while (sizes := [len(transport.written) for transport in transports]) != previous:
        previous = sizes
        await asyncio.sleep(0.05)


async def _play(
    batches: list[list[dict[str, Any]]],
    shortcuts: bool,
    broker: str = "memory://",
    holding: list[str] = (),  # type: ignore[assignment]
    overloaded: bool = False,
) -> tuple[Any, ...]:
    """Play ``batches`` from one producer; ``holding``: ids another producer opened first,
    and holds while these are played; ``overloaded``: past ``--max-memory-bytes`` from
    then on."""
    relay = Relay(
        Settings(
            port=0,
            broker=broker,
            max_message_chars=16,
            max_events_per_second=1_000_000,
            max_connections_per_ip=100,
            max_handshakes_per_ip=100,
            **NO_SWEEPS,
        )
    )
    await relay.start()
    original, final, opening = (
        producers._run_of_deltas,
        MessageStreams.plain_final,
        MessageStreams.plain_open,
    )
    if not shortcuts:
        producers._run_of_deltas = lambda events, start, first: [first]  # type: ignore[assignment]
        MessageStreams.plain_final = lambda self, message_id: None  # type: ignore[assignment,method-assign]
        MessageStreams.plain_open = lambda self, message_id, delta, now=0.0: None  # type: ignore[assignment,method-assign]
    try:
        deltas_reader, deltas_seen = _connect(relay, "/subscribe?channel=room&deltas=1")
        messages_reader, messages_seen = _connect(relay, "/subscribe?channel=room")
        holder = None
        if holding:
            holder, _ = _connect(relay, "/produce?channel=room")
            for message_id in holding:
                opened = json.dumps({"id": message_id, "delta": "held"})
                holder.data_received(client_frame(opened.encode()))
        if overloaded:
            relay.producers.held_elsewhere = lambda: relay.settings.max_memory_bytes + 1
        producer, answers = _connect(relay, "/produce?channel=room")
        await settle()
        if broker != "memory://":
            await _quiet(answers, deltas_seen, messages_seen)
        for events in batches:
            text = json.dumps(events) if len(events) != 1 else json.dumps(events[0])
            producer.data_received(client_frame(text.encode()))
            await settle()
            if broker != "memory://":
                await _quiet(answers, deltas_seen, messages_seen)
        metrics = relay.metrics
        counted = (
            sum(metrics.first_delta.counts),
            sum(metrics.delta_gap.counts),
            metrics.frames_in_producer.value,
        )
        for connection in (producer, deltas_reader, messages_reader, holder):
            if connection is not None:
                connection.connection_lost(None)
        await settle()
        return (
            _MASKED.sub(b"", bytes(answers.written)),
            _MASKED.sub(b"", bytes(deltas_seen.written)),
            _MASKED.sub(b"", bytes(messages_seen.written)),
            counted,
        )
    finally:
        producers._run_of_deltas = original  # type: ignore[assignment]
        MessageStreams.plain_final = final  # type: ignore[method-assign]
        MessageStreams.plain_open = opening  # type: ignore[method-assign]
        await relay.stop()


@settings(max_examples=150, deadline=None)
@given(st.lists(batch, min_size=1, max_size=6))
def test_the_short_ways_apply_events_as_the_general_path(
    batches: list[list[dict[str, Any]]],
) -> None:
    together = asyncio.run(_play(batches, shortcuts=True))
    one_by_one = asyncio.run(_play(batches, shortcuts=False))
    assert together == one_by_one


def test_a_run_is_taken_together() -> None:
    """The run after a message's first delta goes through ``plain_deltas`` once, and the
    first delta, which opens the message, never (no run is offered for a message not in
    progress: it would be refused)."""
    seen: list[list[str]] = []
    keep = MessageStreams.plain_deltas

    def spy(self: MessageStreams, message_id: str, deltas: Any, now: float = 0.0) -> Any:
        seen.append(list(deltas))
        return keep(self, message_id, deltas, now)

    MessageStreams.plain_deltas = spy  # type: ignore[method-assign]
    try:
        events = [{"id": "m", "delta": piece} for piece in ("a", "b", "", "c")]
        answered = asyncio.run(_play([[*events, {"id": "m", "final": True}]], shortcuts=True))
    finally:
        MessageStreams.plain_deltas = keep  # type: ignore[method-assign]
    # The first delta opens the message (one at a time); the other three go together.
    assert seen == [["b", "", "c"]]
    assert b'"text":"abc"' in answered[2]


def _taken(shortcut: str, batches: list[list[dict[str, Any]]]) -> tuple[list[str], Any]:
    """Play ``batches``: the ids for which ``MessageStreams.<shortcut>`` took the short way
    (answered anything but None), and what :func:`_play` gives."""
    taken: list[str] = []
    keep = getattr(MessageStreams, shortcut)

    def spy(self: MessageStreams, message_id: str, *args: Any) -> Any:
        answer = keep(self, message_id, *args)
        if answer is not None:
            taken.append(message_id)
        return answer

    setattr(MessageStreams, shortcut, spy)
    try:
        return taken, asyncio.run(_play(batches, shortcuts=True))
    finally:
        setattr(MessageStreams, shortcut, keep)


def test_a_plain_final_takes_the_short_way() -> None:
    """A final of only ``id`` and ``final``, a frame of its own and in a batch."""
    batches = [
        [{"id": "m", "delta": "a"}],
        [{"id": "m", "final": True}],
        [{"id": "n", "delta": "b"}, {"id": "n", "final": True}],
        [{"id": "o", "final": True}],  # unseen: the general path finalizes it to ""
    ]
    taken, answered = _taken("plain_final", batches)
    assert taken == ["m", "n"]
    assert b'"id":"o","text":"","offset":3' in answered[2]


def test_a_first_delta_takes_the_short_way() -> None:
    """A plain message opened by a delta of only ``id`` and ``delta``, a frame of its own
    and in a batch; an empty one too. A refused one (past the size) goes the general way."""
    batches = [
        [{"id": "m", "delta": "a"}],
        [{"id": "n", "delta": "b"}, {"id": "n", "delta": "c"}, {"id": "n", "final": True}],
        [{"id": "o", "delta": ""}],
        [{"id": "p", "delta": "x" * 17}],
        [{"id": "m", "final": True}],
    ]
    opened, answered = _taken("plain_open", batches)
    assert opened == ["m", "n", "o"]
    assert b'"id":"n","text":"bc"' in answered[2]
    assert b'"id":"m","text":"a"' in answered[2]
    assert b'"code":"message_too_large"' in answered[0]


@pytest.mark.parametrize("alone", [True, False], ids=["a frame each", "in a batch"])
def test_a_first_delta_refused_by_the_ids_holder_is_as_the_general_paths(alone: bool) -> None:
    """Another producer holds the id: the short way's refusal (``id_in_use``, the event's
    index in a batch) and everything after it are the general path's, byte for byte."""
    events = [{"id": "a", "delta": "x"}, {"id": "b", "delta": "y"}, {"id": "a", "final": True}]
    events += [{"id": "b", "final": True}]
    batches = [[event] for event in events] if alone else [events]
    short = asyncio.run(_play(batches, shortcuts=True, holding=["a"]))
    general = asyncio.run(_play(batches, shortcuts=False, holding=["a"]))
    assert short == general
    assert short[0].count(b'"code":"id_in_use"') == 2  # the delta and the final
    assert b'"id":"b","text":"y"' in short[2]
    assert (b'"index":0' in short[0]) is not alone


@pytest.mark.parametrize("alone", [True, False], ids=["a frame each", "in a batch"])
def test_a_first_delta_past_the_memory_limit_is_as_the_general_paths(alone: bool) -> None:
    """Past ``--max-memory-bytes`` a new message is refused ``overloaded``, the short way
    as the general one."""
    events = [{"id": "a", "delta": "x"}, {"id": "c", "delta": "y"}, {"id": "a", "final": True}]
    batches = [[event] for event in events] if alone else [events]
    short = asyncio.run(_play(batches, shortcuts=True, holding=["h"], overloaded=True))
    general = asyncio.run(_play(batches, shortcuts=False, holding=["h"], overloaded=True))
    assert short == general
    # "a" and "c" are new messages, and so is the one-shot final of "a", refused before it
    assert short[0].count(b'"code":"overloaded"') == 3


@pytest.mark.parametrize("tail", ["\ud83d", "x" * 16])
def test_a_run_that_needs_the_general_path_is_applied_one_at_a_time(tail: str) -> None:
    """A surrogate half, or a run past the message's size: the same as one by one."""
    events = [{"id": "m", "delta": piece} for piece in ("a", "b", "c", tail)]
    batches = [[*events, {"id": "m", "final": True}]]
    assert asyncio.run(_play(batches, shortcuts=True)) == asyncio.run(
        _play(batches, shortcuts=False)
    )


def test_the_short_ways_on_redis_apply_events_as_the_general_path(redis_url: str) -> None:
    """On Redis a run's deltas are written and published one by one, as they were."""
    pieces = ["a", "", "é", "bc", ""]
    batches = [
        [{"id": "m", "delta": "x"}, *({"id": "m", "delta": p} for p in pieces)],
        [*({"id": "n", "delta": p} for p in pieces), {"id": "m", "delta": "y"}],
        [*({"id": "m", "delta": p} for p in pieces), {"id": "m", "final": True}],
        [{"id": "n", "delta": "z"}, {"id": "n", "delta": "w"}, {"id": "n", "final": True}],
    ]

    async def both() -> tuple[Any, Any]:
        client = aioredis.from_url(redis_url)
        try:
            await client.flushall()
            together = await _play(batches, shortcuts=True, broker=redis_url)
            await client.flushall()
            one_by_one = await _play(batches, shortcuts=False, broker=redis_url)
            return together, one_by_one
        finally:
            await client.aclose()

    together, one_by_one = asyncio.run(both())
    assert together == one_by_one
    assert '"text":"xaébcyaébc"'.encode() in together[2]
    # Redis merges a message's waiting deltas into fewer frames; their text is the same.
    streamed = re.findall(rb'"id":"m","delta":"([^"]*)"', together[1])
    assert b"".join(streamed).decode() == "xaébcyaébc"
