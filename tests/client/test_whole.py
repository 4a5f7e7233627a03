"""Which unacknowledged messages ``RelayProducer`` sends again as one whole event in a new
session (completed plain ones only, with their text exactly as sent, within
``RESEND_BYTES``), and how what it sends again is cut into frames."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from token_relay.client.producer import (
    MIN_RESEND_BYTES,
    RESEND_BATCH,
    RESEND_BYTES,
    _batches,
    _whole,
)
from token_relay.core.assembler import TokenAssembler


def _event(message_id: str, delta: str) -> str:
    return json.dumps({"id": message_id, "delta": delta}, ensure_ascii=False)


def _frames(*events: dict[str, Any]) -> list[str]:
    return [json.dumps({"id": "m", "seq": seq, **event}) for seq, event in enumerate(events, 1)]


def test_a_completed_plain_message_becomes_one_whole_event() -> None:
    frames = _frames({"delta": "he"}, {"delta": ""}, {"delta": "llo", "final": True})
    assert json.loads(_whole("m", frames) or "") == {
        "id": "m", "seq": 1, "delta": "hello", "final": True
    }  # fmt: skip
    frames = _frames({"delta": "x", "channel": "c"}, {"final": True, "channel": "c"})
    assert json.loads(_whole("m", frames) or "") == {
        "id": "m", "seq": 1, "delta": "x", "final": True, "channel": "c"
    }  # fmt: skip


def test_any_other_message_is_left_as_sent() -> None:
    for frames in (
        _frames({"delta": "a"}, {"delta": "b"}),  # not completed
        _frames({"delta": "a", "final": True}),  # already whole
        _frames({"delta": "a"}, {"final": True, "meta": {"model": "m"}}),
        _frames({"chunk": {"type": "start-step"}}, {"final": True}),
        _frames({"delta": "a"}, {"abort": "error", "final": True}),
        _frames({"delta": "a", "channel": "c"}, {"final": True}),  # channels differ
        _frames({"delta": "a", "final": True}, {"final": True}),  # a final repeated
    ):
        assert _whole("m", frames) is None, frames


@given(st.lists(st.text(max_size=8), min_size=1, max_size=12))
def test_the_whole_event_holds_the_seed_assembly_of_the_deltas(deltas: list[str]) -> None:
    events = [{"delta": delta} for delta in deltas] + [{"final": True}]
    whole = json.loads(_whole("m", _frames(*events)) or "")
    assembler = TokenAssembler()
    for delta in deltas:
        assembler.apply({"id": "m", "delta": delta})
    assert whole["delta"] == assembler.apply({"id": "m", "final": True})


def test_a_message_too_long_for_one_resent_frame_is_left_as_sent() -> None:
    # A quarter of the relay's default frame limit, counted in UTF-8 bytes: 70,000 "é" are
    # 140,000 bytes, so two of them pass it, though 140,000 characters would not.
    half = "\u00e9" * 70_000
    assert _whole("m", _frames({"delta": half}, {"final": True})) is not None
    assert _whole("m", _frames({"delta": half}, {"delta": half}, {"final": True})) is None
    # After the relay refused a frame as too big, within the halved bound only.
    assert _whole("m", _frames({"delta": half}, {"final": True}), RESEND_BYTES // 2) is None
    short = _frames({"delta": "x" * 900}, {"final": True})
    assert _whole("m", short, MIN_RESEND_BYTES) is not None
    assert _whole("m", _frames({"delta": "x" * 1000}, {"final": True}), MIN_RESEND_BYTES) is None


@given(
    st.lists(st.integers(min_value=0, max_value=RESEND_BYTES + 10), max_size=40),
    st.sampled_from([RESEND_BYTES, RESEND_BYTES // 8, MIN_RESEND_BYTES]),
)
def test_resent_frames_keep_order_and_stay_within_both_bounds(sizes: list[int], limit: int) -> None:
    # Events of about ``size`` bytes each in UTF-8 ("é" is two bytes), cut into frames of
    # at most ``limit`` bytes (as sent at first, or after the relay refused frames as too
    # big: each 1009 halves it).
    frames = [_event(str(n), "\u00e9" * (size // 2)) for n, size in enumerate(sizes)]
    batches = list(_batches(frames, limit))
    assert [frame for batch in batches for frame in batch] == frames
    for batch in batches:
        assert 1 <= len(batch) <= RESEND_BATCH
        frame = "[" + ",".join(batch) + "]"
        assert len(batch) == 1 or len(frame.encode()) <= limit


def test_many_small_events_go_in_frames_of_at_most_the_batch() -> None:
    frames = _frames(*({"delta": "x"} for _ in range(RESEND_BATCH * 2 + 1)))
    assert [len(batch) for batch in _batches(frames)] == [RESEND_BATCH, RESEND_BATCH, 1]
