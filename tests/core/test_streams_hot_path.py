"""Tests for the hot paths of token_relay.core.streams: ``MessageStreams.plain_delta``,
``plain_open`` and ``plain_final``, the short ways of a plain message's delta, first delta
and final, and ``plain_deltas`` for a run of deltas, do what ``receive`` does, or nothing at
all."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from token_relay.core.errors import FrameRejected
from token_relay.core.protocol import ProducerEvent
from token_relay.core.streams import Applied, MessageStreams, Overflow

IDS = ("a", "b", "c")
DELTAS = st.sampled_from(
    ["", "x", "hello ", "é", "naïve ", "\ud83d", "\ude00", "\ud83d\ude00", "0123456789"]
)
"""Empty, ASCII, non-ASCII, surrogate halves (held back and mended), and long enough to
pass the size limit below."""

OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    "delta": DELTAS,
    "final": st.booleans(),
    "channel": st.sampled_from(["room", "other"]),
    "seq": st.integers(1, 3),
    "meta": st.fixed_dictionaries({"k": st.sampled_from(["v", "w"])}),
}
"""An event's other fields, each there or not: what opens, ends, numbers and moves messages."""

Step = tuple[str, dict[str, Any], float]

plain: st.SearchStrategy[Step] = st.tuples(
    st.just("event"),
    st.fixed_dictionaries({"id": st.sampled_from(IDS), "delta": DELTAS}),
    st.floats(0, 2),
)
"""The events the hot path takes: an id and a delta, nothing else."""

final: st.SearchStrategy[Step] = st.tuples(
    st.just("event"),
    st.fixed_dictionaries({"id": st.sampled_from(IDS), "final": st.just(True)}),
    st.floats(0, 2),
)
"""The finals the other hot path takes: an id and ``final``, nothing else."""

steps: st.SearchStrategy[Step] = st.one_of(
    plain,
    plain,
    plain,
    plain,
    final,
    final,
    # An event with metadata, and a numbered one: what a final's Applied carries on.
    st.tuples(
        st.just("event"),
        st.fixed_dictionaries(
            {"id": st.sampled_from(IDS), "meta": st.fixed_dictionaries({"k": st.just("v")})}
        ),
        st.floats(0, 2),
    ),
    st.tuples(
        st.just("event"),
        st.fixed_dictionaries({"id": st.sampled_from(IDS), "seq": st.integers(1, 2)}),
        st.floats(0, 2),
    ),
    # Every other shape, which opens, ends, numbers and moves messages around them.
    st.tuples(
        st.just("event"),
        st.fixed_dictionaries(
            {"id": st.sampled_from(IDS)},
            optional={**OPTIONAL, "chunk": st.just({"type": "text-start", "id": "t"})},
        ),
        st.floats(0, 2),
    ),
    st.tuples(st.just("default"), st.fixed_dictionaries({"channel": st.none()}), st.just(0.0)),
    st.tuples(
        st.just("default"), st.fixed_dictionaries({"channel": st.just("room")}), st.just(0.0)
    ),
    st.tuples(st.just("abort"), st.fixed_dictionaries({"id": st.sampled_from(IDS)}), st.just(0.0)),
    st.tuples(st.just("refuse"), st.fixed_dictionaries({"id": st.sampled_from(IDS)}), st.just(0.0)),
)


def _streams() -> MessageStreams:
    return MessageStreams("room", max_streaming=2, max_completed=2, max_chars=12)


def _outcome(streams: MessageStreams, event: ProducerEvent, now: float) -> Any:
    """What ``receive`` did, comparable: an Applied, an Overflow's parts, or a refusal."""
    try:
        applied = streams.receive(event, now)
    except FrameRejected as exc:
        return ("rejected", exc.code, exc.message, exc.expected)
    if isinstance(applied, Overflow):
        rejection = applied.rejection
        return ("overflow", applied.unfinished, rejection.code, rejection.message)
    return applied


