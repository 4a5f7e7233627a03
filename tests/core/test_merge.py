"""Tests for token_relay.core.merge: the one delta merger, as a slow subscriber's backlog and
as the flush window's queue."""

from __future__ import annotations

import json
from typing import Any

from token_relay.core.events import Delta, Outgoing
from token_relay.core.merge import MAX_MERGED_CHARS, Backlog, DeltaQueue
from token_relay.core.protocol import (
    Aborted,
    AbortReason,
    MessageFrame,
    Snapshot,
    encode,
)


def _delta(channel: str, message_id: str, delta: str) -> Delta:
    return Delta(channel, message_id, delta)


def _message(channel: str, message_id: str, text: str, offset: int = 1) -> str:
    return encode(MessageFrame(channel=channel, id=message_id, text=text, offset=offset, epoch="e"))


def _expected(channel: str, message_id: str, delta: str) -> dict[str, Any]:
    return {"type": "delta", "channel": channel, "id": message_id, "delta": delta}


def _drain(backlog: Backlog) -> list[str | bytes]:
    out = []
    while backlog:
        out.append(backlog.pop_payload())
    return out


# ------------------------------------------------------------------------ merging


def test_single_delta_is_returned_as_is() -> None:
    backlog = Backlog()
    assert backlog.push(_delta("c", "m", "hi")) is False
    assert len(backlog) == 1
    assert json.loads(backlog.pop_payload()) == _expected("c", "m", "hi")
    assert len(backlog) == 0
    assert backlog.merged == 0


def test_consecutive_deltas_of_one_message_merge_into_one_frame() -> None:
    backlog = Backlog()
    assert backlog.push(_delta("c", "m", "Hel")) is False
    assert backlog.push(_delta("c", "m", "lo")) is True
    assert backlog.push(_delta("c", "m", ", world")) is True
    assert len(backlog) == 1
    assert backlog.merged == 2
    assert json.loads(backlog.pop_payload()) == _expected("c", "m", "Hello, world")
    assert not backlog


def test_an_unmerged_delta_is_the_same_object_rendered_once() -> None:
    backlog = Backlog()
    shared = _delta("c", "m", "ab")
    rendered = shared.render()
    assert backlog.push(shared) is False
    assert backlog.pop() is shared
    # Merging never edits a delta that other receivers share.
    backlog.push(shared)
    assert backlog.push(_delta("c", "m", "cd")) is True
    merged = backlog.pop()
    assert isinstance(merged, Delta) and merged is not shared
    assert (shared.text, shared.render()) == ("ab", rendered)
    assert json.loads(merged.render()) == _expected("c", "m", "abcd")


def test_deltas_of_different_messages_stay_separate_and_in_order() -> None:
    backlog = Backlog()
    backlog.push(_delta("c", "a", "A1"))
    backlog.push(_delta("c", "b", "B1"))
    backlog.push(_delta("c", "a", "A2"))
    backlog.push(_delta("c", "b", "B2"))
    backlog.push(_delta("c", "c", "C1"))
    assert len(backlog) == 3
    assert backlog.merged == 2
    assert [json.loads(p) for p in _drain(backlog)] == [
        _expected("c", "a", "A1A2"),
        _expected("c", "b", "B1B2"),
        _expected("c", "c", "C1"),
    ]


def test_same_id_on_different_channels_is_not_merged() -> None:
    backlog = Backlog()
    backlog.push(_delta("c1", "m", "x"))
    assert backlog.push(_delta("c2", "m", "y")) is False
    assert backlog.push(_delta("c1", "m", "z")) is True
    assert [json.loads(p) for p in _drain(backlog)] == [
        _expected("c1", "m", "xz"),
        _expected("c2", "m", "y"),
    ]


def test_a_frame_of_the_same_message_closes_merging() -> None:
    backlog = Backlog()
    message = _message("c", "m", "ab")
    backlog.push(_delta("c", "m", "a"))
    backlog.push(message)
    assert backlog.push(_delta("c", "m", "b")) is False
    assert backlog.push(_delta("c", "m", "c")) is True
    assert len(backlog) == 3
    assert backlog.merged == 1
    first, second, third = _drain(backlog)
    assert json.loads(first) == _expected("c", "m", "a")
    assert second is message
    assert json.loads(third) == _expected("c", "m", "bc")


