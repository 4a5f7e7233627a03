"""Tests for token_relay.core.backlog: a slow subscriber's queue, with its pending deltas merged."""

from __future__ import annotations

import json
from typing import Any

from token_relay.core.backlog import Backlog
from token_relay.core.protocol import (
    Aborted,
    AbortReason,
    DeltaFrame,
    MessageFrame,
    Snapshot,
    encode,
)


def _delta(channel: str, message_id: str, delta: str) -> str:
    return encode(DeltaFrame(channel=channel, id=message_id, delta=delta))


def _delta_bytes(channel: str, message_id: str, delta: str) -> bytes:
    return _delta(channel, message_id, delta).encode()


def _message(channel: str, message_id: str, text: str, offset: int = 1) -> str:
    return encode(MessageFrame(channel=channel, id=message_id, text=text, offset=offset, epoch="e"))


def _expected(channel: str, message_id: str, delta: str) -> dict[str, Any]:
    return {"type": "delta", "channel": channel, "id": message_id, "delta": delta}


def _drain(backlog: Backlog) -> list[str | bytes]:
    out = []
    while backlog:
        out.append(backlog.pop())
    return out


# ------------------------------------------------------------------------ merging


def test_single_delta_is_returned_as_is() -> None:
    backlog = Backlog()
    assert backlog.add(_delta("c", "m", "hi"), is_delta=True) is False
    assert len(backlog) == 1
    assert json.loads(backlog.pop()) == _expected("c", "m", "hi")
    assert len(backlog) == 0
    assert backlog.merged == 0


def test_consecutive_deltas_of_one_message_merge_into_one_frame() -> None:
    backlog = Backlog()
    assert backlog.add(_delta("c", "m", "Hel"), is_delta=True) is False
    assert backlog.add(_delta("c", "m", "lo"), is_delta=True) is True
    assert backlog.add(_delta("c", "m", ", world"), is_delta=True) is True
    assert len(backlog) == 1
    assert backlog.merged == 2
    assert json.loads(backlog.pop()) == _expected("c", "m", "Hello, world")
    assert not backlog


def test_bytes_deltas_merge() -> None:
    backlog = Backlog()
    assert backlog.add(_delta_bytes("c", "m", "ab"), is_delta=True) is False
    assert backlog.add(_delta_bytes("c", "m", "cd"), is_delta=True) is True
    assert backlog.add(_delta("c", "m", "ef"), is_delta=True) is True
    assert len(backlog) == 1
    assert json.loads(backlog.pop()) == _expected("c", "m", "abcdef")


def test_deltas_of_different_messages_stay_separate_and_in_order() -> None:
    backlog = Backlog()
    backlog.add(_delta("c", "a", "A1"), is_delta=True)
    backlog.add(_delta("c", "b", "B1"), is_delta=True)
    backlog.add(_delta("c", "a", "A2"), is_delta=True)
    backlog.add(_delta("c", "b", "B2"), is_delta=True)
    backlog.add(_delta("c", "c", "C1"), is_delta=True)
    assert len(backlog) == 3
    assert backlog.merged == 2
    assert [json.loads(p) for p in _drain(backlog)] == [
        _expected("c", "a", "A1A2"),
        _expected("c", "b", "B1B2"),
        _expected("c", "c", "C1"),
    ]


def test_same_id_on_different_channels_is_not_merged() -> None:
    backlog = Backlog()
    backlog.add(_delta("c1", "m", "x"), is_delta=True)
    assert backlog.add(_delta("c2", "m", "y"), is_delta=True) is False
    assert backlog.add(_delta("c1", "m", "z"), is_delta=True) is True
    assert [json.loads(p) for p in _drain(backlog)] == [
        _expected("c1", "m", "xz"),
        _expected("c2", "m", "y"),
    ]


def test_a_frame_of_the_same_message_closes_merging() -> None:
    backlog = Backlog()
    message = _message("c", "m", "ab")
    backlog.add(_delta("c", "m", "a"), is_delta=True)
    backlog.add(message)
    assert backlog.add(_delta("c", "m", "b"), is_delta=True) is False
    assert backlog.add(_delta("c", "m", "c"), is_delta=True) is True
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
    backlog.add(_delta("c", "m", "a"), is_delta=True)
    backlog.add(snapshot)
    backlog.add(_delta("c", "m", "b"), is_delta=True)
    backlog.add(aborted)
    backlog.add(_delta("c", "m", "c"), is_delta=True)
    assert backlog.merged == 0
    out = _drain(backlog)
    assert out[1] is snapshot
    assert out[3] is aborted
    assert [json.loads(out[i])["delta"] for i in (0, 2, 4)] == ["a", "b", "c"]


def test_a_frame_of_another_message_does_not_close_merging() -> None:
    backlog = Backlog()
    other = _message("c", "other", "done")
    backlog.add(_delta("c", "m", "1"), is_delta=True)
    backlog.add(other)
    assert backlog.add(_delta("c", "m", "2"), is_delta=True) is True
    first, second = _drain(backlog)
    assert json.loads(first) == _expected("c", "m", "12")
    assert second is other


def test_delta_after_its_merged_frame_was_popped_starts_a_new_item() -> None:
    backlog = Backlog()
    backlog.add(_delta("c", "m", "a"), is_delta=True)
    backlog.add(_delta("c", "m", "b"), is_delta=True)
    assert json.loads(backlog.pop()) == _expected("c", "m", "ab")
    assert backlog.add(_delta("c", "m", "c"), is_delta=True) is False
    assert backlog.add(_delta("c", "m", "d"), is_delta=True) is True
    assert len(backlog) == 1
    assert json.loads(backlog.pop()) == _expected("c", "m", "cd")
    assert backlog.merged == 2


