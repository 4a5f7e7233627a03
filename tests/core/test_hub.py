"""Tests for token_relay.core.hub: the channel <-> subscriber index and its limit."""

from __future__ import annotations

import pytest
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.hub import ChannelHub


def test_subscribe_returns_true_then_false() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    assert hub.subscribe("s1", "c") is True
    assert hub.subscribe("s1", "c") is False
    assert hub.subscribers("c") == {"s1"}
    assert hub.channels("s1") == {"c"}
    assert hub.channel_count == 1


def test_unsubscribe_returns_true_then_false() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "c")
    assert hub.unsubscribe("s1", "c") is True
    assert hub.unsubscribe("s1", "c") is False
    assert hub.subscribers("c") == set()
    assert hub.channels("s1") == set()


def test_unsubscribe_unknown_subscriber_or_channel() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "c")
    assert hub.unsubscribe("s2", "c") is False
    assert hub.unsubscribe("s1", "other") is False
    assert hub.subscribers("c") == {"s1"}
    assert hub.channel_count == 1


def test_several_subscribers_and_channels() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "a")
    hub.subscribe("s2", "a")
    hub.subscribe("s2", "b")
    assert hub.subscribers("a") == {"s1", "s2"}
    assert hub.subscribers("b") == {"s2"}
    assert hub.channels("s2") == {"a", "b"}
    assert hub.channel_count == 2


def test_channel_removed_when_last_subscriber_leaves() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "c")
    hub.subscribe("s2", "c")
    hub.unsubscribe("s1", "c")
    assert hub.channel_count == 1
    assert hub.subscribers("c") == {"s2"}
    hub.unsubscribe("s2", "c")
    assert hub.channel_count == 0
    assert hub.subscribers("c") == set()


def test_remove_drops_every_subscription() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "a")
    hub.subscribe("s1", "b")
    hub.subscribe("s2", "b")
    hub.remove("s1")
    assert hub.channels("s1") == set()
    assert hub.subscribers("a") == set()
    assert hub.subscribers("b") == {"s2"}
    assert hub.channel_count == 1
    assert hub.unsubscribe("s1", "b") is False


def test_remove_is_idempotent_and_accepts_unknown() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "c")
    hub.remove("s1")
    hub.remove("s1")
    hub.remove("never")
    assert hub.channel_count == 0
    assert hub.subscribers("c") == set()


def test_subscribe_again_after_remove() -> None:
    hub: ChannelHub[str] = ChannelHub(1)
    hub.subscribe("s1", "a")
    hub.remove("s1")
    assert hub.subscribe("s1", "b") is True
    assert hub.channels("s1") == {"b"}
    assert hub.channel_count == 1


def test_subscribers_of_unknown_channel_is_empty() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    assert hub.subscribers("nothing") == set()
    assert len(hub.subscribers("nothing")) == 0
    assert hub.channel_count == 0


def test_channels_of_unknown_subscriber_is_empty() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    assert hub.channels("nobody") == set()


def test_too_many_channels_at_limit_keeps_existing() -> None:
    hub: ChannelHub[str] = ChannelHub(2)
    assert hub.subscribe("s1", "a") is True
    assert hub.subscribe("s1", "b") is True
    with pytest.raises(FrameRejected) as info:
        hub.subscribe("s1", "c")
    assert info.value.code is ErrorCode.TOO_MANY_CHANNELS
    assert info.value.message == "a subscriber may hold at most 2 channels"
    assert info.value.message_id is None
    assert hub.channels("s1") == {"a", "b"}
    assert hub.subscribers("a") == {"s1"}
    assert hub.subscribers("b") == {"s1"}
    assert hub.subscribers("c") == set()
    assert hub.channel_count == 2


def test_existing_channel_at_limit_is_not_rejected() -> None:
    hub: ChannelHub[str] = ChannelHub(1)
    hub.subscribe("s1", "a")
    assert hub.subscribe("s1", "a") is False
    assert hub.channels("s1") == {"a"}


def test_limit_is_per_subscriber() -> None:
    hub: ChannelHub[str] = ChannelHub(1)
    hub.subscribe("s1", "a")
    assert hub.subscribe("s2", "b") is True
    assert hub.channel_count == 2