def test_snapshot_and_aborted_frames_close_merging_too() -> None:
    backlog = Backlog()
    snapshot = encode(Snapshot(channel="c", id="m", text="ab"))
    aborted = encode(
        Aborted(
            channel="c", id="m", text="abc", reason=AbortReason.IDLE_TIMEOUT, offset=2, epoch="e"
        )
    )
    backlog.push(_delta("c", "m", "a"))
    backlog.push(snapshot)
    backlog.push(_delta("c", "m", "b"))
    backlog.push(aborted)
    backlog.push(_delta("c", "m", "c"))
    assert backlog.merged == 0
    out = _drain(backlog)
    assert out[1] is snapshot
    assert out[3] is aborted
    assert [json.loads(out[i])["delta"] for i in (0, 2, 4)] == ["a", "b", "c"]


def test_any_other_frame_closes_merging_so_nothing_overtakes_it() -> None:
    backlog = Backlog()
    other = _message("c", "other", "done")
    backlog.push(_delta("c", "m", "1"))
    backlog.push(other)
    assert backlog.push(_delta("c", "m", "2")) is False
    first, second, third = _drain(backlog)
    assert json.loads(first) == _expected("c", "m", "1")
    assert second is other
    assert json.loads(third) == _expected("c", "m", "2")


def test_delta_after_its_merged_frame_was_popped_starts_a_new_item() -> None:
    backlog = Backlog()
    backlog.push(_delta("c", "m", "a"))
    backlog.push(_delta("c", "m", "b"))
    assert json.loads(backlog.pop_payload()) == _expected("c", "m", "ab")
    assert backlog.push(_delta("c", "m", "c")) is False
    assert backlog.push(_delta("c", "m", "d")) is True
    assert len(backlog) == 1
    assert json.loads(backlog.pop_payload()) == _expected("c", "m", "cd")
    assert backlog.merged == 2


def test_popping_a_closed_item_keeps_the_newer_one_open() -> None:
    backlog = Backlog()
    snapshot = encode(Snapshot(channel="c", id="m", text="a"))
    backlog.push(_delta("c", "m", "a"))
    backlog.push(snapshot)
    backlog.push(_delta("c", "m", "b"))
    assert json.loads(backlog.pop_payload()) == _expected("c", "m", "a")
    assert backlog.push(_delta("c", "m", "c")) is True
    assert backlog.pop_payload() is snapshot
    assert json.loads(backlog.pop_payload()) == _expected("c", "m", "bc")
    assert not backlog


# -------------------------------------------------------------- non-delta frames


def test_non_delta_frames_are_never_dropped_or_reordered() -> None:
    backlog = Backlog()
    frames: list[str | bytes] = [
        _message("c", "a", "one", 1),
        _message("c", "a", "one", 1),
        _message("c", "b", "two", 2).encode(),
        encode(Snapshot(channel="c", id="m", text="x")),
        b'{"type":"error","code":"forbidden","message":"no","id":null}',
        '{"type":"ack","id":"m","channel":"c"}',
    ]
    for frame in frames:
        assert backlog.push(frame) is False
    assert len(backlog) == len(frames)
    out = _drain(backlog)
    assert out == frames
    assert [type(p) for p in out] == [type(f) for f in frames]
    assert backlog.merged == 0


def test_non_delta_frames_kept_between_merged_deltas() -> None:
    backlog = Backlog()
    first = _message("x", "done", "t", 1)
    second = _message("x", "done2", "u", 2).encode()
    backlog.push(_delta("c", "m", "a"))
    backlog.push(first)
    backlog.push(_delta("c", "m", "b"))
    backlog.push(second)
    backlog.push(_delta("c", "n", "z"))
    backlog.push(_delta("c", "m", "c"))
    out = _drain(backlog)
    assert len(out) == 6
    assert json.loads(out[0]) == _expected("c", "m", "a")
    assert out[1] is first
    assert json.loads(out[2]) == _expected("c", "m", "b")
    assert out[3] is second
    assert json.loads(out[4]) == _expected("c", "n", "z")
    assert json.loads(out[5]) == _expected("c", "m", "c")
    assert backlog.merged == 0
    backlog.push(_delta("c", "n", "1"))
    backlog.push(_delta("c", "m", "c"))
    assert backlog.push(_delta("c", "n", "2")) is True
    assert [json.loads(p) for p in _drain(backlog)] == [
        _expected("c", "n", "12"),
        _expected("c", "m", "c"),
    ]


# ------------------------------------------------------------------------ counters


def test_merged_counts_every_merge() -> None:
    backlog = Backlog()
    assert backlog.merged == 0
    backlog.push(_delta("c", "a", "1"))
    backlog.push(_message("c", "x", "t"))
    assert backlog.merged == 0
    backlog.push(_delta("c", "a", "2"))
    backlog.push(_delta("c", "b", "1"))
    backlog.push(_delta("c", "b", "2"))
    backlog.push(_delta("c", "a", "3"))
    assert backlog.merged == 2
    _drain(backlog)
    assert backlog.merged == 2


