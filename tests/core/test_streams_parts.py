"""Structured messages in :class:`MessageStreams`: events with a ``chunk`` build a message's
parts, synchronously, with exact values.

The seed's rules hold for them as for text: empty deltas count, finals are idempotent (a
repeated one is acked with the same parts), numbered events are applied once, and a
refused event changes nothing, its ``seq`` included.
"""

from __future__ import annotations

from typing import Any

import pytest
from token_relay.core.codec import decode_events, message_body
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.parts import PartLimits
from token_relay.core.protocol import ProducerEvent
from token_relay.core.streams import Applied, MessageStreams, Overflow, Phase, Unfinished


def with_parts(
    channel: str, *, part_limits: PartLimits | None = None, **limits: Any
) -> MessageStreams:
    """Message streams given parts, as the relay's sessions give them."""
    limited = part_limits or PartLimits()
    return MessageStreams(channel, part_limits=limited, **limits)


def chunk(message_id: str = "m", **fields: Any) -> ProducerEvent:
    return ProducerEvent(id=message_id, chunk=fields)


def applied(result: Applied | Overflow) -> Applied:
    assert isinstance(result, Applied), result
    return result


REPLY: list[dict[str, Any]] = [
    {"type": "start-step"},
    {"type": "reasoning-start", "id": "r1"},
    {"type": "reasoning-delta", "id": "r1", "delta": "Let me "},
    {"type": "reasoning-delta", "id": "r1", "delta": "check."},
    {"type": "reasoning-end", "id": "r1"},
    {"type": "tool-input-start", "toolCallId": "call-1", "toolName": "weather"},
    {"type": "tool-input-delta", "toolCallId": "call-1", "inputTextDelta": '{"city":'},
    {"type": "tool-input-delta", "toolCallId": "call-1", "inputTextDelta": '"Paris"}'},
    {
        "type": "tool-input-available",
        "toolCallId": "call-1",
        "toolName": "weather",
        "input": {"city": "Paris"},
    },
    {"type": "tool-output-available", "toolCallId": "call-1", "output": {"celsius": 21}},
    {"type": "finish-step"},
    {"type": "start-step"},
    {"type": "text-start", "id": "t1"},
    {"type": "text-delta", "id": "t1", "delta": "It is 21 "},
    {"type": "text-delta", "id": "t1", "delta": "°C in Paris."},
    {"type": "text-end", "id": "t1"},
    {
        "type": "source-url",
        "sourceId": "src-1",
        "url": "https://weather.example/paris",
        "title": "Paris weather",
    },
]

REPLY_PARTS: list[dict[str, Any]] = [
    {"type": "step-start"},
    {"type": "reasoning", "id": "r1", "text": "Let me check.", "state": "done"},
    {
        "type": "tool-weather",
        "toolCallId": "call-1",
        "state": "output-available",
        "input": {"city": "Paris"},
        "output": {"celsius": 21},
    },
    {"type": "step-start"},
    {"type": "text", "text": "It is 21 °C in Paris.", "state": "done"},
    {
        "type": "source-url",
        "sourceId": "src-1",
        "url": "https://weather.example/paris",
        "title": "Paris weather",
    },
]


def test_a_reply_of_every_kind_completes_with_its_parts_and_their_text() -> None:
    streams = with_parts("c")
    first = applied(streams.receive(chunk(**REPLY[0]), now=1.0))
    assert (first.opened, first.text, first.delta, first.parts) == (True, None, None, None)
    for fields in REPLY[1:]:
        step = applied(streams.receive(chunk(**fields)))
        assert (step.opened, step.text, step.delta, step.parts) == (False, None, None, None)
    assert streams.partial("m") is None  # delivered whole
    done = applied(streams.receive(ProducerEvent(id="m", final=True)))
    assert done.first_completion
    assert done.text == "It is 21 °C in Paris."
    assert done.parts == REPLY_PARTS
    assert streams.phase("m") is Phase.COMPLETED
    assert streams.completed("m") == ("It is 21 °C in Paris.", REPLY_PARTS)