def test_unsubscribe_frees_a_slot() -> None:
    hub: ChannelHub[str] = ChannelHub(1)
    hub.subscribe("s1", "a")
    with pytest.raises(FrameRejected):
        hub.subscribe("s1", "b")
    hub.unsubscribe("s1", "a")
    assert hub.subscribe("s1", "b") is True
    assert hub.channels("s1") == {"b"}
    assert hub.channel_count == 1


def test_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        ChannelHub(0)


def test_subscribers_may_be_any_hashable() -> None:
    first, second = object(), object()
    hub: ChannelHub[object] = ChannelHub(10)
    hub.subscribe(first, "c")
    hub.subscribe(second, "c")
    assert hub.subscribers("c") == {first, second}
    hub.remove(first)
    assert hub.subscribers("c") == {second}


# ------------------------------------------------------------------------ deltas


def test_delta_subscribers_hold_only_deltas_subscribers() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    assert hub.subscribe("plain", "c") is True
    assert hub.subscribe("live", "c", deltas=True) is True
    assert hub.subscribers("c") == {"plain", "live"}
    assert hub.delta_subscribers("c") == {"live"}


def test_deltas_default_is_false() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "c")
    assert hub.delta_subscribers("c") == set()
    assert hub.subscribers("c") == {"s1"}


def test_delta_subscribers_are_per_channel() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "a", deltas=True)
    hub.subscribe("s1", "b")
    assert hub.delta_subscribers("a") == {"s1"}
    assert hub.delta_subscribers("b") == set()


def test_resubscribe_with_deltas_adds_to_delta_set() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "c")
    assert hub.subscribe("s1", "c", deltas=True) is False
    assert hub.delta_subscribers("c") == {"s1"}
    assert hub.subscribers("c") == {"s1"}
    assert hub.channels("s1") == {"c"}


def test_resubscribe_without_deltas_removes_from_delta_set_only() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "c", deltas=True)
    hub.subscribe("s2", "c", deltas=True)
    assert hub.subscribe("s1", "c", deltas=False) is False
    assert hub.delta_subscribers("c") == {"s2"}
    assert hub.subscribers("c") == {"s1", "s2"}
    assert hub.channels("s1") == {"c"}
    assert hub.is_subscribed("s1", "c") is True
    assert hub.channel_count == 1


def test_resubscribe_with_deltas_at_the_channel_limit_is_not_rejected() -> None:
    hub: ChannelHub[str] = ChannelHub(1)
    hub.subscribe("s1", "a")
    assert hub.subscribe("s1", "a", deltas=True) is False
    assert hub.delta_subscribers("a") == {"s1"}


def test_unsubscribe_clears_both_sets() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "c", deltas=True)
    hub.subscribe("s2", "c", deltas=True)
    assert hub.unsubscribe("s1", "c") is True
    assert hub.subscribers("c") == {"s2"}
    assert hub.delta_subscribers("c") == {"s2"}
    assert hub.is_subscribed("s1", "c") is False


def test_resubscribe_after_unsubscribe_does_not_restore_deltas() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "c", deltas=True)
    hub.subscribe("s2", "c")
    hub.unsubscribe("s1", "c")
    assert hub.subscribe("s1", "c") is True
    assert hub.delta_subscribers("c") == set()


def test_remove_clears_both_sets() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "a", deltas=True)
    hub.subscribe("s1", "b", deltas=True)
    hub.subscribe("s2", "b", deltas=True)
    hub.remove("s1")
    assert hub.subscribers("a") == set()
    assert hub.delta_subscribers("a") == set()
    assert hub.subscribers("b") == {"s2"}
    assert hub.delta_subscribers("b") == {"s2"}
    assert hub.channels("s1") == set()
    assert hub.channel_count == 1


def test_empty_channel_is_removed_from_both_maps() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "c", deltas=True)
    hub.unsubscribe("s1", "c")
    assert hub.channel_count == 0
    assert hub.subscribers("c") == set()
    assert hub.delta_subscribers("c") == set()
    assert hub._subscribers_of == {}
    assert hub._deltas_of == {}
    assert hub._channels_of == {}


def test_empty_channel_is_removed_from_both_maps_on_remove() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "a", deltas=True)
    hub.subscribe("s1", "b")
    hub.remove("s1")
    assert hub._subscribers_of == {}
    assert hub._deltas_of == {}
    assert hub._channels_of == {}