def _state(streams: MessageStreams) -> tuple[Any, ...]:
    return (
        streams.streaming(),
        streams.text_chars,
        streams.held_chars(),
        streams.completed_count,
        [
            (
                streams.phase(message_id),
                streams.partial(message_id),
                streams.live_parts(message_id),
                streams.completed(message_id),
                streams.next_seq(message_id),
            )
            for message_id in IDS
        ],
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(steps, max_size=40))
def test_the_hot_path_applies_a_delta_as_receive_does(played: list[Step]) -> None:
    checked, hot = _streams(), _streams()
    now = 0.0
    for kind, fields, later in played:
        now += later
        if kind == "default":
            checked.default_channel = hot.default_channel = fields["channel"]
        elif kind == "abort":
            assert checked.abort(fields["id"]) == hot.abort(fields["id"])
        elif kind == "refuse":
            checked.refuse(fields["id"])
            hot.refuse(fields["id"])
        else:
            event = ProducerEvent(**fields)
            expected = _outcome(checked, event, now)
            taken: Any = None
            before = _state(hot)
            if set(fields) == {"id", "delta"}:
                streamed = hot.plain_delta(event.id, event.delta, now)
                if streamed is not None:
                    channel, wait, first = streamed
                    taken = Applied(
                        channel,
                        event.id,
                        None,
                        delta=event.delta,
                        delta_wait=wait,
                        first_delta=first,
                    )
                else:
                    opened = hot.plain_open(event.id, event.delta, now)
                    if opened is not None:
                        first = event.delta != ""
                        taken = Applied(
                            opened,
                            event.id,
                            None,
                            delta=event.delta,
                            opened=True,
                            delta_wait=0.0 if first else None,
                            first_delta=first,
                        )
            elif set(fields) == {"id", "final"} and fields["final"]:
                taken = hot.plain_final(event.id)
            if taken is None:
                assert _state(hot) == before  # nothing changed: receive decides
                taken = _outcome(hot, event, now)
            assert taken == expected
        assert _state(hot) == _state(checked)
        assert hot.streaming_count == checked.streaming_count


def test_the_hot_path_takes_plain_deltas_and_leaves_the_rest() -> None:
    streams = MessageStreams("room", max_chars=10)
    assert streams.plain_delta("m", "x", 1.0) is None  # unknown: receive opens it
    streams.receive(ProducerEvent(id="m"), 1.0)
    assert streams.plain_delta("m", "", 2.0) == ("room", None, False)
    assert streams.plain_delta("m", "ab", 3.0) == ("room", 2.0, True)
    assert streams.plain_delta("m", "é", 4.5) == ("room", 1.5, False)
    assert streams.plain_delta("m", "\ud83d", 5.0) is None  # a half to hold back
    assert streams.plain_delta("m", "x" * 8, 5.0) is None  # past max_chars: an overflow
    streams.default_channel = "other"
    assert streams.plain_delta("m", "y", 5.0) is None  # channel_mismatch
    streams.default_channel = "room"
    assert streams.partial("m") == "abé"
    streams.receive(ProducerEvent(id="s", chunk={"type": "text-start", "id": "t"}), 6.0)
    assert streams.plain_delta("s", "z", 6.0) is None  # structured
    assert streams.receive(ProducerEvent(id="m", final=True), 7.0) == Applied(
        "room", "m", "abé", True
    )
    assert streams.plain_delta("m", "x", 8.0) is None  # completed


def test_the_hot_path_opens_plain_messages_and_leaves_the_rest() -> None:
    streams = MessageStreams("room", max_streaming=2, max_chars=4)
    assert streams.plain_open("a", "ab", 1.0) == "room"
    assert streams.partial("a") == "ab"
    assert streams.plain_open("a", "c", 2.0) is None  # in progress: plain_delta's
    assert streams.plain_open("b", "\ud83d", 2.0) is None  # a half to hold back
    assert streams.plain_open("b", "abcde", 2.0) is None  # past max_chars
    assert streams.plain_open("b", "", 2.0) == "room"  # an empty delta counts
    assert streams.partial("b") == ""
    assert streams.plain_open("c", "x", 3.0) is None  # at max_streaming
    assert streams.plain_final("a") is not None
    assert streams.plain_open("a", "x", 4.0) is None  # completed: receive answers
    assert streams.plain_open("r", "x", 4.0) == "room"
    streams.refuse("r")
    assert streams.plain_open("r", "x", 5.0) is None  # refused
    streams.default_channel = None
    assert streams.plain_open("d", "x", 4.0) is None  # no channel: receive refuses
    assert streams.phase("d") is None


