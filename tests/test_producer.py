"""Tests for server.producer: channels, limits and LRU on top of the assembler."""

from __future__ import annotations

import pytest

from server.errors import ErrorCode, FrameRejected
from server.producer import Applied, ProducerSession
from server.protocol import ProducerEvent, decode_producer_event


def _rejected(session: ProducerSession, event: ProducerEvent) -> FrameRejected:
    with pytest.raises(FrameRejected) as info:
        session.receive(event)
    return info.value


# ------------------------------------------------------------------------ channels


def test_default_channel_is_used() -> None:
    session = ProducerSession("room")
    assert session.receive(ProducerEvent(id="m", delta="hi")) == Applied("room", "m", None, False)
    assert session.receive(ProducerEvent(id="m", final=True)) == Applied("room", "m", "hi", True)


def test_event_channel_overrides_default() -> None:
    session = ProducerSession("room")
    applied = session.receive(ProducerEvent(id="m", delta="x", final=True, channel="other"))
    assert applied == Applied("other", "m", "x", True)


def test_event_channel_without_default() -> None:
    session = ProducerSession()
    assert session.receive(decode_producer_event('{"id": "m", "channel": "c"}')) == Applied(
        "c", "m", None, False
    )


def test_naming_the_default_channel_explicitly_is_not_a_mismatch() -> None:
    session = ProducerSession("room")
    session.receive(ProducerEvent(id="m", delta="a"))
    applied = session.receive(ProducerEvent(id="m", delta="b", final=True, channel="room"))
    assert applied == Applied("room", "m", "ab", True)


def test_channel_required_when_neither() -> None:
    session = ProducerSession()
    rejected = _rejected(session, ProducerEvent(id="m", delta="lost"))
    assert rejected.code is ErrorCode.CHANNEL_REQUIRED
    assert rejected.message_id == "m"
    assert session.streaming_count == 0
    assert session.assembler.get("m") is None
    applied = session.receive(ProducerEvent(id="m", delta="kept", final=True, channel="c"))
    assert applied == Applied("c", "m", "kept", True)


def test_channel_mismatch_on_streaming_id() -> None:
    session = ProducerSession()
    session.receive(ProducerEvent(id="m", delta="a", channel="c1"))
    rejected = _rejected(session, ProducerEvent(id="m", delta="X", final=True, channel="c2"))
    assert rejected.code is ErrorCode.CHANNEL_MISMATCH
    assert rejected.message == "message 'm' belongs to channel 'c1', not 'c2'"
    assert rejected.message_id == "m"
    assert session.assembler.get("m") == "a"
    assert session.streaming_count == 1
    assert session.completed_count == 0
    applied = session.receive(ProducerEvent(id="m", delta="b", final=True, channel="c1"))
    assert applied == Applied("c1", "m", "ab", True)


def test_channel_mismatch_against_default_channel() -> None:
    session = ProducerSession("room")
    session.receive(ProducerEvent(id="m", delta="a"))
    rejected = _rejected(session, ProducerEvent(id="m", delta="X", channel="other"))
    assert rejected.code is ErrorCode.CHANNEL_MISMATCH
    assert session.receive(ProducerEvent(id="m", final=True)) == Applied("room", "m", "a", True)


def test_channel_mismatch_on_completed_id() -> None:
    session = ProducerSession()
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
    session = ProducerSession("c")
    session.receive(ProducerEvent(id="m", delta="hel"))
    first = session.receive(ProducerEvent(id="m", delta="lo", final=True))
    second = session.receive(ProducerEvent(id="m", delta="ignored", final=True))
    third = session.receive(ProducerEvent(id="m", final=True))
    assert first == Applied("c", "m", "hello", True)
    assert second == Applied("c", "m", "hello", False)
    assert third == Applied("c", "m", "hello", False)