def test_delta_set_entry_removed_when_last_deltas_subscriber_opts_out() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    hub.subscribe("s1", "c", deltas=True)
    hub.subscribe("s1", "c", deltas=False)
    assert "c" not in hub._deltas_of
    assert hub._subscribers_of == {"c": {"s1": None}}


def test_delta_subscribers_of_unknown_channel_is_empty() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    assert hub.delta_subscribers("nothing") == set()
    assert len(hub.delta_subscribers("nothing")) == 0


# ------------------------------------------------------------------ is_subscribed


def test_is_subscribed() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    assert hub.is_subscribed("s1", "c") is False
    hub.subscribe("s1", "c")
    assert hub.is_subscribed("s1", "c") is True
    assert hub.is_subscribed("s1", "other") is False
    assert hub.is_subscribed("s2", "c") is False
    hub.subscribe("s2", "c", deltas=True)
    assert hub.is_subscribed("s2", "c") is True
    hub.remove("s1")
    assert hub.is_subscribed("s1", "c") is False
    assert hub.is_subscribed("s2", "c") is True


# ------------------------------------------------------- too_many_channels leftovers


def test_too_many_channels_leaves_no_empty_entry_for_the_rejected_channel() -> None:
    hub: ChannelHub[str] = ChannelHub(1)
    hub.subscribe("s1", "a")
    with pytest.raises(FrameRejected) as info:
        hub.subscribe("s1", "new", deltas=True)
    assert info.value.code is ErrorCode.TOO_MANY_CHANNELS
    assert hub.is_subscribed("s1", "new") is False
    assert "new" not in hub._subscribers_of
    assert "new" not in hub._deltas_of
    assert hub._subscribers_of == {"a": {"s1": None}}
    assert hub._deltas_of == {}
    assert hub._channels_of == {"s1": {"a"}}
    assert hub.channel_count == 1


def test_too_many_channels_keeps_existing_deltas_subscription() -> None:
    hub: ChannelHub[str] = ChannelHub(1)
    hub.subscribe("s1", "a", deltas=True)
    with pytest.raises(FrameRejected):
        hub.subscribe("s1", "b", deltas=False)
    assert hub.delta_subscribers("a") == {"s1"}
    assert hub.subscribers("b") == set()
    assert hub._deltas_of == {"a": {"s1": None}}


def test_rejected_subscriber_without_subscriptions_leaves_no_empty_entry() -> None:
    # Unreachable through the constructor (the limit is at least 1), so force a
    # zero limit to exercise the branch that drops the subscriber's empty set.
    hub: ChannelHub[str] = ChannelHub(1)
    hub._max_channels = 0
    with pytest.raises(FrameRejected) as info:
        hub.subscribe("s1", "c", deltas=True)
    assert info.value.code is ErrorCode.TOO_MANY_CHANNELS
    assert hub._channels_of == {}
    assert hub._subscribers_of == {}
    assert hub._deltas_of == {}
    assert hub.channels("s1") == set()


def test_a_channels_subscribers_come_in_the_order_they_subscribed() -> None:
    hub: ChannelHub[str] = ChannelHub(10)
    names = [f"s{n}" for n in (5, 1, 9, 3, 7, 2, 8)]
    for name in names:
        hub.subscribe(name, "c", deltas=name in {"s9", "s7", "s1"})
    assert list(hub.subscribers("c")) == names
    assert list(hub.delta_subscribers("c")) == ["s1", "s9", "s7"]
    # Asking for deltas, or no longer, keeps a subscriber's place among everyone.
    hub.subscribe("s5", "c", deltas=True)
    hub.subscribe("s9", "c", deltas=False)
    assert list(hub.subscribers("c")) == names
    assert list(hub.delta_subscribers("c")) == ["s1", "s7", "s5"]
    # One that leaves and comes back is last.
    hub.unsubscribe("s1", "c")
    hub.remove("s3")
    hub.subscribe("s1", "c")
    assert list(hub.subscribers("c")) == ["s5", "s9", "s7", "s2", "s8", "s1"]
    assert list(hub.delta_subscribers("c")) == ["s7", "s5"]
