"""Tests for token_relay.core.inflight: messages in progress by channel, and their owners."""

from __future__ import annotations

from token_relay.core.inflight import InflightIndex


def test_empty_index() -> None:
    index: InflightIndex[str] = InflightIndex()
    assert len(index) == 0
    assert index.in_channel("c") == []
    assert index.owners("c", "m") == []


def test_add_then_in_channel_and_owners() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("c", "p1", "m")
    assert index.in_channel("c") == [("p1", "m")]
    assert index.owners("c", "m") == ["p1"]
    assert len(index) == 1


def test_in_channel_is_in_open_order() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("c", "p1", "z")
    index.add("c", "p2", "a")
    index.add("c", "p1", "m")
    assert index.in_channel("c") == [("p1", "z"), ("p2", "a"), ("p1", "m")]


def test_re_adding_keeps_the_original_position_and_count() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("c", "p1", "a")
    index.add("c", "p1", "b")
    index.add("c", "p1", "a")
    assert index.in_channel("c") == [("p1", "a"), ("p1", "b")]
    assert len(index) == 2


def test_channels_are_separate() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("x", "p1", "m")
    index.add("y", "p1", "n")
    assert index.in_channel("x") == [("p1", "m")]
    assert index.in_channel("y") == [("p1", "n")]
    assert index.owners("x", "n") == []
    assert index.owners("y", "n") == ["p1"]
    assert len(index) == 2


def test_two_owners_of_the_same_id() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("c", "p1", "m")
    index.add("c", "p2", "m")
    index.add("c", "p2", "other")
    assert index.owners("c", "m") == ["p1", "p2"]
    assert index.owners("c", "other") == ["p2"]
    assert len(index) == 3
    index.remove("c", "p1", "m")
    assert index.owners("c", "m") == ["p2"]
    assert index.in_channel("c") == [("p2", "m"), ("p2", "other")]


def test_owners_of_unknown_id_or_channel() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("c", "p1", "m")
    assert index.owners("c", "nope") == []
    assert index.owners("other", "m") == []


def test_remove() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("c", "p1", "a")
    index.add("c", "p1", "b")
    index.remove("c", "p1", "a")
    assert index.in_channel("c") == [("p1", "b")]
    assert index.owners("c", "a") == []
    assert len(index) == 1


def test_remove_needs_the_right_owner_and_channel() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("c", "p1", "m")
    index.remove("c", "p2", "m")
    index.remove("other", "p1", "m")
    assert index.in_channel("c") == [("p1", "m")]
    assert len(index) == 1


def test_remove_unknown_is_a_no_op() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.remove("c", "p1", "m")
    index.add("c", "p1", "m")
    index.remove("c", "p1", "m")
    index.remove("c", "p1", "m")
    assert len(index) == 0
    assert index.in_channel("c") == []


def test_empty_channel_is_removed() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("c", "p1", "m")
    index.add("d", "p1", "n")
    index.remove("c", "p1", "m")
    assert "c" not in index._by_channel
    assert list(index._by_channel) == ["d"]
    index.remove("d", "p1", "n")
    assert index._by_channel == {}


def test_removing_an_absent_entry_keeps_a_non_empty_channel() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("c", "p1", "m")
    index.remove("c", "p1", "absent")
    assert list(index._by_channel) == ["c"]


def test_readded_after_remove_goes_to_the_end() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("c", "p1", "a")
    index.add("c", "p1", "b")
    index.remove("c", "p1", "a")
    index.add("c", "p1", "a")
    assert index.in_channel("c") == [("p1", "b"), ("p1", "a")]


def test_in_channel_returns_a_copy() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("c", "p1", "m")
    snapshot = index.in_channel("c")
    index.remove("c", "p1", "m")
    assert snapshot == [("p1", "m")]
    assert index.in_channel("c") == []


def test_len_counts_across_channels() -> None:
    index: InflightIndex[str] = InflightIndex()
    index.add("a", "p1", "m")
    index.add("b", "p1", "m")
    index.add("b", "p2", "m")
    assert len(index) == 3
    index.remove("b", "p2", "m")
    assert len(index) == 2


def test_owners_may_be_any_hashable() -> None:
    first, second = object(), object()
    index: InflightIndex[object] = InflightIndex()
    index.add("c", first, "m")
    index.add("c", second, "m")
    assert index.owners("c", "m") == [first, second]