def test_non_final_after_completion_changes_nothing() -> None:
    session = ProducerSession("c")
    session.receive(ProducerEvent(id="m", delta="done", final=True))
    assert session.receive(ProducerEvent(id="m", delta="more")) == Applied("c", "m", None, False)
    assert session.assembler.get("m") == "done"
    assert session.streaming_count == 0
    assert session.completed_count == 1


def test_final_of_unseen_id_completes_empty() -> None:
    session = ProducerSession("c")
    assert session.receive(ProducerEvent(id="m", final=True)) == Applied("c", "m", "", True)
    assert session.receive(ProducerEvent(id="m", final=True)) == Applied("c", "m", "", False)


def test_empty_deltas_kept() -> None:
    session = ProducerSession("c")
    session.receive(decode_producer_event('{"id": "m", "delta": ""}'))
    assert session.streaming_count == 1
    session.receive(decode_producer_event('{"id": "m", "delta": "a"}'))
    applied = session.receive(decode_producer_event('{"id": "m", "delta": "", "final": true}'))
    assert applied == Applied("c", "m", "a", True)


def test_interleaved_messages_on_different_channels() -> None:
    session = ProducerSession("default")
    session.receive(ProducerEvent(id="a", delta="A1", channel="x"))
    session.receive(ProducerEvent(id="b", delta="B1"))
    session.receive(ProducerEvent(id="a", delta="A2", channel="x"))
    assert session.receive(ProducerEvent(id="b", final=True)) == Applied("default", "b", "B1", True)
    assert session.receive(ProducerEvent(id="a", final=True, channel="x")) == Applied(
        "x", "a", "A1A2", True
    )


# ------------------------------------------------------------------------- limits


def test_too_many_messages_at_max_streaming() -> None:
    session = ProducerSession("c", max_streaming=2)
    session.receive(ProducerEvent(id="a", delta="1"))
    session.receive(ProducerEvent(id="b", delta="2"))
    rejected = _rejected(session, ProducerEvent(id="c", delta="3"))
    assert rejected.code is ErrorCode.TOO_MANY_MESSAGES
    assert rejected.message_id == "c"
    assert session.streaming_count == 2
    assert session.assembler.get("c") is None
    # Existing messages still take deltas at the limit.
    assert session.receive(ProducerEvent(id="a", delta="x")) == Applied("c", "a", None, False)
    assert session.assembler.get("a") == "1x"


def test_finished_message_frees_a_slot() -> None:
    session = ProducerSession("c", max_streaming=1)
    session.receive(ProducerEvent(id="a", delta="1"))
    with pytest.raises(FrameRejected):
        session.receive(ProducerEvent(id="b", delta="2"))
    session.receive(ProducerEvent(id="a", final=True))
    assert session.streaming_count == 0
    assert session.receive(ProducerEvent(id="b", delta="2")) == Applied("c", "b", None, False)
    assert session.streaming_count == 1


def test_one_shot_final_passes_at_the_streaming_limit() -> None:
    session = ProducerSession("c", max_streaming=1)
    session.receive(ProducerEvent(id="open", delta="o"))
    assert session.receive(ProducerEvent(id="once", delta="whole", final=True)) == Applied(
        "c", "once", "whole", True
    )
    assert session.streaming_count == 1


def test_events_for_completed_ids_are_accepted_at_the_streaming_limit() -> None:
    session = ProducerSession("c", max_streaming=1)
    session.receive(ProducerEvent(id="done", delta="d", final=True))
    session.receive(ProducerEvent(id="open", delta="o"))
    assert session.receive(ProducerEvent(id="done", final=True)) == Applied("c", "done", "d", False)


def test_max_completed_evicts_least_recently_used() -> None:
    session = ProducerSession("c", max_completed=2)
    session.receive(ProducerEvent(id="a", delta="A", final=True))
    session.receive(ProducerEvent(id="b", delta="B", final=True))
    session.receive(ProducerEvent(id="c", delta="C", final=True))
    assert session.completed_count == 2
    assert session.assembler.get("a") is None
    assert session.assembler.get("b") == "B"
    assert session.assembler.get("c") == "C"
    # The evicted id is unknown again: an event for it starts a new message.
    assert session.receive(ProducerEvent(id="a", delta="new")) == Applied("c", "a", None, False)
    assert session.streaming_count == 1
    assert session.receive(ProducerEvent(id="a", final=True)) == Applied("c", "a", "new", True)


