"""Tests for token_relay.core.router: joins, catch-up merge, join buffers, floors, the window.

Every race between a broker frame and a joiner's catch-up read is played here step by
step, in each order: the frame published before or after the cut was read, and
arriving before or after the cut's reply.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.events import CatchUp, Delta, FrameKind, LiveMessage
from token_relay.core.router import ChannelRouter, Close, Hold, Send

T, D, SNAP = FrameKind.TERMINAL, FrameKind.DELTA, FrameKind.SNAPSHOT


def _cut(seq: int, *, offset: int = 0, live: list[LiveMessage] | None = None) -> CatchUp:
    return CatchUp(offset, "E", None, [], seq, live or [])


def _message(offset: int, message_id: str = "m", text: str = "t") -> str:
    return json.dumps({"type": "message", "channel": "c", "id": message_id, "text": text,
                       "offset": offset, "epoch": "E"})  # fmt: skip


def _sent_to(actions: list[object], subscriber: str) -> list[object]:
    """The frames ``actions`` write to ``subscriber``, in order."""
    return [a.item for a in actions if isinstance(a, Send) and subscriber in a.receivers]


def _subscribed(router: ChannelRouter[str], name: str, deltas: bool = True, seq: int = 0) -> None:
    join, _ = router.join(name, "c", deltas=deltas, resuming=False)
    router.joined(join, _cut(seq))


def _confirmation(frame: object) -> dict[str, object]:
    assert isinstance(frame, str)
    parsed: dict[str, object] = json.loads(frame)
    return parsed


# ------------------------------------------------------------------ the join


def test_joined_sends_confirmation_history_snapshots_then_what_followed() -> None:
    router: ChannelRouter[str] = ChannelRouter(10)
    join, flushed = router.join("s", "c", deltas=True, resuming=True)
    assert flushed == []
    assert router.deliver("c", D, 5, Delta("c", "m", "lo")) == []  # buffered
    assert router.deliver("c", T, 6, _message(3, "n")) == []
    cut = CatchUp(2, "E", True, [_message(1), _message(2)], 5, [LiveMessage("o", "m", "hel")])
    frames = router.joined(join, cut)
    assert _confirmation(frames[0]) == {
        "type": "subscribed", "channel": "c", "offset": 2, "epoch": "E", "recovered": True,
        "replayed": 2,
    }  # fmt: skip
    assert frames[1:3] == [_message(1), _message(2)]
    assert json.loads(frames[3]) == {"type": "snapshot", "channel": "c", "id": "m", "text": "hel"}
    # seq 5 is in the cut (its text is in the snapshot); seq 6 is not.
    assert frames[4:] == [_message(3, "n")]
    assert router.joins_in_progress() == 0


def test_snapshot_carries_only_what_positions_do_not_hold() -> None:
    router: ChannelRouter[str] = ChannelRouter(10)
    join, _ = router.join("s", "c", deltas=True, resuming=False)
    live = [LiveMessage("o", "m", "Hello"), LiveMessage("o", "n", "ab")]
    frames = router.joined(join, _cut(0, live=live), {"m": 3, "n": 9})
    assert [json.loads(f) for f in frames[1:]] == [  # type: ignore[arg-type]
        {"type": "snapshot", "channel": "c", "id": "m", "text": "lo", "from": 3},
        {"type": "snapshot", "channel": "c", "id": "n", "text": "ab"},
    ]


def test_a_subscriber_without_deltas_gets_no_snapshots_or_deltas() -> None:
    router: ChannelRouter[str] = ChannelRouter(10)
    join, _ = router.join("s", "c", deltas=False, resuming=False)
    assert router.deliver("c", D, 1, Delta("c", "m", "x")) == []
    frames = router.joined(join, _cut(0, live=[LiveMessage("o", "m", "x")]))
    assert len(frames) == 1
    assert router.deliver("c", D, 2, Delta("c", "m", "y")) == []
    assert _sent_to(router.deliver("c", T, 3, _message(1)), "s") == [_message(1)]


# ----------------------------------------------------- the race, played in every order


def test_frame_published_before_the_cut_arriving_during_the_join_is_dropped() -> None:
    router: ChannelRouter[str] = ChannelRouter(10)
    join, _ = router.join("s", "c", deltas=True, resuming=False)
    router.deliver("c", D, 7, Delta("c", "m", "é"))
    frames = router.joined(join, _cut(7, live=[LiveMessage("o", "m", "é")]))
    texts = [json.loads(f)["text"] for f in frames[1:]]  # type: ignore[arg-type]
    assert texts == ["é"]  # once, in the snapshot: never "éé"


def test_frame_published_before_the_cut_arriving_after_its_reply_is_dropped() -> None:
    # The Redis race: the cut's script ran after PUBLISH, but the pub/sub connection
    # delivers the frame only after the cut's reply came back on the other connection.
    router: ChannelRouter[str] = ChannelRouter(10)
    _subscribed(router, "old", seq=0)
    join, _ = router.join("s", "c", deltas=True, resuming=False)
    frames = router.joined(join, _cut(7, offset=3, live=[LiveMessage("o", "m", "é")]))
    assert len(frames) == 2
    late_delta = router.deliver("c", D, 6, Delta("c", "m", "é"))
    late_message = router.deliver("c", T, 7, _message(3))
    assert _sent_to(late_delta, "s") == [] and _sent_to(late_message, "s") == []
    # Everyone else still gets them.
    assert _sent_to(late_delta, "old") == [Delta("c", "m", "é")]
    assert _sent_to(late_message, "old") == [_message(3)]
    assert router.floors() == 1
    after = router.deliver("c", D, 8, Delta("c", "m", "x"))
    assert _sent_to(after, "s") == [Delta("c", "m", "x")]
    assert router.floors() == 0


def test_frame_published_after_the_cut_arriving_during_the_join_follows_the_cut() -> None:
    router: ChannelRouter[str] = ChannelRouter(10)
    join, _ = router.join("s", "c", deltas=True, resuming=False)
    router.deliver("c", D, 8, Delta("c", "m", "b"))
    frames = router.joined(join, _cut(7, live=[LiveMessage("o", "m", "a")]))
    assert frames[2:] == [Delta("c", "m", "b")]


def test_frame_published_after_the_cut_arriving_after_its_reply_is_live() -> None:
    router: ChannelRouter[str] = ChannelRouter(10)
    join, _ = router.join("s", "c", deltas=True, resuming=False)
    router.joined(join, _cut(7))
    assert _sent_to(router.deliver("c", T, 8, _message(1)), "s") == [_message(1)]


def test_resubscribing_without_since_is_still_owed_its_terminal_frames() -> None:
    router: ChannelRouter[str] = ChannelRouter(10)
    _subscribed(router, "s", deltas=False)
    join, _ = router.join("s", "c", deltas=True, resuming=False)
    router.deliver("c", T, 4, _message(1))  # in the cut, but not replayed: no since
    router.deliver("c", D, 4, Delta("c", "n", "x"))  # covered by the snapshot
    frames = router.joined(join, _cut(5, offset=2, live=[LiveMessage("o", "n", "x")]))
    assert frames[2:] == [_message(1)]
    # Late ones too: a terminal frame below the floor still reaches it, a delta does not.
    late = router.deliver("c", T, 5, _message(2))
    assert _sent_to(late, "s") == [_message(2)]
    assert _sent_to(router.deliver("c", D, 5, Delta("c", "n", "y")), "s") == []


def test_resubscribing_with_since_gets_history_from_the_cut_only() -> None:
    router: ChannelRouter[str] = ChannelRouter(10)
    _subscribed(router, "s")
    join, _ = router.join("s", "c", deltas=True, resuming=True)
    router.deliver("c", T, 4, _message(1))
    frames = router.joined(join, CatchUp(1, "E", True, [_message(1)], 4, []))
    assert frames[1:] == [_message(1)]


# ------------------------------------------------------------------ giving up


def test_a_full_join_buffer_closes_that_subscriber_only() -> None:
    router: ChannelRouter[str] = ChannelRouter(10, max_join_buffer=2)
    _subscribed(router, "other")
    join, _ = router.join("s", "c", deltas=True, resuming=False)
    router.deliver("c", D, 1, Delta("c", "m", "1"))
    router.deliver("c", D, 2, Delta("c", "m", "2"))
    actions = router.deliver("c", D, 3, Delta("c", "m", "3"))
    assert Close("s", "too slow to join") in actions
    assert _sent_to(actions, "other") == [Delta("c", "m", "3")]
    assert router.joined(join, _cut(0)) == []
    assert not router.hub.is_subscribed("s", "c")


def test_a_join_buffer_past_its_bytes_closes_that_subscriber_only() -> None:
    big = _message(1, text="x" * 600)
    router: ChannelRouter[str] = ChannelRouter(10, max_join_buffer_bytes=2 * len(big))
    _subscribed(router, "other")
    join, _ = router.join("s", "c", deltas=True, resuming=False)
    held = router.deliver("c", T, 1, big)
    assert _sent_to(held, "other") == [big] and _sent_to(held, "s") == []  # held for "s"
    router.deliver("c", T, 2, big)
    assert join.buffered == 2 * len(big)
    actions = router.deliver("c", D, 3, Delta("c", "m", "y"))  # one byte more: too much
    assert Close("s", "too slow to join") in actions
    assert _sent_to(actions, "other") == [Delta("c", "m", "y")]
    assert router.joined(join, _cut(0)) == []
    assert not router.hub.is_subscribed("s", "c")


def test_a_join_buffer_within_its_bytes_is_sent_whole_after_the_cut() -> None:
    router: ChannelRouter[str] = ChannelRouter(10, max_join_buffer_bytes=3 * len(_message(1)))
    join, _ = router.join("s", "c", deltas=False, resuming=False)
    for n in (1, 2, 3):
        router.deliver("c", T, n, _message(n))
    assert router.joined(join, _cut(0))[1:] == [_message(n) for n in (1, 2, 3)]


def test_abandon_undoes_a_new_subscription_but_keeps_an_old_one() -> None:
    router: ChannelRouter[str] = ChannelRouter(10)
    join, _ = router.join("s", "c", deltas=True, resuming=False)
    assert router.abandon(join) is True
    assert router.interest("c") == (False, False)
    _subscribed(router, "t", deltas=False)
    again, _ = router.join("t", "c", deltas=True, resuming=False)
    assert router.abandon(again) is False
    assert router.hub.is_subscribed("t", "c")
    assert router.joins_in_progress() == 0


def test_leaving_during_the_join_makes_joined_send_nothing() -> None:
    router: ChannelRouter[str] = ChannelRouter(10)
    join, _ = router.join("s", "c", deltas=True, resuming=False)
    assert router.remove("s") == ["c"]
    assert router.joined(join, _cut(0)) == []
    join, _ = router.join("s", "c", deltas=True, resuming=False)
    assert router.unsubscribe("s", "c") is True
    assert router.joined(join, _cut(0)) == []
    assert router.joins_in_progress() == 0 and router.floors() == 0


def test_too_many_channels_changes_nothing() -> None:
    router: ChannelRouter[str] = ChannelRouter(1)
    _subscribed(router, "s")
    with pytest.raises(FrameRejected) as refused:
        router.join("s", "d", deltas=False, resuming=False)
    assert refused.value.code is ErrorCode.TOO_MANY_CHANNELS
    assert router.joins_in_progress() == 0
    assert list(router.hub.channels("s")) == ["c"]


# ------------------------------------------------------------------ the window


def test_window_holds_and_merges_deltas_per_message_until_flushed() -> None:
    router: ChannelRouter[str] = ChannelRouter(10, window=True)
    _subscribed(router, "s")
    router.deliver("c", D, 1, Delta("c", "x", "lift the floor"))  # the floor was at 0
    router.flush("c")
    assert router.deliver("c", D, 2, Delta("c", "a", "1")) == [Hold("c")]
    assert router.deliver("c", D, 3, Delta("c", "b", "x")) == []
    assert router.deliver("c", D, 4, Delta("c", "a", "2")) == []
    assert router.holds("c")
    sent = _sent_to(router.flush("c"), "s")
    assert sent == [Delta("c", "a", "12"), Delta("c", "b", "x")]
    assert not router.holds("c") and router.flush("c") == []


def test_any_other_frame_flushes_the_window_first() -> None:
    router: ChannelRouter[str] = ChannelRouter(10, window=True)
    _subscribed(router, "s")
    router.deliver("c", D, 1, Delta("c", "a", "1"))
    router.deliver("c", D, 2, Delta("c", "a", "2"))
    actions = router.deliver("c", T, 3, _message(1, "a", "12"))
    assert _sent_to(actions, "s") == [Delta("c", "a", "12"), _message(1, "a", "12")]


def test_a_join_flushes_the_window_to_the_others_only() -> None:
    router: ChannelRouter[str] = ChannelRouter(10, window=True)
    _subscribed(router, "s")
    router.deliver("c", D, 1, Delta("c", "a", "held"))
    join, flushed = router.join("late", "c", deltas=True, resuming=False)
    assert _sent_to(flushed, "s") == [Delta("c", "a", "held")]
    assert _sent_to(flushed, "late") == []
    # While it joins, deltas skip the window: none can straddle its cut.
    during = router.deliver("c", D, 2, Delta("c", "a", "!"))
    assert _sent_to(during, "s") == [Delta("c", "a", "!")]
    frames = router.joined(join, _cut(1, live=[LiveMessage("o", "a", "held")]))
    assert frames[2:] == [Delta("c", "a", "!")]


def test_a_snapshot_frame_reaches_deltas_subscribers_only() -> None:
    router: ChannelRouter[str] = ChannelRouter(10)
    _subscribed(router, "plain", deltas=False)
    _subscribed(router, "live", deltas=True)
    actions = router.deliver("c", SNAP, 1, '{"type":"snapshot"}')
    assert _sent_to(actions, "live") == ['{"type":"snapshot"}']
    assert _sent_to(actions, "plain") == []


# ------------------------------------------------- against a reference model


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["publish", "arrive", "join", "read", "reply"]), max_size=60))
def test_every_joiner_gets_exactly_the_frames_after_its_cut(steps: list[str]) -> None:
    """Frames are published in seq order and arrive in that order, but at any time after;
    a join's cut is read at any time, and its reply reaches the router at any time after.
    Whatever the interleaving, each joiner gets every frame above its cut, once, in order."""
    router: ChannelRouter[str] = ChannelRouter(10)
    published: list[tuple[FrameKind, int, str]] = []
    arrived = 0
    joins: dict[str, object] = {}
    cuts: dict[str, int] = {}
    replied: set[str] = set()
    got: dict[str, list[object]] = {}
    names = iter(f"s{n}" for n in range(100))

    def run(actions: list[object]) -> None:
        for action in actions:
            if isinstance(action, Send):
                for receiver in action.receivers:
                    got.setdefault(receiver, []).append(action.item)

    def step(kind: str) -> None:
        nonlocal arrived
        if kind == "publish":
            seq = len(published) + 1
            frame_kind = T if seq % 3 == 0 else D
            published.append((frame_kind, seq, f"frame {seq}"))
        elif kind == "arrive" and arrived < len(published):
            frame_kind, seq, payload = published[arrived]
            arrived += 1
            run(router.deliver("c", frame_kind, seq, payload))
        elif kind == "join":
            name = next(names)
            join, actions = router.join(name, "c", deltas=True, resuming=False)
            run(actions)
            joins[name] = join
        elif kind == "read":
            unread = [name for name in joins if name not in cuts]
            if unread:
                cuts[unread[0]] = len(published)
        elif kind == "reply":
            ready = [name for name in cuts if name not in replied]
            if ready:
                name = ready[0]
                replied.add(name)
                frames = router.joined(joins[name], _cut(cuts[name]))  # type: ignore[arg-type]
                got.setdefault(name, []).extend(frames[1:])  # after the confirmation

    for kind in steps:
        step(kind)
    for name in joins:  # the end: every cut read and answered, every frame arrived
        if name not in cuts:
            cuts[name] = len(published)
    while arrived < len(published) or len(replied) < len(joins):
        step("reply")
        step("arrive")
    for name, cut in cuts.items():
        assert got.get(name, []) == [payload for _, seq, payload in published if seq > cut], name
