"""The rules of channels read as Durable Streams: names, offsets, reads, bodies."""

from __future__ import annotations

import pytest
from token_relay.core.durablechannels import (
    ChannelPosition,
    Items,
    channel_of,
    channel_offset,
    etag,
    from_start,
    items_body,
    judge_read,
    position_of_offset,
    within,
)
from token_relay.core.errors import StreamRefused

EPOCH = "k3J9xQ2v_m0A"


def test_a_name_under_the_prefix_is_its_channel_percent_decoded() -> None:
    assert channel_of("__channel/chat-42") == "chat-42"
    assert channel_of("__channel/chat%2042") == "chat 42"
    assert channel_of("__channel/a/b") == "a/b"
    assert channel_of("chat-42") is None
    assert channel_of("__ds/subscriptions/x") is None


@pytest.mark.parametrize("name", ["__channel/", "__channel/" + "x" * 257])
def test_a_name_under_the_prefix_that_is_no_channel_is_refused(name: str) -> None:
    with pytest.raises(StreamRefused) as refused:
        channel_of(name)
    assert (refused.value.status, refused.value.code) == (400, "bad_path")


def test_offsets_are_the_channel_positions_and_back() -> None:
    position = ChannelPosition(17, EPOCH)
    assert channel_offset(position) == "k3J9xQ2v_m0A_0000000000000017"
    assert position_of_offset("k3J9xQ2v_m0A_0000000000000017") == position
    assert channel_offset(ChannelPosition(9, EPOCH)) < channel_offset(ChannelPosition(10, EPOCH))


@pytest.mark.parametrize(
    "offset",
    [
        "",
        "_0000000000000001",
        "k3J9_000000000000001",
        "k3J9_00000000000000001",
        "k3J9_000000000000001x",
        "k3J9_" + "\uff10" * 15 + "1",  # str.isdigit takes fullwidth digits
        "k3/9_0000000000000001",
        "k3J9",
        "x" * 65 + "_0000000000000001",
    ],
)
def test_an_offset_the_relay_did_not_make_is_a_bad_offset(offset: str) -> None:
    with pytest.raises(StreamRefused) as refused:
        position_of_offset(offset)
    assert (refused.value.status, refused.value.code) == (400, "bad_offset")


def test_a_recovered_read_is_the_frames_up_to_the_tail() -> None:
    since, tail = ChannelPosition(2, EPOCH), ChannelPosition(4, EPOCH)
    items = judge_read(since, tail, True, ['{"offset":3}', '{"offset":4}'])
    assert items == Items(['{"offset":3}', '{"offset":4}'], since, tail)
    assert items_body(items.frames) == b'[{"offset":3},{"offset":4}]'
    assert etag(items) == '"k3J9xQ2v_m0A:2:4"'


def test_a_read_history_cannot_close_is_gone_and_one_past_the_tail_is_bad() -> None:
    tail = ChannelPosition(4, EPOCH)
    with pytest.raises(StreamRefused) as gone:
        judge_read(ChannelPosition(1, EPOCH), tail, False, [])
    assert (gone.value.status, gone.value.code) == (410, "offset_gone")
    with pytest.raises(StreamRefused) as other_epoch:
        judge_read(ChannelPosition(1, "another"), tail, False, [])
    assert (other_epoch.value.status, other_epoch.value.code) == (410, "offset_gone")
    with pytest.raises(StreamRefused) as future:
        judge_read(ChannelPosition(5, EPOCH), tail, False, [])
    assert (future.value.status, future.value.code) == (400, "bad_offset")


def test_a_read_from_the_start_begins_before_the_run_history_holds() -> None:
    tail = ChannelPosition(10, EPOCH)
    items = from_start(tail, ["a", "b", "c"])
    assert items.start == ChannelPosition(7, EPOCH)
    assert items.end == tail
    assert from_start(ChannelPosition(0, EPOCH), []).start == ChannelPosition(0, EPOCH)
    assert items_body([]) == b"[]"


def test_a_read_past_its_budget_ends_short_of_the_tail_with_at_least_one_frame() -> None:
    since, tail = ChannelPosition(2, EPOCH), ChannelPosition(5, EPOCH)
    frames = ['{"n":3}', '{"n":4}', '{"n":5}']  # 7 bytes each, and a comma or bracket
    # "[" + 7 + "," + 7 + "]": two frames fit in 17 bytes, not three.
    two = within(Items(frames, since, tail), 17)
    assert two == Items(frames[:2], since, ChannelPosition(4, EPOCH), up_to_date=False)
    assert within(Items(frames, since, tail), 25) == Items(frames, since, tail)
    one = within(Items(frames, since, tail), 1)  # a frame larger than the budget still goes
    assert one == Items(frames[:1], since, ChannelPosition(3, EPOCH), up_to_date=False)
    assert etag(two) != etag(Items(frames, since, tail))
    # The next read goes on from where the short one ended.
    rest = judge_read(two.end, tail, True, frames[2:])
    assert rest == Items(frames[2:], two.end, tail)