def test_evicted_id_may_start_on_another_channel() -> None:
    session = ProducerSession(max_completed=1)
    session.receive(ProducerEvent(id="a", delta="A", final=True, channel="c1"))
    session.receive(ProducerEvent(id="b", delta="B", final=True, channel="c1"))
    applied = session.receive(ProducerEvent(id="a", delta="x", final=True, channel="c2"))
    assert applied == Applied("c2", "a", "x", True)


def test_repeated_final_refreshes_lru_position() -> None:
    session = ProducerSession("c", max_completed=2)
    session.receive(ProducerEvent(id="a", delta="A", final=True))
    session.receive(ProducerEvent(id="b", delta="B", final=True))
    assert session.receive(ProducerEvent(id="a", final=True)) == Applied("c", "a", "A", False)
    session.receive(ProducerEvent(id="c", delta="C", final=True))
    assert session.completed_count == 2
    assert session.assembler.get("a") == "A"
    assert session.assembler.get("b") is None
    assert session.receive(ProducerEvent(id="a", final=True)) == Applied("c", "a", "A", False)
    assert session.receive(ProducerEvent(id="b", final=True)) == Applied("c", "b", "", True)


def test_non_final_event_does_not_refresh_lru_position() -> None:
    session = ProducerSession("c", max_completed=2)
    session.receive(ProducerEvent(id="a", delta="A", final=True))
    session.receive(ProducerEvent(id="b", delta="B", final=True))
    session.receive(ProducerEvent(id="a", delta="ignored"))
    session.receive(ProducerEvent(id="c", delta="C", final=True))
    assert session.assembler.get("a") is None
    assert session.assembler.get("b") == "B"


def test_limits_below_one_are_refused() -> None:
    with pytest.raises(ValueError):
        ProducerSession("c", max_streaming=0)
    with pytest.raises(ValueError):
        ProducerSession("c", max_completed=0)


# -------------------------------------------------------------------------- close


def test_close_returns_unfinished_and_frees_state() -> None:
    session = ProducerSession("c")
    session.receive(ProducerEvent(id="a", delta="par"))
    session.receive(ProducerEvent(id="b", channel="other"))
    session.receive(ProducerEvent(id="done", delta="D", final=True))
    session.receive(ProducerEvent(id="a", delta="tial"))
    assert session.close() == [("c", "a", "partial"), ("other", "b", "")]
    assert session.streaming_count == 0
    assert session.completed_count == 0
    assert session.assembler.get("a") is None
    assert session.assembler.get("done") is None
    assert session.close() == []


def test_close_then_ids_start_afresh() -> None:
    session = ProducerSession("c")
    session.receive(ProducerEvent(id="a", delta="old", final=True))
    session.receive(ProducerEvent(id="b", delta="old"))
    session.close()
    assert session.receive(ProducerEvent(id="a", delta="new", final=True)) == Applied(
        "c", "a", "new", True
    )
    assert session.receive(ProducerEvent(id="b", delta="new", final=True)) == Applied(
        "c", "b", "new", True
    )


def test_two_sessions_with_same_id_do_not_mix() -> None:
    first = ProducerSession("c")
    second = ProducerSession("c")
    first.receive(ProducerEvent(id="m", delta="one"))
    second.receive(ProducerEvent(id="m", delta="two"))
    first.receive(ProducerEvent(id="m", delta="1"))
    assert second.receive(ProducerEvent(id="m", final=True)) == Applied("c", "m", "two", True)
    assert first.streaming_count == 1
    assert first.receive(ProducerEvent(id="m", final=True)) == Applied("c", "m", "one1", True)