def test_the_fast_decoder_and_the_models_build_the_same_parts() -> None:
    raw = b'[{"id":"m","chunk":{"type":"text-start","id":"a"}},' + (
        b'{"id":"m","chunk":{"type":"text-delta","id":"a","delta":"hi"},"final":true}]'
    )
    fast, models = with_parts("c"), with_parts("c")
    events = decode_events(raw)
    assert isinstance(events, list)
    results = [fast.receive(event) for event in events]
    expected = [
        models.receive(ProducerEvent(id="m", chunk={"type": "text-start", "id": "a"})),
        models.receive(
            ProducerEvent(
                id="m", chunk={"type": "text-delta", "id": "a", "delta": "hi"}, final=True
            )
        ),
    ]
    assert results == expected
    assert applied(results[1]).parts == [{"type": "text", "text": "hi", "state": "done"}]


def test_the_text_before_the_first_chunk_is_the_implicit_text_part_where_it_began() -> None:
    streams = with_parts("c")
    assert applied(streams.receive(ProducerEvent(id="m", delta="Hel"))).delta == "Hel"
    assert streams.partial("m") == "Hel"
    turned = applied(streams.receive(chunk(type="reasoning-start", id="r")))
    assert (turned.delta, turned.opened) == (None, False)
    assert streams.partial("m") is None
    streams.receive(chunk(type="reasoning-delta", id="r", delta="hmm"))
    # Later top-level deltas extend the implicit part, and are no longer sent as deltas.
    later = applied(streams.receive(ProducerEvent(id="m", delta="lo")))
    assert later.delta is None
    done = applied(streams.receive(ProducerEvent(id="m", delta="!", final=True)))
    assert done.text == "Hello!"
    assert done.parts == [
        {"type": "text", "text": "Hello!", "state": "done"},
        {"type": "reasoning", "id": "r", "text": "hmm", "state": "done"},
    ]


def test_an_empty_delta_counts_and_no_delta_makes_no_text_part() -> None:
    streams = with_parts("c")
    streams.receive(ProducerEvent(id="empty", delta=""))
    streams.receive(chunk("empty", type="start-step"))
    streams.receive(ProducerEvent(id="none", meta={"model": "m1"}))
    streams.receive(chunk("none", type="start-step"))
    empty = applied(streams.receive(ProducerEvent(id="empty", final=True)))
    none = applied(streams.receive(ProducerEvent(id="none", final=True)))
    assert empty.parts == [{"type": "text", "text": "", "state": "done"}, {"type": "step-start"}]
    assert (none.parts, none.text, none.meta) == ([{"type": "step-start"}], "", {"model": "m1"})


def test_a_surrogate_pair_split_across_the_turn_is_joined() -> None:
    streams = with_parts("c")
    streams.receive(ProducerEvent(id="m", delta="a\ud83d"))
    streams.receive(chunk(type="start-step"))
    done = applied(streams.receive(ProducerEvent(id="m", delta="\ude00b", final=True)))
    assert done.text == "a\U0001f600b"
    assert done.parts == [
        {"type": "text", "text": "a\U0001f600b", "state": "done"},
        {"type": "step-start"},
    ]


def test_a_one_shot_structured_message_opens_and_completes_in_one_event() -> None:
    streams = with_parts("c")
    one = applied(
        streams.receive(
            ProducerEvent(id="m", chunk={"type": "text-start", "id": "t"}, final=True), now=2.0
        )
    )
    assert (one.opened, one.first_completion, one.delta, one.text) == (True, True, None, "")
    assert one.parts == [{"type": "text", "text": "", "state": "done"}]
    assert streams.streaming_count == 0


def test_repeated_finals_are_acked_with_the_same_parts_and_later_chunks_are_ignored() -> None:
    streams = with_parts("c")
    for fields in REPLY:
        streams.receive(chunk(**fields))
    first = applied(streams.receive(ProducerEvent(id="m", final=True)))
    ignored = applied(streams.receive(chunk(type="text-start", id="late")))
    again = applied(streams.receive(ProducerEvent(id="m", delta="more", final=True)))
    assert (ignored.text, ignored.parts) == (None, None)
    assert (again.first_completion, again.text, again.parts) == (False, first.text, REPLY_PARTS)
    assert again.parts is not first.parts  # a copy each time


