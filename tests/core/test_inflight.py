"""Tests for token_relay.core.inflight: messages in progress by channel, and their owners."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.inflight import InflightIndex
from token_relay.core.protocol import ProducerEvent
from token_relay.core.streams import Applied, MessageStreams


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


# ------------------------------------------------------------------------ ownership


def test_the_first_claim_wins_and_the_holder_may_claim_again() -> None:
    index: InflightIndex[str] = InflightIndex()
    assert index.claim("c", "a", "m")
    assert not index.claim("c", "b", "m")
    assert index.claim("c", "a", "m")
    assert index.claim("d", "b", "m")  # another channel: another message
    assert (index.holder("c", "m"), index.owners("c", "m"), len(index)) == ("a", ["a"], 2)


def test_who_may_publish_a_message() -> None:
    index: InflightIndex[str] = InflightIndex()
    # Nobody holds the id: a one-shot message may, a message that claimed it earlier may not.
    assert index.may_publish("c", "a", "m", claimed=False)
    assert not index.may_publish("c", "a", "m", claimed=True)
    index.claim("c", "a", "m")
    assert index.may_publish("c", "a", "m", claimed=True)
    assert index.may_publish("c", "a", "m", claimed=False)
    assert not index.may_publish("c", "b", "m", claimed=True)
    assert not index.may_publish("c", "b", "m", claimed=False)
    index.remove("c", "a", "m")
    assert not index.may_publish("c", "a", "m", claimed=True)


class _Producer:
    """A producer's side of the rule, as the edge plays it: its streams, refused at once
    when the index refuses its claim or its publication."""

    def __init__(self, name: str, index: InflightIndex[str], clock: list[float] | None = None):
        self.name, self.index, self.clock = name, index, clock or [0.0]
        self.streams = MessageStreams("c")
        self.delivered: list[str] = []
        self.refused: list[str] = []
        self.acked_again: list[str] = []

    def send(self, delta: str, final: bool = False) -> None:
        try:
            applied = self.streams.receive(ProducerEvent(id="m", delta=delta, final=final))
        except FrameRejected as exc:
            assert exc.code is ErrorCode.ID_IN_USE
            self.refused.append("final" if final else "delta")
            return
        assert isinstance(applied, Applied)
        now = self.clock[0]
        if (
            applied.opened
            and applied.text is None
            and not self.index.claim("c", self.name, "m", now)
        ):
            self.streams.refuse("m")
            self.refused.append("delta")
            return
        if applied.text is None:
            return
        if not applied.first_completion:
            self.acked_again.append(applied.text)  # a repeated final: acked, not published
            return
        if not self.index.may_publish("c", self.name, "m", not applied.opened, now):
            self.streams.refuse("m")
            self.refused.append("final")
            return
        self.index.end("c", self.name, "m", now)
        self.delivered.append(applied.text)


@pytest.mark.parametrize("order", ["ab", "ba"])
@pytest.mark.parametrize("finals", ["winner first", "loser first"])
def test_two_producers_one_id_in_both_orders_one_message(order: str, finals: str) -> None:
    index: InflightIndex[str] = InflightIndex()
    producers = {"a": _Producer("a", index), "b": _Producer("b", index)}
    first, second = (producers[name] for name in order)
    first.send(f"{first.name}1")
    second.send(f"{second.name}1")
    assert (first.refused, second.refused) == ([], ["delta"])
    second.send(f"{second.name}2")  # every later event of the refused message is refused
    ends = [first, second] if finals == "winner first" else [second, first]
    for producer in ends:
        producer.send("!", final=True)
    assert first.delivered == [f"{first.name}1!"]
    assert (second.delivered, second.refused) == ([], ["delta", "delta", "final"])
    assert len(index) == 0


@pytest.mark.parametrize("holder_ends", [False, True])
def test_a_one_shot_message_is_refused_while_another_producer_holds_its_id(
    holder_ends: bool,
) -> None:
    index: InflightIndex[str] = InflightIndex()
    holder, shot = _Producer("a", index), _Producer("b", index)
    holder.send("x")
    shot.send("y", final=True)
    assert (shot.delivered, shot.refused) == ([], ["final"])
    if holder_ends:
        holder.send("", final=True)
    shot.send("y", final=True)  # sent again: refused, even once the id is free
    assert (shot.delivered, shot.refused) == ([], ["final", "final"])
    assert holder.delivered == (["x"] if holder_ends else [])


# ------------------------------------------------------------------------ holds after the end


def test_an_ended_id_is_held_for_its_owner_until_the_hold_ends() -> None:
    index: InflightIndex[str] = InflightIndex(hold=60.0)
    assert index.claim("c", "a", "m", now=100.0)
    index.end("c", "a", "m", now=110.0)
    assert (len(index), index.holder("c", "m"), index.held("c", "m", 110.0)) == (0, None, "a")
    assert not index.claim("c", "b", "m", now=110.0)
    assert not index.claim("c", "b", "m", now=169.999)
    assert not index.may_publish("c", "b", "m", claimed=False, now=169.999)
    assert index.in_channel("c") == []  # a refused claim lists nothing
    assert index.held("c", "m", 170.0) is None  # ended 60 s ago: free
    assert index.may_publish("c", "b", "m", claimed=False, now=170.0)
    assert index.claim("c", "b", "m", now=170.0)
    assert (index.holder("c", "m"), index.held_count) == ("b", 0)


def test_a_hold_keeps_what_was_published_while_nobody_has_the_id_in_progress() -> None:
    index: InflightIndex[str] = InflightIndex(hold=60.0)
    index.end("c", "a", "m", now=10.0, published=("digest", 1))  # a one-shot message
    assert index.published("c", "m", 69.999) == ("digest", 1)
    assert index.published("c", "n", 11.0) is None  # another id
    assert index.published("d", "m", 11.0) is None  # another channel
    assert index.claim("c", "a", "m", now=20.0)  # its owner opens it again: in progress
    assert index.published("c", "m", 21.0) is None
    index.end("c", "a", "m", now=30.0, published=("other", 2))
    assert index.published("c", "m", 31.0) == ("other", 2)
    assert index.published("c", "m", 90.0) is None  # the hold ended
    index.end("c", "b", "n", now=100.0, completed=False, published=("x", 3))  # aborted
    assert index.published("c", "n", 100.0) is None
    assert InflightIndex[str](hold=0.0).published("c", "m", 0.0) is None


def test_an_aborted_id_is_not_held() -> None:
    index: InflightIndex[str] = InflightIndex(hold=60.0)
    index.claim("c", "a", "m", now=0.0)
    assert not index.claim("c", "b", "m", now=1.0)  # in progress: refused
    index.end("c", "a", "m", now=5.0, completed=False)  # aborted: nothing reached anyone
    assert (index.held("c", "m", 6.0), index.held_count) == (None, 0)
    assert index.may_publish("c", "b", "m", claimed=False, now=6.0)
    assert index.claim("c", "b", "m", now=6.0)  # a new session sending it again whole


def test_the_owner_of_a_held_id_may_publish_and_open_it_again() -> None:
    index: InflightIndex[str] = InflightIndex(hold=60.0)
    index.claim("c", "a", "m", now=0.0)
    index.end("c", "a", "m", now=1.0)
    assert index.may_publish("c", "a", "m", claimed=False, now=2.0)  # a final sent again
    assert index.claim("c", "a", "m", now=2.0)
    assert not index.claim("c", "b", "m", now=2.0)  # in progress again
    index.end("c", "a", "m", now=30.0)  # the hold starts again from its new end
    assert not index.claim("c", "b", "m", now=89.0)
    assert index.claim("c", "b", "m", now=90.0)


def test_a_held_id_is_free_on_another_channel() -> None:
    index: InflightIndex[str] = InflightIndex(hold=60.0)
    index.claim("c", "a", "m", now=0.0)
    index.end("c", "a", "m", now=0.0)
    assert index.claim("d", "b", "m", now=1.0)
    assert index.may_publish("e", "b", "m", claimed=False, now=1.0)
    assert not index.claim("c", "b", "m", now=1.0)


def test_a_hold_of_zero_frees_the_id_at_once() -> None:
    index: InflightIndex[str] = InflightIndex(hold=0.0)
    index.claim("c", "a", "m", now=0.0)
    index.end("c", "a", "m", now=0.0)
    assert (index.held_count, index.claim("c", "b", "m", now=0.0)) == (0, True)


def test_holds_are_pruned_in_time_and_capped_in_count_oldest_first() -> None:
    index: InflightIndex[str] = InflightIndex(hold=10.0, max_held=3)
    for n, message_id in enumerate("wxyz"):
        index.claim("c", "a", message_id, now=float(n))
        index.end("c", "a", message_id, now=float(n))
    # Four holds, three kept: the oldest (w, ended at 0) ended early.
    assert index.held_count == 3
    assert index.claim("c", "b", "w", now=4.0)
    assert [index.claim("c", "b", i, now=4.0) for i in "xyz"] == [False, False, False]
    assert index.held("c", "y", now=12.0) is None  # x and y ended at 1 and 2: pruned
    assert (index.held_count, index.held("c", "z", now=12.0)) == (1, "a")


def test_holds_are_capped_in_characters_oldest_first() -> None:
    index: InflightIndex[str] = InflightIndex(hold=10.0, max_held_chars=10)
    for message_id in ("aaaa", "bbbb"):  # 1 + 4 characters each, with the channel's name
        index.end("c", "a", message_id, now=0.0)
    assert (index.held_count, index.held_chars) == (2, 10)
    index.end("c", "a", "bbbb", now=1.0)  # ended again: counted once
    assert (index.held_count, index.held_chars) == (2, 10)
    index.end("c", "a", "x", now=1.0)  # 2 more: past 10, the oldest (aaaa) ends early
    assert [index.held("c", i, now=1.0) for i in ("aaaa", "bbbb", "x")] == [None, "a", "a"]
    assert index.held_chars == 7
    assert index.held("c", "x", now=11.0) is None
    assert (index.held_count, index.held_chars) == (0, 0)  # all pruned by time


def test_an_id_ended_again_moves_to_the_end_of_the_hold_order() -> None:
    index: InflightIndex[str] = InflightIndex(hold=10.0, max_held=2)
    for message_id, now in (("x", 0.0), ("y", 1.0), ("x", 2.0), ("z", 3.0)):
        index.claim("c", "a", message_id, now=now)
        index.end("c", "a", message_id, now=now)
    assert [index.held("c", i, now=3.0) for i in "xyz"] == ["a", None, "a"]


@pytest.mark.parametrize("order", ["ab", "ba"])
@pytest.mark.parametrize("gap", ["overlapping", "after the end", "after the hold"])
def test_two_producers_each_send_a_delta_and_a_final_under_one_id(order: str, gap: str) -> None:
    """The attack, step by step: both producers send a delta, then a final, for one id."""
    index: InflightIndex[str] = InflightIndex(hold=60.0)
    clock = [0.0]
    producers = {name: _Producer(name, index, clock) for name in "ab"}
    first, second = (producers[name] for name in order)
    if gap == "overlapping":
        first.send("1")
        second.send("2")
        first.send("!", final=True)
        second.send("?", final=True)
    else:
        first.send("1")
        first.send("!", final=True)
        clock[0] = 59.0 if gap == "after the end" else 60.0
        second.send("2")
        second.send("?", final=True)
    first.send("!", final=True)  # the winner's final sent again: acked, not refused
    assert (first.delivered, first.refused, first.acked_again) == (["1!"], [], ["1!"])
    # Its final retried after the broker was down is published as a one-shot: not refused,
    # unless the id is the other producer's now.
    retried = index.may_publish("c", first.name, "m", claimed=False, now=clock[0])
    assert retried is (gap != "after the hold")
    if gap == "after the hold":
        assert (second.delivered, second.refused) == (["2?"], [])
    else:
        assert (second.delivered, second.refused) == ([], ["delta", "final"])


@pytest.mark.parametrize("gap", [59.0, 60.0])
def test_a_one_shot_message_under_a_held_id(gap: float) -> None:
    index: InflightIndex[str] = InflightIndex(hold=60.0)
    clock = [0.0]
    holder, shot = _Producer("a", index, clock), _Producer("b", index, clock)
    holder.send("x", final=True)
    clock[0] = gap
    shot.send("y", final=True)
    assert holder.delivered == ["x"]
    assert (shot.delivered, shot.refused) == ((["y"], []) if gap == 60.0 else ([], ["final"]))


class _Holds:
    """The rule for holds, written plainly: an ordered map pruned from the front, whole,
    at every call (the index skips that walk while its first hold has not ended)."""

    def __init__(self, hold: float, max_held: int, max_held_chars: int) -> None:
        self.hold, self.max_held, self.max_held_chars = hold, max_held, max_held_chars
        self.held: dict[tuple[str, str], tuple[str, float]] = {}

    def chars(self) -> int:
        return sum(len(channel) + len(message_id) for channel, message_id in self.held)

    def prune(self, now: float) -> None:
        while self.held:
            key, (_, until) = next(iter(self.held.items()))
            if until > now:
                return
            del self.held[key]

    def end(self, channel: str, owner: str, message_id: str, now: float) -> None:
        if self.hold <= 0:
            return
        self.prune(now)
        self.held.pop((channel, message_id), None)
        self.held[(channel, message_id)] = (owner, now + self.hold)
        while len(self.held) > self.max_held or self.chars() > self.max_held_chars:
            del self.held[next(iter(self.held))]

    def of(self, channel: str, message_id: str, now: float) -> str | None:
        self.prune(now)
        entry = self.held.get((channel, message_id))
        return None if entry is None else entry[0]


_HOLD_CALLS = st.lists(
    st.tuples(
        st.sampled_from(["end", "held", "claim"]),
        st.sampled_from(["c", "d"]),
        st.sampled_from(["a", "b"]),
        st.sampled_from(["x", "y", "zz"]),
        st.integers(0, 30).map(float),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@example(  # x's hold is first, ended again earlier: y's then comes first, and ends first
    calls=[
        ("end", "c", "a", "x", 20.0),
        ("end", "c", "a", "y", 0.0),
        ("end", "c", "a", "x", 0.0),
        ("held", "c", "a", "y", 12.0),
    ],
    hold=10.0,
    max_held=4,
    max_held_chars=12,
    ordered=False,
)
@given(
    calls=_HOLD_CALLS,
    hold=st.sampled_from([0.0, 1.0, 3.0, 10.0]),
    max_held=st.integers(1, 4),
    max_held_chars=st.integers(2, 12),
    ordered=st.booleans(),
)
def test_holds_match_the_plain_rule_whatever_the_calls_and_clocks(
    calls: list[tuple[str, str, str, str, float]],
    hold: float,
    max_held: int,
    max_held_chars: int,
    ordered: bool,
) -> None:
    """Holds end, are capped and are looked up exactly as the plain rule says, for any
    sequence of ends, claims and lookups; with clocks that run forward (``ordered``) as
    the relay's do, and with clocks that jump back and forth."""
    if ordered:
        times = sorted(now for *_, now in calls)
        calls = [(*call[:4], now) for call, now in zip(calls, times, strict=True)]
    index: InflightIndex[str] = InflightIndex(hold, max_held, max_held_chars)
    plain = _Holds(hold, max_held, max_held_chars)
    for kind, channel, owner, message_id, now in calls:
        if kind == "end":
            index.claim(channel, owner, message_id, now)
            index.end(channel, owner, message_id, now)
            plain.end(channel, owner, message_id, now)
        elif kind == "claim":
            holder = plain.of(channel, message_id, now)
            expected = holder is None or holder == owner
            # The claim first, so that it prunes the holds due by itself.
            assert index.claim(channel, owner, message_id, now) is expected
            assert index.held(channel, message_id, now) == holder
            if expected:
                index.remove(channel, owner, message_id)  # aborted: holds nothing
        else:
            assert index.held(channel, message_id, now) == plain.of(channel, message_id, now)
        assert index.held_count == len(plain.held)
        assert index.held_chars == plain.chars()
