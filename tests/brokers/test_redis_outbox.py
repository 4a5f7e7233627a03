"""The Redis broker's outbox, synchronously: bounded in frames and in characters, the
oldest dropped first, and a frame put back goes first again, its characters counted."""

from __future__ import annotations

import pytest
from token_relay.brokers.redis import outbox
from token_relay.brokers.redis.outbox import Deferred, Outbox


def _frame(message_id: str, body: str = "{}") -> Deferred:
    return Deferred("c", "owner", message_id, body, 0, False, "")


def test_past_its_count_the_oldest_frame_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox, "MAX_OUTBOX", 2)
    box = Outbox()
    for message_id in ("a", "b", "c"):
        box.add(_frame(message_id, "xyz"))
    assert [frame.message_id for frame in box] == ["b", "c"]
    assert (len(box), box.bytes) == (2, 6)


def test_past_its_characters_the_oldest_frames_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outbox, "MAX_OUTBOX_BYTES", 10)
    box = Outbox()
    box.add(_frame("a", "1234"))
    box.add(_frame("b", "1234"))
    box.add(_frame("c", "12345678"))
    assert [frame.message_id for frame in box] == ["c"]
    assert box.bytes == 8


def test_a_frame_taken_and_put_back_is_first_again() -> None:
    box = Outbox()
    box.add(_frame("a", "12"))
    box.add(_frame("b", "345"))
    taken = box.take()
    assert (taken.message_id, len(box), box.bytes) == ("a", 1, 3)
    box.put_back(taken)
    assert [frame.message_id for frame in box] == ["a", "b"]
    assert box.bytes == 5