def test_numbered_chunks_are_applied_once_and_a_refused_one_keeps_the_seq() -> None:
    streams = with_parts("c")
    streams.receive(ProducerEvent(id="m", seq=1, chunk={"type": "text-start", "id": "t"}))
    delta = {"type": "text-delta", "id": "t", "delta": "ab"}
    streams.receive(ProducerEvent(id="m", seq=2, chunk=delta))
    duplicate = applied(streams.receive(ProducerEvent(id="m", seq=2, chunk=delta)))
    assert duplicate.duplicate
    with pytest.raises(FrameRejected) as gap:
        streams.receive(ProducerEvent(id="m", seq=4, chunk=delta))
    assert (gap.value.code, gap.value.expected) == (ErrorCode.SEQ_GAP, 3)
    bad = {"type": "text-delta", "id": "nope", "delta": "x"}
    with pytest.raises(FrameRejected) as refused:
        streams.receive(ProducerEvent(id="m", seq=3, chunk=bad))
    assert refused.value.code is ErrorCode.UNKNOWN_PART
    assert streams.next_seq("m") == 3
    done = applied(streams.receive(ProducerEvent(id="m", seq=3, final=True)))
    assert done.parts == [{"type": "text", "text": "ab", "state": "done"}]
    repeated = applied(streams.receive(ProducerEvent(id="m", seq=3, final=True)))
    assert (repeated.duplicate, repeated.parts) == (True, done.parts)


REFUSALS: list[tuple[list[dict[str, Any]], dict[str, Any], ErrorCode]] = [
    ([], {"type": "finish"}, ErrorCode.INVALID_CHUNK),
    ([], {"type": "no-such-chunk"}, ErrorCode.INVALID_CHUNK),
    ([], {"type": "text-delta", "id": "t", "delta": "x"}, ErrorCode.UNKNOWN_PART),
    (
        [{"type": "text-start", "id": "t"}, {"type": "text-end", "id": "t"}],
        {"type": "text-delta", "id": "t", "delta": "x"},
        ErrorCode.PART_ENDED,
    ),
    ([{"type": "text-start", "id": "t"}], {"type": "text-start", "id": "t"}, ErrorCode.PART_EXISTS),
    ([{"type": "start-step"}] * 2, {"type": "start-step"}, ErrorCode.TOO_MANY_PARTS),
    (
        [{"type": "text-start", "id": "t"}],
        {"type": "text-delta", "id": "t", "delta": "x" * 9},
        ErrorCode.PART_TOO_LARGE,
    ),
]


@pytest.mark.parametrize(("before", "refused", "code"), REFUSALS)
def test_a_refused_chunk_gets_its_code_and_changes_nothing(
    before: list[dict[str, Any]], refused: dict[str, Any], code: ErrorCode
) -> None:
    streams = with_parts("c", part_limits=PartLimits(max_parts=2, max_part_chars=8))
    for fields in before:
        streams.receive(chunk(**fields))
    held = streams.held_chars()
    with pytest.raises(FrameRejected) as rejected:
        streams.receive(ProducerEvent(id="m", seq=1, chunk=refused))
    assert (rejected.value.code, rejected.value.message_id) == (code, "m")
    assert streams.held_chars() == held
    if before:
        assert streams.next_seq("m") is None  # seq 1 was not taken: still unnumbered
        done = applied(streams.receive(ProducerEvent(id="m", final=True)))
        again = with_parts("c", part_limits=PartLimits(max_parts=2, max_part_chars=8))
        for fields in before:
            again.receive(chunk(**fields))
        assert done.parts == applied(again.receive(ProducerEvent(id="m", final=True))).parts
    else:
        assert streams.phase("m") is None  # a refused first event opens nothing


def test_a_refused_first_chunk_of_a_plain_message_leaves_it_plain() -> None:
    streams = with_parts("c")
    streams.receive(ProducerEvent(id="m", delta="Hi"))
    with pytest.raises(FrameRejected) as rejected:
        streams.receive(chunk(type="text-end", id="x"))
    assert rejected.value.code is ErrorCode.UNKNOWN_PART
    assert streams.partial("m") == "Hi"
    done = applied(streams.receive(ProducerEvent(id="m", delta="!", final=True)))
    assert (done.text, done.parts, done.delta) == ("Hi!", None, "!")


def test_delta_and_chunk_in_one_event_are_refused() -> None:
    streams = with_parts("c")
    both = ProducerEvent(id="m", delta="x", chunk={"type": "start-step"})
    with pytest.raises(FrameRejected) as rejected:
        streams.receive(both)
    assert rejected.value.code is ErrorCode.INVALID_EVENT
    assert "not both" in rejected.value.message
    assert streams.phase("m") is None
    streams.receive(chunk(type="start-step"))
    with pytest.raises(FrameRejected):
        streams.receive(both)
    assert applied(streams.receive(ProducerEvent(id="m", final=True))).parts == [
        {"type": "step-start"}
    ]