def _one_by_one(
    streams: MessageStreams, message_id: str, deltas: list[str], now: float
) -> tuple[bool, list[Any]]:
    """Each delta through ``plain_delta`` (``receive`` where it declines): whether it took
    every one, and what each gave."""
    took, results = True, []
    for delta in deltas:
        streamed = streams.plain_delta(message_id, delta, now)
        if streamed is None:
            took = False
            streamed = _outcome(streams, ProducerEvent(id=message_id, delta=delta), now)
        results.append(streamed)
    return took, results


@settings(max_examples=300, deadline=None)
@given(
    st.lists(steps, max_size=25),
    st.sampled_from(IDS),
    st.lists(DELTAS, min_size=1, max_size=8),
    st.floats(0, 2),
)
def test_a_run_of_deltas_applies_as_each_in_turn(
    before: list[Step], message_id: str, deltas: list[str], later: float
) -> None:
    """``plain_deltas`` takes a run of one message's deltas at one ``now`` exactly when
    ``plain_delta`` takes each of them in turn, and leaves the same state; it gives the
    first non-empty delta's wait and flag (every later one waits 0.0, not a first), and
    how many are not empty. Declining, it changes nothing."""
    checked, run = _streams(), _streams()
    now = 0.0
    for kind, fields, step in before:  # the same history on both
        now += step
        for streams in (checked, run):
            if kind == "default":
                streams.default_channel = fields["channel"]
            elif kind == "abort":
                streams.abort(fields["id"])
            elif kind == "refuse":
                streams.refuse(fields["id"])
            else:
                _outcome(streams, ProducerEvent(**fields), now)
    now += later
    took, results = _one_by_one(checked, message_id, deltas, now)
    state = _state(run)
    together = run.plain_deltas(message_id, deltas, now)
    if together is None:
        assert not took
        assert _state(run) == state  # nothing changed: one at a time decides
        _one_by_one(run, message_id, deltas, now)
    else:
        assert took
        waited = [result for result in results if result[1] is not None]
        channel, wait, first, count = together
        assert count == len(waited) == sum(1 for delta in deltas if delta)
        assert {result[0] for result in results} == {channel}
        if waited:
            assert (wait, first) == waited[0][1:]
            assert all(result[1:] == (0.0, False) for result in waited[1:])
        else:
            assert (wait, first) == (None, False)
    assert _state(run) == _state(checked)
    # The wait of the message's next delta tells its last delta's time apart.
    assert run.plain_delta(message_id, "z", now + 1) == checked.plain_delta(
        message_id, "z", now + 1
    )


def test_the_final_hot_path_takes_plain_finals_and_leaves_the_rest() -> None:
    streams = MessageStreams("room", max_chars=10)
    assert streams.plain_final("m") is None  # unseen: receive finalizes it to ""
    streams.receive(ProducerEvent(id="m", delta="ab", meta={"k": "v"}), 1.0)
    assert streams.plain_final("m") == Applied("room", "m", "ab", True, meta={"k": "v"})
    assert streams.plain_final("m") is None  # completed: a repeated final is receive's
    streams.receive(ProducerEvent(id="n", seq=1, delta="x"), 2.0)
    assert streams.plain_final("n") == Applied("room", "n", "x", True)
    # Its final was numbered 1: a numbered event at or below it is a duplicate.
    assert streams.receive(ProducerEvent(id="n", seq=1, final=True), 3.0).duplicate
    streams.receive(ProducerEvent(id="h", delta="\ud83d"), 4.0)
    assert streams.plain_final("h") is None  # a half held back: receive mends it
    streams.receive(ProducerEvent(id="o", channel="other"), 4.0)
    assert streams.plain_final("o") is None  # another channel
    streams.receive(ProducerEvent(id="s", chunk={"type": "text-start", "id": "t"}), 5.0)
    assert streams.plain_final("s") is None  # structured
