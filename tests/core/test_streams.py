"""Tests for token_relay.core.streams: channels, limits and LRU on top of the assembler."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

import pytest
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.protocol import ProducerEvent, decode_producer_event
from token_relay.core.streams import (
    TRANSITIONS,
    Applied,
    MessageStreams,
    Overflow,
    Phase,
    Unfinished,
)


def _rejected(session: MessageStreams, event: ProducerEvent, now: float = 0.0) -> FrameRejected:
    with pytest.raises(FrameRejected) as info:
        session.receive(event, now)
    return info.value


# ------------------------------------------------------------------------ channels


def test_default_channel_is_used() -> None:
    session = MessageStreams("room")
    assert session.receive(ProducerEvent(id="m", delta="hi"), now=1.0) == Applied(
        "room", "m", None, delta="hi", opened=True, delta_wait=0.0, first_delta=True
    )
    assert session.receive(ProducerEvent(id="m", final=True), now=2.0) == Applied(
        "room", "m", "hi", True
    )


def test_event_channel_overrides_default() -> None:
    session = MessageStreams("room")
    applied = session.receive(
        ProducerEvent(id="m", delta="x", final=True, channel="other"), now=1.0
    )
    assert applied == Applied(
        "other", "m", "x", True, delta="x", opened=True, delta_wait=0.0, first_delta=True
    )


def test_event_channel_without_default() -> None:
    session = MessageStreams()
    assert session.receive(decode_producer_event('{"id": "m", "channel": "c"}')) == Applied(
        "c", "m", None, opened=True
    )


def test_naming_the_default_channel_explicitly_is_not_a_mismatch() -> None:
    session = MessageStreams("room")
    session.receive(ProducerEvent(id="m", delta="a"), now=1.0)
    applied = session.receive(ProducerEvent(id="m", delta="b", final=True, channel="room"), now=3.5)
    assert applied == Applied("room", "m", "ab", True, delta="b", delta_wait=2.5)


def test_channel_required_when_neither() -> None:
    session = MessageStreams()
    rejected = _rejected(session, ProducerEvent(id="m", delta="lost"))
    assert rejected.code is ErrorCode.CHANNEL_REQUIRED
    assert rejected.message_id == "m"
    assert session.streaming_count == 0
    assert session.assembler.get("m") is None
    applied = session.receive(ProducerEvent(id="m", delta="kept", final=True, channel="c"), now=1.0)
    assert applied == Applied(
        "c", "m", "kept", True, delta="kept", opened=True, delta_wait=0.0, first_delta=True
    )


def test_channel_mismatch_on_streaming_id() -> None:
    session = MessageStreams()
    session.receive(ProducerEvent(id="m", delta="a", channel="c1"), now=1.0)
    rejected = _rejected(
        session, ProducerEvent(id="m", delta="X", final=True, channel="c2"), now=2.0
    )
    assert rejected.code is ErrorCode.CHANNEL_MISMATCH
    assert rejected.message == "message 'm' belongs to channel 'c1', not 'c2'"
    assert rejected.message_id == "m"
    assert session.assembler.get("m") == "a"
    assert session.streaming_count == 1
    assert session.completed_count == 0
    # The rejected delta did not count: the wait runs from the first delta.
    applied = session.receive(ProducerEvent(id="m", delta="b", final=True, channel="c1"), now=4.0)
    assert applied == Applied("c1", "m", "ab", True, delta="b", delta_wait=3.0)


def test_channel_mismatch_against_default_channel() -> None:
    session = MessageStreams("room")
    session.receive(ProducerEvent(id="m", delta="a"))
    rejected = _rejected(session, ProducerEvent(id="m", delta="X", channel="other"))
    assert rejected.code is ErrorCode.CHANNEL_MISMATCH
    assert session.receive(ProducerEvent(id="m", final=True)) == Applied("room", "m", "a", True)


def test_channel_mismatch_on_completed_id() -> None:
    session = MessageStreams()
    session.receive(ProducerEvent(id="m", delta="done", final=True, channel="c1"))
    rejected = _rejected(session, ProducerEvent(id="m", final=True, channel="c2"))
    assert rejected.code is ErrorCode.CHANNEL_MISMATCH
    assert rejected.message_id == "m"
    rejected = _rejected(session, ProducerEvent(id="m", delta="X", channel="c2"))
    assert rejected.code is ErrorCode.CHANNEL_MISMATCH
    assert session.assembler.get("m") == "done"
    assert session.completed_count == 1
    assert session.streaming_count == 0
    applied = session.receive(ProducerEvent(id="m", delta="ignored", final=True, channel="c1"))
    assert applied == Applied("c1", "m", "done", False)


# ------------------------------------------------------------------- completion


def test_first_completion_true_only_once() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="hel"), now=1.0)
    first = session.receive(ProducerEvent(id="m", delta="lo", final=True), now=1.25)
    second = session.receive(ProducerEvent(id="m", delta="ignored", final=True), now=2.0)
    third = session.receive(ProducerEvent(id="m", final=True), now=3.0)
    assert first == Applied("c", "m", "hello", True, delta="lo", delta_wait=0.25)
    assert second == Applied("c", "m", "hello", False)
    assert third == Applied("c", "m", "hello", False)


def test_non_final_after_completion_changes_nothing() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="done", final=True))
    assert session.receive(ProducerEvent(id="m", delta="more")) == Applied("c", "m", None, False)
    assert session.assembler.get("m") == "done"
    assert session.streaming_count == 0
    assert session.completed_count == 1


def test_final_of_unseen_id_completes_empty() -> None:
    session = MessageStreams("c")
    assert session.receive(ProducerEvent(id="m", final=True)) == Applied(
        "c", "m", "", True, opened=True
    )
    assert session.receive(ProducerEvent(id="m", final=True)) == Applied("c", "m", "", False)


def test_empty_deltas_kept() -> None:
    session = MessageStreams("c")
    first = session.receive(decode_producer_event('{"id": "m", "delta": ""}'))
    assert first == Applied("c", "m", None, delta="", opened=True)
    assert session.streaming_count == 1
    session.receive(decode_producer_event('{"id": "m", "delta": "a"}'))
    applied = session.receive(decode_producer_event('{"id": "m", "delta": "", "final": true}'))
    assert applied == Applied("c", "m", "a", True, delta="")


def test_interleaved_messages_on_different_channels() -> None:
    session = MessageStreams("default")
    session.receive(ProducerEvent(id="a", delta="A1", channel="x"))
    session.receive(ProducerEvent(id="b", delta="B1"))
    session.receive(ProducerEvent(id="a", delta="A2", channel="x"))
    assert session.receive(ProducerEvent(id="b", final=True)) == Applied("default", "b", "B1", True)
    assert session.receive(ProducerEvent(id="a", final=True, channel="x")) == Applied(
        "x", "a", "A1A2", True
    )


# ------------------------------------------------------------------------- limits


def test_too_many_messages_at_max_streaming() -> None:
    session = MessageStreams("c", max_streaming=2)
    session.receive(ProducerEvent(id="a", delta="1"), now=1.0)
    session.receive(ProducerEvent(id="b", delta="2"), now=2.0)
    rejected = _rejected(session, ProducerEvent(id="c", delta="3"), now=3.0)
    assert rejected.code is ErrorCode.TOO_MANY_MESSAGES
    assert rejected.message_id == "c"
    assert session.streaming_count == 2
    assert session.assembler.get("c") is None
    # Existing messages still take deltas at the limit.
    assert session.receive(ProducerEvent(id="a", delta="x"), now=4.0) == Applied(
        "c", "a", None, delta="x", delta_wait=3.0
    )
    assert session.assembler.get("a") == "1x"


def test_finished_message_frees_a_slot() -> None:
    session = MessageStreams("c", max_streaming=1)
    session.receive(ProducerEvent(id="a", delta="1"))
    with pytest.raises(FrameRejected):
        session.receive(ProducerEvent(id="b", delta="2"))
    session.receive(ProducerEvent(id="a", final=True))
    assert session.streaming_count == 0
    assert session.receive(ProducerEvent(id="b", delta="2"), now=5.0) == Applied(
        "c", "b", None, delta="2", opened=True, delta_wait=0.0, first_delta=True
    )
    assert session.streaming_count == 1


def test_one_shot_final_passes_at_the_streaming_limit() -> None:
    session = MessageStreams("c", max_streaming=1)
    session.receive(ProducerEvent(id="open", delta="o"), now=1.0)
    assert session.receive(ProducerEvent(id="once", delta="whole", final=True), now=2.0) == Applied(
        "c", "once", "whole", True, delta="whole", opened=True, delta_wait=0.0, first_delta=True
    )
    assert session.streaming_count == 1


def test_events_for_completed_ids_are_accepted_at_the_streaming_limit() -> None:
    session = MessageStreams("c", max_streaming=1)
    session.receive(ProducerEvent(id="done", delta="d", final=True))
    session.receive(ProducerEvent(id="open", delta="o"))
    assert session.receive(ProducerEvent(id="done", final=True)) == Applied("c", "done", "d", False)


def test_max_completed_evicts_least_recently_used() -> None:
    session = MessageStreams("c", max_completed=2)
    session.receive(ProducerEvent(id="a", delta="A", final=True))
    session.receive(ProducerEvent(id="b", delta="B", final=True))
    session.receive(ProducerEvent(id="c", delta="C", final=True))
    assert session.completed_count == 2
    assert session.assembler.get("a") is None
    assert session.assembler.get("b") == "B"
    assert session.assembler.get("c") == "C"
    # The evicted id is unknown again: an event for it starts a new message.
    assert session.receive(ProducerEvent(id="a", delta="new"), now=1.0) == Applied(
        "c", "a", None, delta="new", opened=True, delta_wait=0.0, first_delta=True
    )
    assert session.streaming_count == 1
    assert session.receive(ProducerEvent(id="a", final=True)) == Applied("c", "a", "new", True)


def test_evicted_id_may_start_on_another_channel() -> None:
    session = MessageStreams(max_completed=1)
    session.receive(ProducerEvent(id="a", delta="A", final=True, channel="c1"))
    session.receive(ProducerEvent(id="b", delta="B", final=True, channel="c1"))
    applied = session.receive(ProducerEvent(id="a", delta="x", final=True, channel="c2"), now=1.0)
    assert applied == Applied(
        "c2", "a", "x", True, delta="x", opened=True, delta_wait=0.0, first_delta=True
    )


def test_repeated_final_refreshes_lru_position() -> None:
    session = MessageStreams("c", max_completed=2)
    session.receive(ProducerEvent(id="a", delta="A", final=True))
    session.receive(ProducerEvent(id="b", delta="B", final=True))
    assert session.receive(ProducerEvent(id="a", final=True)) == Applied("c", "a", "A", False)
    session.receive(ProducerEvent(id="c", delta="C", final=True))
    assert session.completed_count == 2
    assert session.assembler.get("a") == "A"
    assert session.assembler.get("b") is None
    assert session.receive(ProducerEvent(id="a", final=True)) == Applied("c", "a", "A", False)
    assert session.receive(ProducerEvent(id="b", final=True)) == Applied(
        "c", "b", "", True, opened=True
    )


def test_non_final_event_does_not_refresh_lru_position() -> None:
    session = MessageStreams("c", max_completed=2)
    session.receive(ProducerEvent(id="a", delta="A", final=True))
    session.receive(ProducerEvent(id="b", delta="B", final=True))
    session.receive(ProducerEvent(id="a", delta="ignored"))
    session.receive(ProducerEvent(id="c", delta="C", final=True))
    assert session.assembler.get("a") is None
    assert session.assembler.get("b") == "B"


def test_limits_below_one_are_refused() -> None:
    with pytest.raises(ValueError):
        MessageStreams("c", max_streaming=0)
    with pytest.raises(ValueError):
        MessageStreams("c", max_completed=0)
    with pytest.raises(ValueError):
        MessageStreams("c", max_chars=0)


# -------------------------------------------------------------------------- close


def test_close_returns_unfinished_and_frees_state() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="a", delta="par"))
    session.receive(ProducerEvent(id="b", channel="other"))
    session.receive(ProducerEvent(id="done", delta="D", final=True))
    session.receive(ProducerEvent(id="a", delta="tial"))
    assert session.close() == [Unfinished("c", "a", "partial"), Unfinished("other", "b", "")]
    assert session.streaming_count == 0
    assert session.completed_count == 0
    assert session.assembler.get("a") is None
    assert session.assembler.get("done") is None
    assert session.close() == []


def test_close_then_ids_start_afresh() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="a", delta="old", final=True))
    session.receive(ProducerEvent(id="b", delta="old"))
    session.close()
    assert session.receive(ProducerEvent(id="a", delta="new", final=True), now=1.0) == Applied(
        "c", "a", "new", True, delta="new", opened=True, delta_wait=0.0, first_delta=True
    )
    assert session.receive(ProducerEvent(id="b", delta="new", final=True), now=2.0) == Applied(
        "c", "b", "new", True, delta="new", opened=True, delta_wait=0.0, first_delta=True
    )


def test_two_sessions_with_same_id_do_not_mix() -> None:
    first = MessageStreams("c")
    second = MessageStreams("c")
    first.receive(ProducerEvent(id="m", delta="one"))
    second.receive(ProducerEvent(id="m", delta="two"))
    first.receive(ProducerEvent(id="m", delta="1"))
    assert second.receive(ProducerEvent(id="m", final=True)) == Applied("c", "m", "two", True)
    assert first.streaming_count == 1
    assert first.receive(ProducerEvent(id="m", final=True)) == Applied("c", "m", "one1", True)


# -------------------------------------------------------------- delta and opened


def test_delta_reports_each_appended_delta() -> None:
    session = MessageStreams("c")
    assert session.receive(ProducerEvent(id="m", delta="he"), now=1.0) == Applied(
        "c", "m", None, delta="he", opened=True, delta_wait=0.0, first_delta=True
    )
    assert session.receive(ProducerEvent(id="m", delta=""), now=2.0) == Applied(
        "c", "m", None, delta=""
    )
    assert session.receive(ProducerEvent(id="m", delta="llo"), now=3.5) == Applied(
        "c", "m", None, delta="llo", delta_wait=2.5
    )
    assert session.receive(ProducerEvent(id="m", delta="!", final=True), now=4.0) == Applied(
        "c", "m", "hello!", True, delta="!", delta_wait=0.5
    )


def test_delta_is_none_without_a_delta_key() -> None:
    session = MessageStreams("c")
    opened = session.receive(ProducerEvent(id="m"))
    assert opened == Applied("c", "m", None, opened=True)
    assert opened.delta is None
    session.receive(ProducerEvent(id="m", delta="x"))
    keepalive = session.receive(ProducerEvent(id="m"))
    assert keepalive == Applied("c", "m", None)
    assert keepalive.delta is None
    assert session.partial("m") == "x"


def test_delta_is_none_for_events_on_completed_ids() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="done", final=True))
    late = session.receive(ProducerEvent(id="m", delta="late"))
    assert late == Applied("c", "m", None)
    assert late.delta is None
    again = session.receive(ProducerEvent(id="m", delta="again", final=True))
    assert again == Applied("c", "m", "done")
    assert again.delta is None
    empty = session.receive(ProducerEvent(id="m", delta=""))
    assert empty.delta is None
    assert session.assembler.get("m") == "done"


def test_opened_only_on_first_event() -> None:
    session = MessageStreams("c")
    results = [
        session.receive(ProducerEvent(id="m", delta="a")),
        session.receive(ProducerEvent(id="m", delta="b")),
        session.receive(ProducerEvent(id="m", final=True)),
        session.receive(ProducerEvent(id="m", final=True)),
        session.receive(ProducerEvent(id="m", delta="z")),
    ]
    assert [applied.opened for applied in results] == [True, False, False, False, False]


def test_opened_true_for_a_one_shot_final() -> None:
    session = MessageStreams("c")
    once = session.receive(ProducerEvent(id="m", delta="all", final=True), now=1.0)
    assert once == Applied(
        "c", "m", "all", True, delta="all", opened=True, delta_wait=0.0, first_delta=True
    )
    repeat = session.receive(ProducerEvent(id="m", final=True))
    assert repeat == Applied("c", "m", "all")
    assert repeat.opened is False


def test_opened_is_per_id() -> None:
    session = MessageStreams("c")
    assert session.receive(ProducerEvent(id="a", delta="1")).opened is True
    assert session.receive(ProducerEvent(id="b", delta="2")).opened is True
    assert session.receive(ProducerEvent(id="a", delta="3")).opened is False


# ------------------------------------------------------------ partial, channel_of


def test_partial_of_unfinished_message() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="par"))
    assert session.partial("m") == "par"
    session.receive(ProducerEvent(id="m", delta="tial"))
    assert session.partial("m") == "partial"


def test_partial_of_opened_message_without_delta_is_empty() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m"))
    assert session.partial("m") == ""


def test_partial_is_none_for_unknown_and_completed_ids() -> None:
    session = MessageStreams("c")
    assert session.partial("unseen") is None
    session.receive(ProducerEvent(id="m", delta="done", final=True))
    assert session.partial("m") is None
    assert session.assembler.get("m") == "done"


def test_channel_of_unfinished_message() -> None:
    session = MessageStreams("room")
    session.receive(ProducerEvent(id="a", delta="1"))
    session.receive(ProducerEvent(id="b", delta="2", channel="other"))
    assert session.channel_of("a") == "room"
    assert session.channel_of("b") == "other"


def test_channel_of_is_none_for_unknown_and_completed_ids() -> None:
    session = MessageStreams("room")
    assert session.channel_of("unseen") is None
    session.receive(ProducerEvent(id="m", delta="x"))
    session.receive(ProducerEvent(id="m", final=True))
    assert session.channel_of("m") is None


def test_partial_and_channel_of_are_none_after_abort() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="x"), now=1.0)
    session.expire(2.0)
    assert session.partial("m") is None
    assert session.channel_of("m") is None


# ------------------------------------------------------------------------ abort


def test_abort_ends_a_message_in_progress_at_its_producers_word() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="so far", meta={"model": "x"}), now=1.0)
    assert session.abort("m") == Unfinished("c", "m", "so far", {"model": "x"})
    assert session.phase("m") is Phase.ABORTED
    assert _rejected(session, ProducerEvent(id="m", delta="late")).code is ErrorCode.MESSAGE_ABORTED
    # Not in progress (ended, or unknown): nothing, and nothing changes.
    assert session.abort("m") is None
    session.receive(ProducerEvent(id="done", delta="x", final=True))
    assert session.abort("done") is None and session.phase("done") is Phase.COMPLETED
    assert session.abort("never") is None and session.phase("never") is None


def test_abort_keeps_a_structured_messages_parts_as_they_were() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", chunk={"type": "text-start", "id": "t"}))
    session.receive(ProducerEvent(id="m", chunk={"type": "text-delta", "id": "t", "delta": "Hi"}))
    assert session.abort("m") == Unfinished(
        "c", "m", "Hi", None, [{"type": "text", "text": "Hi", "state": "streaming"}]
    )


def test_an_abort_event_ends_its_message_with_its_meta_merged() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="so far", meta={"model": "x", "n": 1}), now=1.0)
    event = ProducerEvent(id="m", abort="cancelled", meta={"n": 2}, seq=2, channel="c")
    assert session.cancel(event) == Unfinished("c", "m", "so far", {"model": "x", "n": 2})
    assert session.phase("m") is Phase.ABORTED
    assert _rejected(session, ProducerEvent(id="m", delta="late")).code is ErrorCode.MESSAGE_ABORTED
    # Not in progress: nothing, and nothing changes (an abort starts no message).
    assert session.cancel(event) is None
    assert session.cancel(ProducerEvent(id="never", abort="error")) is None
    assert session.phase("never") is None


@pytest.mark.parametrize(
    "extra", [{"delta": "x"}, {"chunk": {"type": "text-start", "id": "t"}}, {"final": True}]
)
def test_an_abort_event_carrying_more_is_refused_and_changes_nothing(
    extra: dict[str, object],
) -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="so far"))
    with pytest.raises(FrameRejected) as info:
        session.cancel(ProducerEvent.model_validate({"id": "m", "abort": "cancelled", **extra}))
    assert info.value.code is ErrorCode.INVALID_EVENT
    assert session.phase("m") is Phase.STREAMING and session.partial("m") == "so far"


def test_an_abort_event_naming_another_channel_is_refused() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="so far"))
    with pytest.raises(FrameRejected) as info:
        session.cancel(ProducerEvent(id="m", abort="cancelled", channel="other"))
    assert info.value.code is ErrorCode.CHANNEL_MISMATCH
    assert session.phase("m") is Phase.STREAMING


# ------------------------------------------------------------------------ expire


def test_expire_aborts_only_messages_idle_before_the_deadline() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="old", delta="o"), now=1.0)
    session.receive(ProducerEvent(id="fresh", delta="f", channel="x"), now=5.0)
    assert session.expire(3.0) == [Unfinished("c", "old", "o")]
    assert session.streaming_count == 1
    assert session.partial("fresh") == "f"
    assert session.partial("old") is None


def test_expire_uses_the_last_event_not_the_first() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="a"), now=1.0)
    session.receive(ProducerEvent(id="m", delta="b"), now=10.0)
    assert session.expire(5.0) == []
    assert session.partial("m") == "ab"
    assert session.expire(11.0) == [Unfinished("c", "m", "ab")]


def test_expire_keeps_a_message_whose_last_event_is_at_the_deadline() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="a"), now=4.0)
    assert session.expire(4.0) == []
    assert session.streaming_count == 1
    assert session.expire(4.5) == [Unfinished("c", "m", "a")]


def test_expire_returns_every_stale_message_in_open_order_with_its_channel() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="b", delta="B"), now=1.0)
    session.receive(ProducerEvent(id="a", channel="x"), now=2.0)
    session.receive(ProducerEvent(id="b", delta="2"), now=3.0)
    assert session.expire(10.0) == [Unfinished("c", "b", "B2"), Unfinished("x", "a", "")]
    assert session.streaming_count == 0


def test_expire_ignores_completed_messages() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="done", delta="d", final=True), now=1.0)
    assert session.expire(100.0) == []
    assert session.completed_count == 1
    assert session.receive(ProducerEvent(id="done", final=True)) == Applied("c", "done", "d")


def test_expire_with_nothing_open() -> None:
    assert MessageStreams("c").expire(1.0) == []


def test_rejected_event_does_not_refresh_the_idle_timer() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="a"), now=1.0)
    with pytest.raises(FrameRejected):
        session.receive(ProducerEvent(id="m", delta="X", channel="other"), now=9.0)
    assert session.expire(5.0) == [Unfinished("c", "m", "a")]


def test_event_for_aborted_id_is_rejected_and_changes_nothing() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="part"), now=1.0)
    session.receive(ProducerEvent(id="other", delta="o"), now=9.0)
    assert session.expire(5.0) == [Unfinished("c", "m", "part")]
    for event in (
        ProducerEvent(id="m", delta="late"),
        ProducerEvent(id="m", delta="late", final=True),
        ProducerEvent(id="m", final=True),
        ProducerEvent(id="m"),
    ):
        with pytest.raises(FrameRejected) as info:
            session.receive(event, now=10.0)
        assert info.value.code is ErrorCode.MESSAGE_ABORTED
        assert info.value.message_id == "m"
        assert info.value.message == "message 'm' was aborted; send new text under a new id"
    assert session.streaming_count == 1
    assert session.completed_count == 0
    assert session.partial("m") is None
    assert session.channel_of("m") is None
    assert session.assembler.get("m") is None
    assert session.partial("other") == "o"


def test_aborted_id_is_rejected_on_any_channel() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="a"), now=1.0)
    session.expire(2.0)
    with pytest.raises(FrameRejected) as info:
        session.receive(ProducerEvent(id="m", delta="b", channel="elsewhere"))
    assert info.value.code is ErrorCode.MESSAGE_ABORTED


def test_aborted_message_frees_a_streaming_slot() -> None:
    session = MessageStreams("c", max_streaming=1)
    session.receive(ProducerEvent(id="a", delta="1"), now=1.0)
    session.expire(2.0)
    assert session.streaming_count == 0
    assert session.receive(ProducerEvent(id="b", delta="2"), now=3.0) == Applied(
        "c", "b", None, delta="2", opened=True, delta_wait=0.0, first_delta=True
    )


def test_aborted_ids_do_not_use_completed_memory() -> None:
    session = MessageStreams("c", max_completed=1)
    session.receive(ProducerEvent(id="done", delta="d", final=True), now=1.0)
    session.receive(ProducerEvent(id="m", delta="x"), now=1.0)
    session.expire(2.0)
    assert session.completed_count == 1
    assert session.receive(ProducerEvent(id="done", final=True)) == Applied("c", "done", "d")
    with pytest.raises(FrameRejected) as info:
        session.receive(ProducerEvent(id="m", delta="y"))
    assert info.value.code is ErrorCode.MESSAGE_ABORTED


def test_aborted_memory_is_bounded_by_max_completed() -> None:
    session = MessageStreams("c", max_completed=2)
    for now, message_id in enumerate(["a", "b", "c"]):
        session.receive(ProducerEvent(id=message_id, delta=message_id.upper()), now=float(now))
        session.expire(float(now) + 0.5)
    # "a" was aborted first and is forgotten: an event for it starts a fresh message.
    assert session.receive(ProducerEvent(id="a", delta="new"), now=10.0) == Applied(
        "c", "a", None, delta="new", opened=True, delta_wait=0.0, first_delta=True
    )
    assert session.partial("a") == "new"
    assert session.receive(ProducerEvent(id="a", final=True), now=11.0) == Applied(
        "c", "a", "new", True
    )
    for message_id in ("b", "c"):
        with pytest.raises(FrameRejected) as info:
            session.receive(ProducerEvent(id=message_id, delta="late"))
        assert info.value.code is ErrorCode.MESSAGE_ABORTED


# ------------------------------------------------------------------- close (aborts)


def test_close_returns_every_open_message_in_open_order() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="x", delta="1"), now=1.0)
    session.receive(ProducerEvent(id="y", delta="2", channel="d"), now=2.0)
    session.receive(ProducerEvent(id="z"), now=3.0)
    assert session.close() == [
        Unfinished("c", "x", "1"),
        Unfinished("d", "y", "2"),
        Unfinished("c", "z", ""),
    ]
    assert session.streaming_count == 0


def test_close_with_only_completed_messages_returns_nothing() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="d", final=True))
    assert session.close() == []
    assert session.completed_count == 0


def test_close_forgets_aborted_ids() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="old"), now=1.0)
    session.expire(2.0)
    session.close()
    assert session.receive(ProducerEvent(id="m", delta="new"), now=3.0) == Applied(
        "c", "m", None, delta="new", opened=True, delta_wait=0.0, first_delta=True
    )
    assert session.partial("m") == "new"


# ---------------------------------------------------------- delta_wait, first_delta


def test_first_delta_waits_from_the_first_event_even_without_a_delta() -> None:
    session = MessageStreams("c")
    assert session.receive(ProducerEvent(id="m"), now=1.0) == Applied("c", "m", None, opened=True)
    assert session.receive(ProducerEvent(id="m"), now=2.0) == Applied("c", "m", None)
    assert session.receive(ProducerEvent(id="m", delta="a"), now=4.5) == Applied(
        "c", "m", None, delta="a", delta_wait=3.5, first_delta=True
    )


def test_first_delta_after_an_opening_empty_delta_waits_from_the_opening() -> None:
    session = MessageStreams("c")
    opened = session.receive(ProducerEvent(id="m", delta=""), now=2.0)
    assert opened == Applied("c", "m", None, delta="", opened=True)
    assert opened.delta_wait is None
    assert opened.first_delta is False
    assert session.receive(ProducerEvent(id="m", delta="x"), now=2.75) == Applied(
        "c", "m", None, delta="x", delta_wait=0.75, first_delta=True
    )


def test_later_deltas_wait_from_the_previous_non_empty_delta() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="a"), now=1.0)
    assert session.receive(ProducerEvent(id="m", delta="b"), now=1.5) == Applied(
        "c", "m", None, delta="b", delta_wait=0.5
    )
    # Neither an empty delta nor an event without one restarts the wait.
    assert session.receive(ProducerEvent(id="m", delta=""), now=2.0) == Applied(
        "c", "m", None, delta=""
    )
    assert session.receive(ProducerEvent(id="m"), now=3.0) == Applied("c", "m", None)
    assert session.receive(ProducerEvent(id="m", delta="c"), now=3.75) == Applied(
        "c", "m", None, delta="c", delta_wait=2.25
    )
    assert session.receive(ProducerEvent(id="m", final=True), now=5.0) == Applied(
        "c", "m", "abc", True
    )


def test_final_event_with_a_delta_reports_its_wait() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m"), now=1.0)
    assert session.receive(ProducerEvent(id="m", delta="all", final=True), now=3.0) == Applied(
        "c", "m", "all", True, delta="all", delta_wait=2.0, first_delta=True
    )


def test_one_shot_events_delta_wait() -> None:
    session = MessageStreams("c")
    with_delta = session.receive(ProducerEvent(id="a", delta="x", final=True), now=7.0)
    assert with_delta.delta_wait == 0.0
    assert with_delta.first_delta is True
    empty = session.receive(ProducerEvent(id="b", delta="", final=True), now=8.0)
    assert empty == Applied("c", "b", "", True, delta="", opened=True)
    assert empty.delta_wait is None
    assert empty.first_delta is False
    bare = session.receive(ProducerEvent(id="c", final=True), now=9.0)
    assert bare == Applied("c", "c", "", True, opened=True)
    assert bare.delta_wait is None


def test_events_on_completed_ids_have_no_delta_wait() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="m", delta="d", final=True), now=1.0)
    late = session.receive(ProducerEvent(id="m", delta="late"), now=2.0)
    again = session.receive(ProducerEvent(id="m", delta="again", final=True), now=3.0)
    assert late == Applied("c", "m", None)
    assert again == Applied("c", "m", "d")
    assert (late.delta_wait, late.first_delta) == (None, False)
    assert (again.delta_wait, again.first_delta) == (None, False)


def test_delta_wait_is_per_message() -> None:
    session = MessageStreams("c")
    session.receive(ProducerEvent(id="a", delta="1"), now=1.0)
    session.receive(ProducerEvent(id="b"), now=2.0)
    session.receive(ProducerEvent(id="a", delta="2"), now=4.0)
    assert session.receive(ProducerEvent(id="b", delta="x"), now=6.0) == Applied(
        "c", "b", None, delta="x", delta_wait=4.0, first_delta=True
    )
    assert session.receive(ProducerEvent(id="a", delta="3"), now=6.5) == Applied(
        "c", "a", None, delta="3", delta_wait=2.5
    )


def test_a_rejected_delta_does_not_restart_the_wait() -> None:
    session = MessageStreams("room")
    session.receive(ProducerEvent(id="m", delta="a"), now=1.0)
    _rejected(session, ProducerEvent(id="m", delta="X", channel="other"), now=2.0)
    assert session.receive(ProducerEvent(id="m", delta="b"), now=3.0) == Applied(
        "room", "m", None, delta="b", delta_wait=2.0
    )


# ---------------------------------------------------------------------- max_chars


@dataclass
class _TooLarge:
    """A ``message_too_large`` outcome: returned (the message was aborted) or raised."""

    unfinished: Unfinished | None
    rejection: FrameRejected
    returned: bool

    @property
    def code(self) -> ErrorCode:
        return self.rejection.code

    @property
    def message(self) -> str:
        return self.rejection.message

    @property
    def message_id(self) -> str | None:
        return self.rejection.message_id


def _too_large(session: MessageStreams, event: ProducerEvent, now: float = 0.0) -> _TooLarge:
    """By the rule of refusals: an abort changed state, so it is returned; else raised."""
    try:
        outcome = session.receive(event, now)
    except FrameRejected as exc:
        assert exc.code is ErrorCode.MESSAGE_TOO_LARGE
        return _TooLarge(None, exc, returned=False)
    assert isinstance(outcome, Overflow), outcome
    assert outcome.rejection.code is ErrorCode.MESSAGE_TOO_LARGE
    return _TooLarge(outcome.unfinished, outcome.rejection, returned=True)


def test_delta_past_max_chars_aborts_the_message() -> None:
    session = MessageStreams("c", max_chars=5)
    session.receive(ProducerEvent(id="m", delta="ab"), now=1.0)
    session.receive(ProducerEvent(id="m", delta="cd"), now=2.0)
    error = _too_large(session, ProducerEvent(id="m", delta="efg"), now=3.0)
    assert error.returned
    assert error.unfinished == Unfinished("c", "m", "abcd")
    assert error.code is ErrorCode.MESSAGE_TOO_LARGE
    assert error.message_id == "m"
    assert error.message == "a message may have at most 5 characters; it was aborted"
    assert session.streaming_count == 0
    assert session.completed_count == 0
    assert session.partial("m") is None
    assert session.channel_of("m") is None
    assert session.assembler.get("m") is None
    # Already aborted: neither expiry nor close reports it again.
    assert session.expire(100.0) == []
    assert session.close() == []


def test_message_aborted_for_size_rejects_later_events() -> None:
    session = MessageStreams("c", max_chars=3)
    session.receive(ProducerEvent(id="m", delta="abc"), now=1.0)
    _too_large(session, ProducerEvent(id="m", delta="d"), now=2.0)
    for event in (
        ProducerEvent(id="m", delta="x"),
        ProducerEvent(id="m", delta="", final=True),
        ProducerEvent(id="m", final=True),
        ProducerEvent(id="m"),
    ):
        rejected = _rejected(session, event, now=3.0)
        assert type(rejected) is FrameRejected
        assert rejected.code is ErrorCode.MESSAGE_ABORTED
        assert rejected.message_id == "m"
    assert session.streaming_count == 0
    assert session.completed_count == 0


def test_final_event_past_max_chars_aborts_instead_of_completing() -> None:
    session = MessageStreams("c", max_chars=4)
    session.receive(ProducerEvent(id="m", delta="ab"), now=1.0)
    error = _too_large(session, ProducerEvent(id="m", delta="cde", final=True), now=2.0)
    assert error.unfinished == Unfinished("c", "m", "ab")
    assert session.completed_count == 0
    assert session.assembler.get("m") is None
    assert _rejected(session, ProducerEvent(id="m", final=True)).code is ErrorCode.MESSAGE_ABORTED


def test_max_chars_abort_leaves_other_messages_untouched() -> None:
    session = MessageStreams("c", max_chars=4)
    session.receive(ProducerEvent(id="big", delta="1234"), now=1.0)
    session.receive(ProducerEvent(id="other", delta="xyz", channel="d"), now=2.0)
    session.receive(ProducerEvent(id="done", delta="fin", final=True), now=3.0)
    error = _too_large(session, ProducerEvent(id="big", delta="5"), now=4.0)
    assert error.unfinished == Unfinished("c", "big", "1234")
    assert session.streaming() == [("other", "d")]
    assert session.partial("other") == "xyz"
    assert session.completed_count == 1
    assert session.receive(ProducerEvent(id="done", final=True), now=5.0) == Applied(
        "c", "done", "fin"
    )
    assert session.receive(
        ProducerEvent(id="other", delta="w", final=True, channel="d"), now=6.0
    ) == Applied("d", "other", "xyzw", True, delta="w", delta_wait=4.0)


def test_max_chars_counts_each_message_separately() -> None:
    session = MessageStreams("c", max_chars=3)
    session.receive(ProducerEvent(id="a", delta="aaa"), now=1.0)
    session.receive(ProducerEvent(id="b", delta="bbb"), now=1.0)
    assert session.receive(ProducerEvent(id="a", final=True), now=2.0).text == "aaa"
    assert session.receive(ProducerEvent(id="b", final=True), now=2.0).text == "bbb"


def test_exactly_max_chars_is_accepted() -> None:
    session = MessageStreams("c", max_chars=5)
    session.receive(ProducerEvent(id="m", delta="ab"), now=1.0)
    assert session.receive(ProducerEvent(id="m", delta="cde"), now=2.0) == Applied(
        "c", "m", None, delta="cde", delta_wait=1.0
    )
    # Empty deltas and events without one don't count towards the limit.
    assert session.receive(ProducerEvent(id="m", delta=""), now=3.0) == Applied(
        "c", "m", None, delta=""
    )
    assert session.receive(ProducerEvent(id="m", delta="", final=True), now=4.0) == Applied(
        "c", "m", "abcde", True, delta=""
    )
    assert session.receive(ProducerEvent(id="one", delta="12345", final=True), now=5.0) == Applied(
        "c", "one", "12345", True, delta="12345", opened=True, delta_wait=0.0, first_delta=True
    )
    assert session.receive(ProducerEvent(id="open", delta="12345"), now=6.0) == Applied(
        "c", "open", None, delta="12345", opened=True, delta_wait=0.0, first_delta=True
    )
    error = _too_large(session, ProducerEvent(id="open", delta="6"), now=7.0)
    assert error.unfinished == Unfinished("c", "open", "12345")


def test_max_chars_counts_characters_not_bytes() -> None:
    session = MessageStreams("c", max_chars=3)
    session.receive(ProducerEvent(id="m", delta="é€"), now=1.0)
    applied = session.receive(ProducerEvent(id="m", delta="👋", final=True), now=2.0)
    assert applied.text == "é€👋"
    session.receive(ProducerEvent(id="n", delta="ü"), now=3.0)
    error = _too_large(session, ProducerEvent(id="n", delta="日本語"), now=4.0)
    assert error.unfinished == Unfinished("c", "n", "ü")


def test_new_event_whose_delta_alone_is_too_large_changes_nothing() -> None:
    session = MessageStreams("c", max_chars=3)
    session.receive(ProducerEvent(id="open", delta="o"), now=1.0)
    for event in (
        ProducerEvent(id="m", delta="abcd"),
        ProducerEvent(id="m", delta="abcd", final=True),
    ):
        error = _too_large(session, event, now=2.0)
        assert error.unfinished is None and not error.returned
        assert error.code is ErrorCode.MESSAGE_TOO_LARGE
        assert error.message == "a message may have at most 3 characters; nothing was applied"
        assert session.streaming() == [("open", "c")]
        assert session.completed_count == 0
        assert session.partial("m") is None
        assert session.assembler.get("m") is None
    # The id was never opened, so it is not aborted: it may start afresh.
    assert session.receive(ProducerEvent(id="m", delta="abc"), now=3.0) == Applied(
        "c", "m", None, delta="abc", opened=True, delta_wait=0.0, first_delta=True
    )
    assert session.receive(ProducerEvent(id="open", final=True), now=4.0).text == "o"


def test_too_large_new_event_names_its_id() -> None:
    # ErrorFrame.id is "the event's id when it could be read": here it could.
    session = MessageStreams("c", max_chars=3)
    error = _too_large(session, ProducerEvent(id="m", delta="abcd"), now=1.0)
    assert error.unfinished is None
    assert error.message_id == "m"


def test_too_large_delta_with_a_channel_mismatch_changes_nothing() -> None:
    session = MessageStreams("room", max_chars=3)
    session.receive(ProducerEvent(id="m", delta="ab"), now=1.0)
    rejected = _rejected(session, ProducerEvent(id="m", delta="cdef", channel="other"), now=2.0)
    assert type(rejected) is FrameRejected
    assert rejected.code is ErrorCode.CHANNEL_MISMATCH
    assert session.partial("m") == "ab"
    assert session.receive(ProducerEvent(id="m", delta="c", final=True), now=3.0) == Applied(
        "room", "m", "abc", True, delta="c", delta_wait=2.0
    )


# ---------------------------------------------------------------------- lifecycle


def test_phase_follows_the_lifecycle_table() -> None:
    streams = MessageStreams("c", max_chars=3, max_completed=1)
    assert streams.phase("m") is None
    streams.receive(ProducerEvent(id="m", delta="a"))
    assert streams.phase("m") is Phase.STREAMING is TRANSITIONS[(None, "event")]
    streams.receive(ProducerEvent(id="m", final=True))
    assert streams.phase("m") is Phase.COMPLETED is TRANSITIONS[(Phase.STREAMING, "final")]
    streams.receive(ProducerEvent(id="m", final=True))
    assert streams.phase("m") is Phase.COMPLETED is TRANSITIONS[(Phase.COMPLETED, "final")]
    streams.receive(ProducerEvent(id="n", delta="ab"))
    streams.receive(ProducerEvent(id="n", delta="cd"))  # past max_chars: aborted
    assert streams.phase("n") is Phase.ABORTED is TRANSITIONS[(Phase.STREAMING, "abort")]
    # max_completed=1: the aborted id pushed nothing out, but one more completed id does.
    streams.receive(ProducerEvent(id="o", final=True))
    assert streams.phase("m") is TRANSITIONS[(Phase.COMPLETED, "evict")] is None
    assert (Phase.ABORTED, "event") not in TRANSITIONS
    with pytest.raises(FrameRejected) as refused:
        streams.receive(ProducerEvent(id="n", delta="x"))
    assert refused.value.code is ErrorCode.MESSAGE_ABORTED


# ------------------------------------------------------------- split surrogates


def test_an_emoji_split_into_utf16_halves_is_joined_in_text_and_deltas() -> None:
    streams = MessageStreams("c")
    first = streams.receive(ProducerEvent(id="m", delta="A\ud83d"))
    assert isinstance(first, Applied) and first.delta == "A"
    assert streams.partial("m") == "A"  # the high half waits for its pair
    second = streams.receive(ProducerEvent(id="m", delta="\ude00B"))
    assert isinstance(second, Applied) and second.delta == "\U0001f600B"
    final = streams.receive(ProducerEvent(id="m", final=True))
    assert isinstance(final, Applied) and final.text == "A\U0001f600B"


def test_a_half_that_never_pairs_becomes_the_replacement_character() -> None:
    streams = MessageStreams("c")
    streams.receive(ProducerEvent(id="end", delta="x\ud83d"))
    done = streams.receive(ProducerEvent(id="end", final=True))
    assert isinstance(done, Applied) and (done.delta, done.text) == ("\ufffd", "x\ufffd")
    streams.receive(ProducerEvent(id="low", delta="\ude00y"))
    assert streams.partial("low") == "\ufffdy"
    streams.receive(ProducerEvent(id="mid", delta="a\ud83db"))
    assert streams.partial("mid") == "a\ufffdb"
    one_shot = streams.receive(ProducerEvent(id="shot", delta="\ud83d", final=True))
    assert isinstance(one_shot, Applied) and one_shot.text == "\ufffd"
    streams.receive(ProducerEvent(id="cut", delta="z\ud83d"))
    assert Unfinished("c", "cut", "z\ufffd") in streams.close()


def test_a_held_half_is_replaced_when_the_message_idles_out() -> None:
    streams = MessageStreams("c")
    streams.receive(ProducerEvent(id="m", delta="\ud83d"), now=1.0)
    assert streams.expire(5.0) == [Unfinished("c", "m", "\ufffd")]


def test_text_without_surrogates_is_untouched() -> None:
    streams = MessageStreams("c")
    for delta in ["héllo ", "\U0001f44b", "日本語", "\u2028"]:
        applied = streams.receive(ProducerEvent(id="m", delta=delta))
        assert isinstance(applied, Applied) and applied.delta == delta


def test_text_chars_counts_exactly_what_is_held_through_every_change() -> None:
    import random

    rng = random.Random(11)
    streams = MessageStreams("c", max_chars=40, max_completed=3, max_streaming=4)
    ids = [f"m{n}" for n in range(30)]
    now = 0.0
    for _ in range(3000):
        now += 1.0
        message_id, roll = rng.choice(ids), rng.random()
        if roll < 0.8:
            event: dict[str, object] = {
                "id": message_id,
                "delta": rng.choice(["", "ab", "é", "xyz"]),
            }
            if rng.random() < 0.2:
                event["final"] = True
            with contextlib.suppress(FrameRejected):
                streams.receive(decode_producer_event(json.dumps(event)), now)
        elif roll < 0.9:
            streams.refuse(message_id)
        elif roll < 0.995:
            streams.expire(now - rng.randrange(5))
        else:
            streams.close()
        held = sum(
            len(streams.assembler.get(i) or "")
            for i in ids
            if streams.phase(i) in (Phase.STREAMING, Phase.COMPLETED)
        )
        assert streams.text_chars == held


def test_meta_merges_shallowly_last_write_wins_and_ends_with_its_message() -> None:
    streams = MessageStreams("c", max_meta_bytes=64)
    events = [
        {"id": "m", "delta": "a", "meta": {"model": "x", "usage": {"in": 1}}},
        {"id": "m", "delta": "b"},
        {"id": "m", "meta": {"usage": {"out": 2}, "finish_reason": "stop"}, "final": True},
    ]
    results = [streams.receive(decode_producer_event(json.dumps(e))) for e in events]
    done = results[-1]
    assert isinstance(done, Applied) and done.text == "ab"
    assert done.meta == {"model": "x", "usage": {"out": 2}, "finish_reason": "stop"}
    one_shot = streams.receive(
        decode_producer_event('{"id": "o", "final": true, "meta": {"k": 1}}')
    )
    assert isinstance(one_shot, Applied) and one_shot.meta == {"k": 1}
    streams.receive(decode_producer_event('{"id": "gone", "delta": "x", "meta": {"k": 2}}'))
    (unfinished,) = streams.close()
    assert unfinished.meta == {"k": 2}


def test_meta_over_its_limit_is_refused_and_changes_nothing() -> None:
    streams = MessageStreams("c", max_meta_bytes=16)
    streams.receive(decode_producer_event('{"id": "m", "delta": "a", "seq": 1}'))
    big = json.dumps({"id": "m", "delta": "b", "seq": 2, "meta": {"k": "x" * 20}})
    with pytest.raises(FrameRejected) as refused:
        streams.receive(decode_producer_event(big))
    assert refused.value.code is ErrorCode.INVALID_EVENT and "meta" in refused.value.message
    assert streams.next_seq("m") == 2 and streams.partial("m") == "a"


# ------------------------------------------------------------------------ refusal


def test_a_refused_message_refuses_every_later_event_its_final_included() -> None:
    streams = MessageStreams("c", max_completed=2)
    streams.receive(ProducerEvent(id="m", delta="lost"))
    streams.refuse("m")
    assert streams.phase("m") is Phase.REFUSED is TRANSITIONS[(Phase.STREAMING, "refuse")]
    assert (streams.partial("m"), streams.text_chars, streams.streaming_count) == (None, 0, 0)
    for event in [
        ProducerEvent(id="m", delta="more"),
        ProducerEvent(id="m", final=True),
        ProducerEvent(id="m", delta="x", final=True),
    ]:
        refused = _rejected(streams, event)
        assert (refused.code, refused.message_id) == (ErrorCode.ID_IN_USE, "m")
        assert "channel 'c'" in str(refused)
    assert streams.phase("m") is Phase.REFUSED
    streams.refuse("m")  # refusing again changes nothing
    assert streams.phase("m") is Phase.REFUSED
    # Forgotten like an aborted id, least recently used first: then it is unknown again.
    streams.receive(ProducerEvent(id="a", final=True))
    streams.receive(ProducerEvent(id="b", final=True))
    streams.receive(ProducerEvent(id="n", delta="y"))
    streams.refuse("n")
    streams.receive(ProducerEvent(id="o", delta="z"))
    streams.refuse("o")
    assert streams.phase("m") is TRANSITIONS[(Phase.REFUSED, "evict")] is None
    assert streams.phase("n") is streams.phase("o") is Phase.REFUSED


def test_a_one_shot_message_whose_publication_was_refused_is_refused() -> None:
    streams = MessageStreams("c")
    done = streams.receive(ProducerEvent(id="m", delta="hi", final=True))
    assert isinstance(done, Applied) and done.text == "hi"
    streams.refuse("m")
    assert streams.phase("m") is Phase.REFUSED is TRANSITIONS[(Phase.COMPLETED, "refuse")]
    assert streams.text_chars == 0
    assert _rejected(streams, ProducerEvent(id="m", final=True)).code is ErrorCode.ID_IN_USE


def test_refusing_an_unknown_id_changes_nothing() -> None:
    streams = MessageStreams("c")
    streams.refuse("m")
    assert streams.phase("m") is None
    applied = streams.receive(ProducerEvent(id="m", delta="a"))
    assert isinstance(applied, Applied) and applied.opened
