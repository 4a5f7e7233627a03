"""The Redis writer joins a message's deltas within one write batch, step by step: text and
order per message kept, nothing joined across another write, the last seq kept."""

from __future__ import annotations

from token_relay.brokers.redis import _merge_deltas, _Write


def _delta(message: str, text: str, seq: int = 0) -> _Write:
    target = ("c", "owner", message)
    return _Write("delta", [f"keys-of-{message}"], [text, message, 60, 60, "owner", seq, "c"],
                  message=target)  # fmt: skip


def _other(name: str) -> _Write:
    return _Write(name, [], [])


def test_a_run_of_one_messages_deltas_is_one_write_with_its_last_seq() -> None:
    merged = _merge_deltas([_delta("m", "Hel", 1), _delta("m", "lo", 2), _delta("m", " 👋", 0)])
    assert len(merged) == 1
    assert merged[0].args[0] == "Hello 👋" and merged[0].args[5] == 2
    assert merged[0].keys == ["keys-of-m"] and merged[0].message == ("c", "owner", "m")


def test_interleaved_messages_each_keep_their_own_text_in_order() -> None:
    batch = [_delta("a", "1"), _delta("b", "x"), _delta("a", "2"), _delta("b", "y")]
    merged = _merge_deltas(batch)
    assert [(w.message and w.message[2], w.args[0]) for w in merged] == [("a", "12"), ("b", "xy")]


def test_no_delta_is_joined_across_another_write() -> None:
    terminal, progress = _other("terminal"), _other("progress")
    batch = [_delta("m", "a"), terminal, _delta("m", "b"), _delta("m", "c"), progress,
             _delta("m", "d")]  # fmt: skip
    merged = _merge_deltas(batch)
    assert [w.script for w in merged] == ["delta", "terminal", "delta", "progress", "delta"]
    assert [w.args[0] for w in merged if w.script == "delta"] == ["a", "bc", "d"]
    assert merged[1] is terminal and merged[3] is progress
    assert _merge_deltas([]) == []