def test_popping_a_closed_item_keeps_the_newer_one_open() -> None:
    backlog = Backlog()
    snapshot = encode(Snapshot(channel="c", id="m", text="a"))
    backlog.add(_delta("c", "m", "a"), is_delta=True)
    backlog.add(snapshot)
    backlog.add(_delta("c", "m", "b"), is_delta=True)
    assert json.loads(backlog.pop()) == _expected("c", "m", "a")
    assert backlog.add(_delta("c", "m", "c"), is_delta=True) is True
    assert backlog.pop() is snapshot
    assert json.loads(backlog.pop()) == _expected("c", "m", "bc")
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
        assert backlog.add(frame) is False
    assert len(backlog) == len(frames)
    out = _drain(backlog)
    assert out == frames
    assert [type(p) for p in out] == [type(f) for f in frames]
    assert backlog.merged == 0


def test_non_delta_frames_kept_between_merged_deltas() -> None:
    backlog = Backlog()
    first = _message("x", "done", "t", 1)
    second = _message("x", "done2", "u", 2).encode()
    backlog.add(_delta("c", "m", "a"), is_delta=True)
    backlog.add(first)
    backlog.add(_delta("c", "m", "b"), is_delta=True)
    backlog.add(second)
    backlog.add(_delta("c", "n", "z"), is_delta=True)
    backlog.add(_delta("c", "m", "c"), is_delta=True)
    out = _drain(backlog)
    assert len(out) == 4
    assert json.loads(out[0]) == _expected("c", "m", "abc")
    assert out[1] is first
    assert out[2] is second
    assert json.loads(out[3]) == _expected("c", "n", "z")


# ------------------------------------------------------------------------ counters


def test_merged_counts_every_merge() -> None:
    backlog = Backlog()
    assert backlog.merged == 0
    backlog.add(_delta("c", "a", "1"), is_delta=True)
    backlog.add(_message("c", "x", "t"))
    assert backlog.merged == 0
    backlog.add(_delta("c", "a", "2"), is_delta=True)
    backlog.add(_delta("c", "b", "1"), is_delta=True)
    backlog.add(_delta("c", "b", "2"), is_delta=True)
    backlog.add(_delta("c", "a", "3"), is_delta=True)
    assert backlog.merged == 3
    _drain(backlog)
    assert backlog.merged == 3


def test_bytes_grows_with_each_frame_and_returns_to_zero() -> None:
    backlog = Backlog()
    first = _message("c", "a", "one")
    second = _message("c", "b", "twö").encode()
    backlog.add(first)
    assert backlog.bytes == len(first)
    backlog.add(second)
    assert backlog.bytes == len(first) + len(second)
    assert backlog.pop() is first
    assert backlog.bytes == len(second)
    assert backlog.pop() is second
    assert backlog.bytes == 0


def test_bytes_counts_merged_deltas_and_returns_to_zero() -> None:
    backlog = Backlog()
    d1 = _delta("c", "m", "Hello")
    d2 = _delta_bytes("c", "m", ", wörld")
    tail = _message("c", "x", "t")
    backlog.add(d1, is_delta=True)
    assert backlog.bytes == len(d1)
    backlog.add(d2, is_delta=True)
    assert backlog.bytes == len(d1) + len(d2)
    backlog.add(tail)
    total = len(d1) + len(d2) + len(tail)
    assert backlog.bytes == total
    merged = backlog.pop()
    assert backlog.bytes == total - len(merged)
    assert backlog.pop() is tail
    assert backlog.bytes == 0


def test_clear_drops_everything() -> None:
    backlog = Backlog()
    backlog.add(_delta("c", "m", "a"), is_delta=True)
    backlog.add(_delta("c", "m", "b"), is_delta=True)
    backlog.add(_message("c", "x", "t"))
    backlog.clear()
    assert len(backlog) == 0
    assert not backlog
    assert backlog.bytes == 0
    # Nothing is left open: the next delta of that message is a new item.
    assert backlog.add(_delta("c", "m", "c"), is_delta=True) is False
    assert len(backlog) == 1
    assert json.loads(backlog.pop()) == _expected("c", "m", "c")


def test_len_and_bool() -> None:
    backlog = Backlog()
    assert len(backlog) == 0
    assert bool(backlog) is False
    backlog.add(_delta("c", "m", "a"), is_delta=True)
    backlog.add(_delta("c", "m", "b"), is_delta=True)
    assert len(backlog) == 1
    assert bool(backlog) is True
    backlog.pop()
    assert bool(backlog) is False


# ---------------------------------------------------------------------- exactness


def test_unicode_deltas_merge_exactly() -> None:
    parts = ["héllo ", "wörld ", "👋", "日本語", ' "quoted" ', "back\\slash", "\n\t", "\u2028"]
    backlog = Backlog()
    for i, part in enumerate(parts):
        payload: str | bytes = _delta("c", "m", part)
        if i % 2:
            payload = payload.encode()
        backlog.add(payload, is_delta=True)
    # An ASCII-escaped encoding of the same frame merges the same way.
    backlog.add(json.dumps(_expected("c", "m", "é€")).encode(), is_delta=True)
    assert len(backlog) == 1
    assert backlog.merged == len(parts)
    frame = json.loads(backlog.pop())
    assert frame == _expected("c", "m", "".join(parts) + "é€")


def test_merged_text_equals_the_concatenation_of_many_tokens() -> None:
    tokens = [f"tok{i}{'é' if i % 3 == 0 else ''} " for i in range(1000)]
    backlog = Backlog()
    for token in tokens:
        backlog.add(_delta("chat-1", "reply-1", token), is_delta=True)
    assert backlog.merged == 999
    (payload,) = _drain(backlog)
    assert json.loads(payload) == _expected("chat-1", "reply-1", "".join(tokens))