def test_an_error_in_one_message_leaves_another_alone() -> None:
    streams = with_parts("c")
    streams.receive(ProducerEvent(id="plain", delta="one"))
    streams.receive(chunk("parts", type="text-start", id="t"))
    with pytest.raises(FrameRejected):
        streams.receive(chunk("parts", type="text-start", id="t"))
    assert applied(streams.receive(ProducerEvent(id="plain", final=True))).text == "one"
    assert applied(streams.receive(ProducerEvent(id="parts", final=True))).parts == [
        {"type": "text", "text": "", "state": "done"}
    ]


def test_max_chars_counts_the_parts_and_a_delta_past_it_aborts_without_it() -> None:
    streams = with_parts("c", max_chars=10)
    streams.receive(chunk(type="text-start", id="t"))
    streams.receive(chunk(type="text-delta", id="t", delta="12345678"))
    assert streams.held_chars() == len("t") + 8  # its id, and its text
    over = streams.receive(chunk(type="text-delta", id="t", delta="abc"))
    assert isinstance(over, Overflow)
    assert over.rejection.code is ErrorCode.MESSAGE_TOO_LARGE
    assert over.unfinished == Unfinished(
        "c", "m", "12345678", None, [{"type": "text", "text": "12345678", "state": "streaming"}]
    )
    assert streams.phase("m") is Phase.ABORTED
    # A top-level delta counts the same way.
    streams.receive(chunk("n", type="start-step"))
    streams.receive(ProducerEvent(id="n", delta="x" * 10))
    assert isinstance(streams.receive(ProducerEvent(id="n", delta="y")), Overflow)
    # A new message whose first chunk is too large is refused, nothing applied.
    with pytest.raises(FrameRejected) as refused:
        streams.receive(ProducerEvent(id="o", delta="x" * 11))
    with pytest.raises(FrameRejected) as refused_parts:
        streams.receive(
            ProducerEvent(id="p", chunk={"type": "data-big", "data": "x" * 20}, final=True)
        )
    assert refused.value.code is refused_parts.value.code is ErrorCode.MESSAGE_TOO_LARGE
    assert streams.phase("p") is None


def test_an_unfinished_structured_message_ends_with_its_parts_as_they_were() -> None:
    streams = with_parts("c")
    streams.receive(ProducerEvent(id="m", delta="Hi", meta={"model": "m1"}), now=1.0)
    streams.receive(chunk(type="tool-input-start", toolCallId="c1", toolName="search"), now=1.0)
    streams.receive(
        chunk(type="tool-input-delta", toolCallId="c1", inputTextDelta='{"q":"re'), now=1.0
    )
    streams.receive(ProducerEvent(id="idle", chunk={"type": "start-step"}), now=0.0)
    [expired] = streams.expire(deadline=0.5)
    assert expired == Unfinished("c", "idle", "", None, [{"type": "step-start"}])
    [closed] = streams.close()
    assert closed == Unfinished(
        "c",
        "m",
        "Hi",
        {"model": "m1"},
        [
            {"type": "text", "text": "Hi", "state": "streaming"},
            {
                "type": "tool-search",
                "toolCallId": "c1",
                "state": "input-streaming",
                "input": {"q": "re"},
                "rawInput": '{"q":"re',
            },
        ],
    )


def test_completed_parts_are_counted_and_freed_with_their_id() -> None:
    streams = with_parts("c", max_completed=1)
    streams.receive(chunk("a", type="text-start", id="t"))
    streams.receive(chunk("a", type="text-delta", id="t", delta="abcd"))
    assert (streams.held_chars(), streams.completed_chars) == (5, 0)  # "t" and "abcd"
    streams.receive(ProducerEvent(id="a", final=True))
    assert (streams.held_chars(), streams.completed_chars) == (0, 5)
    streams.receive(ProducerEvent(id="b", delta="xy", final=True))  # evicts a
    assert streams.completed_chars == 2
    assert streams.completed("a") is None
    assert streams.completed("b") == ("xy", None)
    streams.receive(ProducerEvent(id="c", chunk={"type": "start-step"}, final=True))
    streams.receive(chunk("d", type="text-start", id="t"))
    streams.receive(chunk("d", type="text-delta", id="t", delta="abc"))
    streams.receive(ProducerEvent(id="d", final=True))
    assert streams.completed_chars == 4  # "t" and "abc"
    streams.refuse("d")
    assert streams.completed_chars == 0