def test_bytes_grows_with_each_frame_and_returns_to_zero() -> None:
    backlog = Backlog()
    first = _message("c", "a", "one")
    second = _message("c", "b", "twö").encode()
    backlog.push(first)
    assert backlog.bytes == len(first)
    backlog.push(second)
    assert backlog.bytes == len(first) + len(second)
    assert backlog.pop_payload() is first
    assert backlog.bytes == len(second)
    assert backlog.pop_payload() is second
    assert backlog.bytes == 0


def test_bytes_counts_merged_deltas_and_returns_to_zero() -> None:
    backlog = Backlog()
    d1 = _delta("c", "m", "Hello")
    d2 = _delta("c", "m", ", wörld")
    tail = _message("c", "x", "t")
    backlog.push(d1)
    assert backlog.bytes == len(d1)
    backlog.push(d2)
    assert backlog.bytes == len(d1) + len(d2)
    backlog.push(tail)
    total = len(d1) + len(d2) + len(tail)
    assert backlog.bytes == total
    merged = backlog.pop()
    assert isinstance(merged, Delta) and merged.text == "Hello, wörld"
    assert backlog.bytes == total - len(merged)
    assert backlog.pop_payload() is tail
    assert backlog.bytes == 0


def test_clear_drops_everything() -> None:
    backlog = Backlog()
    backlog.push(_delta("c", "m", "a"))
    backlog.push(_delta("c", "m", "b"))
    backlog.push(_message("c", "x", "t"))
    backlog.clear()
    assert len(backlog) == 0
    assert not backlog
    assert backlog.bytes == 0
    # Nothing is left open: the next delta of that message is a new item.
    assert backlog.push(_delta("c", "m", "c")) is False
    assert len(backlog) == 1
    assert json.loads(backlog.pop_payload()) == _expected("c", "m", "c")


def test_len_and_bool() -> None:
    backlog = Backlog()
    assert len(backlog) == 0
    assert bool(backlog) is False
    backlog.push(_delta("c", "m", "a"))
    backlog.push(_delta("c", "m", "b"))
    assert len(backlog) == 1
    assert bool(backlog) is True
    backlog.pop()
    assert bool(backlog) is False


# ---------------------------------------------------------------------- exactness


def test_unicode_deltas_merge_exactly() -> None:
    parts = ["héllo ", "wörld ", "👋", "日本語", ' "quoted" ', "back\\slash", "\n\t", "\u2028"]
    backlog = Backlog()
    for part in parts:
        backlog.push(_delta("c", "m", part))
    assert len(backlog) == 1
    assert backlog.merged == len(parts) - 1
    frame = json.loads(backlog.pop_payload())
    assert frame == _expected("c", "m", "".join(parts))


def test_merged_text_equals_the_concatenation_of_many_tokens() -> None:
    tokens = [f"tok{i}{'é' if i % 3 == 0 else ''} " for i in range(1000)]
    backlog = Backlog()
    for token in tokens:
        backlog.push(_delta("chat-1", "reply-1", token))
    assert backlog.merged == 999
    (payload,) = _drain(backlog)
    assert json.loads(payload) == _expected("chat-1", "reply-1", "".join(tokens))


def test_a_merged_delta_stops_growing_at_the_limit() -> None:
    backlog = Backlog()
    backlog.push(_delta("c", "m", "a" * (MAX_MERGED_CHARS - 1)))
    assert backlog.push(_delta("c", "m", "b")) is True
    assert backlog.push(_delta("c", "m", "c")) is False
    first, second = _drain(backlog)
    assert json.loads(first)["delta"] == "a" * (MAX_MERGED_CHARS - 1) + "b"
    assert json.loads(second) == _expected("c", "m", "c")


# ------------------------------------------------------------------ window queue


def test_window_take_returns_each_message_merged_with_its_last_seq() -> None:
    queue = DeltaQueue()
    queue.push(_delta("c", "a", "1"), seq=4)
    queue.push(_delta("c", "b", "x"), seq=5)
    queue.push(_delta("c", "a", "2"), seq=6)
    taken: list[tuple[int, Outgoing]] = queue.take()
    assert [(seq, item) for seq, item in taken] == [
        (6, _delta("c", "a", "12")),
        (5, _delta("c", "b", "x")),
    ]
    assert not queue and queue.bytes == 0 and queue.take() == []
