"""Which unacknowledged messages ``RelayProducer`` sends again as one whole event in a new
session: completed plain ones only, with their text exactly as sent."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from token_relay.client.producer import _whole
from token_relay.core.assembler import TokenAssembler


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
