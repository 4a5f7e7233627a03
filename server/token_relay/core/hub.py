"""Which subscribers listen to which channels, and which of them want live deltas.

The hub is a pure, two-way index: channel -> subscribers and subscriber ->
channels. It knows nothing of sockets; a subscriber is any hashable handle.
Each channel keeps two sets: everyone (for completed messages, aborts) and
those who asked for deltas, so forwarding a delta never filters per receiver.

A channel's sets keep the order of subscription (they are dicts' keys), so a frame
goes out to a channel's subscribers first come, first served, the same order every
time. Over loopback that matters: a set's order (by object address) interleaves the
client processes that hold the sockets and wakes each of them far more often than
writing in subscription order does (see the README's Performance section).

Limits: a subscriber may hold at most ``max_channels_per_subscriber``
subscriptions; one more is rejected with ``too_many_channels`` and the existing
ones are kept. Empty channels are removed at once, so the maps never hold more
channels than there are live subscriptions.
"""

from __future__ import annotations

from collections.abc import Hashable, KeysView, Mapping, Set
from typing import Generic, TypeVar, cast

from .errors import ConfigError, ErrorCode, FrameRejected

__all__ = ["ChannelHub"]

S = TypeVar("S", bound=Hashable)


_Members = dict[S, None]
"""A channel's subscribers: a dict's keys, so that they keep the order of subscription."""

_NONE: KeysView[object] = {}.keys()


def _discard(index: dict[str, _Members[S]], channel: str, subscriber: S) -> None:
    members = index.get(channel)
    if members is not None:
        members.pop(subscriber, None)
        if not members:
            del index[channel]


class ChannelHub(Generic[S]):
    """Subscriptions of subscribers to channels."""

    __slots__ = ("_channels_of", "_deltas_of", "_max_channels", "_subscribers_of")

    def __init__(self, max_channels_per_subscriber: int) -> None:
        if max_channels_per_subscriber < 1:
            raise ConfigError("max_channels_per_subscriber must be at least 1")
        self._max_channels = max_channels_per_subscriber
        self._subscribers_of: dict[str, _Members[S]] = {}
        self._deltas_of: dict[str, _Members[S]] = {}
        self._channels_of: dict[S, set[str]] = {}

    def subscribe(self, subscriber: S, channel: str, deltas: bool = False) -> bool:
        """Add a subscription, or change whether it gets deltas. False if it already existed."""
        channels = self._channels_of.setdefault(subscriber, set())
        existed = channel in channels
        if not existed:
            if len(channels) >= self._max_channels:
                if not channels:
                    del self._channels_of[subscriber]
                raise FrameRejected(
                    ErrorCode.TOO_MANY_CHANNELS,
                    f"a subscriber may hold at most {self._max_channels} channels",
                )
            channels.add(channel)
            self._subscribers_of.setdefault(channel, {})[subscriber] = None
        if deltas:
            self._deltas_of.setdefault(channel, {})[subscriber] = None
        else:
            _discard(self._deltas_of, channel, subscriber)
        return not existed

    def unsubscribe(self, subscriber: S, channel: str) -> bool:
        """Remove a subscription. Returns False if there was none."""
        channels = self._channels_of.get(subscriber)
        if channels is None or channel not in channels:
            return False
        channels.discard(channel)
        if not channels:
            del self._channels_of[subscriber]
        _discard(self._subscribers_of, channel, subscriber)
        _discard(self._deltas_of, channel, subscriber)
        return True

    def remove(self, subscriber: S) -> None:
        """Drop every subscription of a subscriber that went away."""
        for channel in self._channels_of.pop(subscriber, ()):
            _discard(self._subscribers_of, channel, subscriber)
            _discard(self._deltas_of, channel, subscriber)

    def subscribers(self, channel: str) -> Set[S]:
        """The live set of a channel's subscribers, in the order they subscribed (use it
        at once: it changes as they come and go)."""
        members = self._subscribers_of.get(channel)
        return members.keys() if members is not None else cast("KeysView[S]", _NONE)

    @property
    def delta_channels(self) -> Mapping[str, Mapping[S, None]]:
        """The channels with a subscriber that asked for deltas (a live view)."""
        return self._deltas_of

    def delta_subscribers(self, channel: str) -> Set[S]:
        """The live set of a channel's subscribers that asked for deltas, in the order
        they asked."""
        members = self._deltas_of.get(channel)
        return members.keys() if members is not None else cast("KeysView[S]", _NONE)

    def channels(self, subscriber: S) -> Set[str]:
        """The channels a subscriber holds."""
        return self._channels_of.get(subscriber, frozenset())

    def subscriber_handles(self) -> list[S]:
        """Every subscriber holding at least one channel."""
        return list(self._channels_of)

    def is_subscribed(self, subscriber: S, channel: str) -> bool:
        """Whether ``subscriber`` holds ``channel``."""
        return channel in self._channels_of.get(subscriber, ())

    @property
    def channel_count(self) -> int:
        """Number of channels with at least one subscriber."""
        return len(self._subscribers_of)