def test_a_plain_message_frame_has_no_parts_key_and_a_structured_one_has_them() -> None:
    assert message_body("c", "m", "hi") == '{"type":"message","channel":"c","id":"m","text":"hi"}'
    parts = [{"type": "text", "text": "hi", "state": "done"}]
    assert message_body("c", "m", "hi", parts=parts) == (
        '{"type":"message","channel":"c","id":"m","text":"hi",'
        '"parts":[{"type":"text","text":"hi","state":"done"}]}'
    )


# ------------------------------------------------------------ live chunks


def _live(streams: MessageStreams, event: dict[str, Any]) -> list[dict[str, Any]] | None:
    applied = streams.receive(ProducerEvent.model_validate({"id": "m", **event}))
    assert isinstance(applied, Applied)
    assert applied.delta is None or not applied.chunks
    return None if applied.chunks is None else list(applied.chunks)


START = {"type": "text-start", "id": "text"}


def test_live_chunks_of_a_structured_message_event_by_event() -> None:
    streams = MessageStreams("c")
    assert _live(streams, {"delta": "Hi"}) is None  # plain: a delta frame, no chunks
    step = {"type": "start-step"}
    assert _live(streams, {"chunk": step}) == [step]  # its text so far: held already
    assert _live(streams, {"delta": " there"}) == [
        {"type": "text-delta", "id": "text", "delta": " there"}
    ]
    assert _live(streams, {"delta": ""}) is None  # changes nothing a subscriber sees
    assert _live(streams, {"chunk": {"type": "text-end", "id": "text"}}) == [
        {"type": "text-end", "id": "text"}
    ]
    transient = {"type": "data-progress", "data": 1, "transient": True}
    assert _live(streams, {"chunk": transient}) == [transient]  # live only
    assert _live(streams, {"meta": {"k": 1}}) is None
    assert _live(streams, {"chunk": {"type": "finish-step"}, "final": True}) is None
    assert streams.live_parts("m") is None  # completed


def test_a_top_level_delta_that_opens_the_implicit_part_starts_it_first() -> None:
    streams = MessageStreams("c")
    assert _live(streams, {"chunk": {"type": "start-step"}}) == [{"type": "start-step"}]
    assert _live(streams, {"delta": ""}) == [START]  # an empty delta counts: it opens it
    streams = MessageStreams("c")
    _live(streams, {"chunk": {"type": "start-step"}})
    assert _live(streams, {"delta": "a"}) == [
        START,
        {"type": "text-delta", "id": "text", "delta": "a"},
    ]


def test_the_turn_sends_what_deltas_subscribers_lack_of_the_implicit_part() -> None:
    step = {"type": "start-step"}
    # Only empty deltas before: they opened the part, and no delta frame said so.
    streams = MessageStreams("c")
    _live(streams, {"delta": ""})
    assert _live(streams, {"chunk": step}) == [START, step]
    # Half a pair held: it goes now, as the part holds it.
    streams = MessageStreams("c")
    assert _live(streams, {"delta": "a\ud83d"}) is None
    assert _live(streams, {"chunk": step}) == [
        {"type": "text-delta", "id": "text", "delta": "\ud83d"},
        step,
    ]
    streams = MessageStreams("c")
    _live(streams, {"delta": "\ud83d"})
    assert _live(streams, {"chunk": step}) == [
        START,
        {"type": "text-delta", "id": "text", "delta": "\ud83d"},
        step,
    ]
    # No delta before: no implicit part at all.
    streams = MessageStreams("c")
    assert _live(streams, {"chunk": step}) == [step]


def test_live_parts_is_the_compacted_catch_up_of_a_structured_message_only() -> None:
    streams = MessageStreams("c")
    _live(streams, {"delta": "Hi"})
    assert streams.live_parts("m") is None and streams.partial("m") == "Hi"
    _live(streams, {"chunk": {"type": "reasoning-start", "id": "r"}})
    _live(streams, {"chunk": {"type": "reasoning-delta", "id": "r", "delta": "so"}})
    assert streams.partial("m") is None
    assert streams.live_parts("m") == (
        "Hi",
        [
            START,
            {"type": "text-delta", "id": "text", "delta": "Hi"},
            {"type": "reasoning-start", "id": "r"},
            {"type": "reasoning-delta", "id": "r", "delta": "so"},
        ],
    )
