"""The channel router: which subscriber gets which frame of a channel, and when.

Theory of operation
-------------------
The broker hands the router every frame of the channels this process listens
to, each with the channel's event number ``seq`` (strictly increasing per
channel, in the order the broker delivers them). The router answers with
actions for the edge to carry out: :class:`Send` a frame to some subscribers,
:class:`Close` a subscriber, or :class:`Hold` a channel's deltas for the flush
window's timer. It never touches a socket, a clock or the broker.

A join has two halves, because the broker reads the joiner's catch-up cut
(offset, epoch, missed history, texts in progress, and the ``seq`` the cut
reflects) asynchronously:

1. :meth:`ChannelRouter.join` subscribes at once and starts a **join buffer**:
   every frame of the channel for that subscriber is held while the cut is read.
2. :meth:`ChannelRouter.joined` takes the cut and returns, in this order, the
   ``subscribed`` confirmation, the replayed history, the snapshots, then the
   buffered frames the cut does not already cover (``seq`` above the cut's).
   It then leaves a **floor** at the cut's ``seq``: a frame that arrives later
   but was published before the cut was read (a broker's pub/sub connection is
   not the connection the cut was read on, so it may lag) is dropped for that
   subscriber too. The first frame of the channel above the floor lifts it.

A subscriber that was already subscribed (it subscribes again to change
``deltas``) and gave no ``since`` is still owed the completed messages it did
not ask to replay, so buffered or late terminal frames reach it whatever their
``seq``; its deltas and snapshots are still cut at the floor, since its new
snapshots cover them.

Delta window (``--delta-flush-ms``): a channel's deltas are held and merged per
message (:class:`~token_relay.core.merge.DeltaQueue`); the first held delta
asks the edge to start a timer (:class:`Hold`), and :meth:`flush` sends them.
Any other frame of the channel flushes the window first, so nothing overtakes
a delta. While a subscriber of the channel is joining or has a floor, its
deltas skip the window, so no merged frame straddles a cut.

Limits: a join buffer holds at most ``max_join_buffer`` frames and
``max_join_buffer_bytes`` bytes of them (the edge gives it
``--max-subscriber-buffer-bytes``: what it holds is the joiner's unsent frames); one
more frame past either closes that subscriber (:class:`Close`, "too slow to join"), which can resume
by offset. Floors and buffers exist only for live subscriptions, so they are
bounded by the hub's own limits.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from .codec import encode_parts_snapshot
from .events import CatchUp, Delta, FrameKind, Outgoing
from .hub import ChannelHub
from .merge import DeltaQueue
from .protocol import Snapshot, Subscribed, encode

__all__ = [
    "MAX_JOIN_BUFFER",
    "MAX_JOIN_BUFFER_BYTES",
    "ChannelRouter",
    "Close",
    "Hold",
    "Join",
    "Send",
]

S = TypeVar("S", bound=Hashable)

MAX_JOIN_BUFFER = 10_000
"""Frames buffered for one joining subscription while its catch-up is read."""
MAX_JOIN_BUFFER_BYTES = 4 * 1024 * 1024
"""Their bytes (a frame's ``len``), by default."""

TOO_SLOW_TO_JOIN = "too slow to join"


class Send(NamedTuple, Generic[S]):
    """Write ``item`` to each of ``receivers`` (a live set: use it at once)."""

    receivers: Collection[S]
    item: Outgoing


class Close(NamedTuple, Generic[S]):
    """Close ``subscriber`` (try again later); the router has already forgotten it."""

    subscriber: S
    reason: str


class Hold(NamedTuple):
    """The first delta of ``channel`` entered the window: flush it when the window ends."""

    channel: str


Action = Send[S] | Close[S] | Hold


@dataclass(eq=False, slots=True)
class Join(Generic[S]):
    """One subscription being joined: what it asked for and what arrived meanwhile."""

    subscriber: S
    channel: str
    deltas: bool
    resuming: bool
    """Whether it gave ``since`` (its missed terminal frames come from the cut)."""
    was_subscribed: bool
    buffer: list[tuple[FrameKind, int, Outgoing]] = field(default_factory=list)
    buffered: int = 0
    """The bytes of the frames in :attr:`buffer`."""


class _Floor(NamedTuple):
    seq: int
    owed_terminals: bool


class ChannelRouter(Generic[S]):
    """Subscriptions, joins and the delta window of one relay process. See the module doc."""

    def __init__(
        self,
        max_channels_per_subscriber: int,
        *,
        window: bool = False,
        max_join_buffer: int = MAX_JOIN_BUFFER,
        max_join_buffer_bytes: int = MAX_JOIN_BUFFER_BYTES,
    ) -> None:
        self.hub: ChannelHub[S] = ChannelHub(max_channels_per_subscriber)
        self.max_join_buffer = max_join_buffer
        self.max_join_buffer_bytes = max_join_buffer_bytes
        self._window: dict[str, DeltaQueue] | None = {} if window else None
        self._joins: dict[tuple[S, str], Join[S]] = {}
        self._floors: dict[str, dict[S, _Floor]] = {}
        self._joining: dict[str, int] = {}
        """Joins in progress per channel."""

    # ------------------------------------------------------------ subscriptions

    def join(
        self, subscriber: S, channel: str, *, deltas: bool, resuming: bool
    ) -> tuple[Join[S], list[Action[S]]]:
        """Subscribe and start buffering; raises ``too_many_channels`` changing nothing.

        Returns the join to complete with :meth:`joined` (or :meth:`abandon`), and the
        actions of flushing the channel's window first.
        """
        # Copies of the receivers: the joiner is added to the live sets just below, and
        # what the window held was published before its cut.
        actions: list[Action[S]] = [
            Send(tuple(action.receivers), action.item) if isinstance(action, Send) else action
            for action in self.flush(channel)
        ]
        was_subscribed = not self.hub.subscribe(subscriber, channel, deltas)
        key = (subscriber, channel)
        self._lift_floor(subscriber, channel)
        if key not in self._joins:
            self._joining[channel] = self._joining.get(channel, 0) + 1
        join = self._joins[key] = Join(subscriber, channel, deltas, resuming, was_subscribed)
        return join, actions

    def joined(
        self, join: Join[S], cut: CatchUp, positions: Mapping[str, int] | None = None
    ) -> list[Outgoing]:
        """Complete a join: the frames to send the joiner, in order.

        Empty if the join was given up meanwhile (the subscriber left, or was closed
        as too slow to join).
        """
        if not self._end_join(join):
            return []
        channel = join.channel
        confirmation = Subscribed(channel=channel, offset=cut.offset, epoch=cut.epoch)
        extra: dict[str, bool | int] = {}
        if cut.recovered is not None:
            extra["recovered"] = cut.recovered
        if cut.frames:
            extra["replayed"] = len(cut.frames)
        if extra:
            confirmation = confirmation.model_copy(update=extra)
        frames: list[Outgoing] = [encode(confirmation), *cut.frames]
        held = positions or {}
        if join.deltas:
            for message in cut.live:
                start = held.get(message.message_id)
                if message.chunks is not None:
                    # A structured message: the reply so far, compacted, replacing it whole.
                    frames.append(
                        encode_parts_snapshot(
                            channel, message.message_id, message.text, message.chunks
                        )
                    )
                    continue
                if start is not None and start <= len(message.text):
                    snapshot = Snapshot(
                        channel=channel,
                        id=message.message_id,
                        text=message.text[start:],
                        from_=start,
                    )
                else:
                    snapshot = Snapshot(channel=channel, id=message.message_id, text=message.text)
                frames.append(encode(snapshot))
        owed = join.was_subscribed and not join.resuming
        for kind, seq, item in join.buffer:
            if seq > cut.seq or (owed and kind is FrameKind.TERMINAL):
                frames.append(item)
        self._floors.setdefault(channel, {})[join.subscriber] = _Floor(cut.seq, owed)
        return frames

    def abandon(self, join: Join[S]) -> bool:
        """Give a join up (the cut could not be read); True if the subscription was undone."""
        if not self._end_join(join):
            return False
        if join.was_subscribed:
            return False
        return self.hub.unsubscribe(join.subscriber, join.channel)

    def unsubscribe(self, subscriber: S, channel: str) -> bool:
        """Remove a subscription (and any join or floor of it); False if there was none."""
        self._forget(subscriber, channel)
        return self.hub.unsubscribe(subscriber, channel)

    def remove(self, subscriber: S) -> list[str]:
        """Drop every subscription of a subscriber that went away; returns its channels."""
        channels = list(self.hub.channels(subscriber))
        for channel in channels:
            self._forget(subscriber, channel)
        self.hub.remove(subscriber)
        return channels

    def interest(self, channel: str) -> tuple[bool, bool]:
        """Whether this process needs the channel's terminal frames, and its deltas."""
        return bool(self.hub.subscribers(channel)), bool(self.hub.delta_subscribers(channel))

    # ------------------------------------------------------------ frames

    def deliver(self, channel: str, kind: FrameKind, seq: int, item: Outgoing) -> list[Action[S]]:
        """Route one frame of ``channel`` from the broker."""
        floors = self._floors.get(channel)
        if floors is not None:
            # Every floor below this frame's seq is behind us for good: frames come in order.
            for subscriber in [s for s, floor in floors.items() if floor.seq < seq]:
                del floors[subscriber]
            if not floors:
                del self._floors[channel]
        window = self._window
        if window is not None:
            if (
                kind is FrameKind.DELTA
                and isinstance(item, Delta)
                and channel not in self._joining
                and channel not in self._floors
            ):
                queue = window.get(channel)
                if queue is None:
                    queue = window[channel] = DeltaQueue()
                    queue.push(item, seq)
                    return [Hold(channel)]
                queue.push(item, seq)
                return []
            if channel in window:
                actions = self.flush(channel)
                actions.extend(self._route(channel, kind, seq, item))
                return actions
        return self._route(channel, kind, seq, item)

    def flush(self, channel: str) -> list[Action[S]]:
        """Send the channel's held deltas, merged per message (the window's timer ended)."""
        window = self._window
        queue = window.pop(channel, None) if window is not None else None
        if queue is None:
            return []
        actions: list[Action[S]] = []
        for seq, item in queue.take():
            actions.extend(self._route(channel, FrameKind.DELTA, seq, item))
        return actions

    def holds(self, channel: str) -> bool:
        """Whether the channel has deltas in the window."""
        return self._window is not None and channel in self._window

    def _route(self, channel: str, kind: FrameKind, seq: int, item: Outgoing) -> list[Action[S]]:
        hub = self.hub
        receivers = (
            hub.subscribers(channel)
            if kind is FrameKind.TERMINAL
            else hub.delta_subscribers(channel)
        )
        if not receivers:
            return []
        floors = self._floors.get(channel)
        if channel not in self._joining and floors is None:
            return [Send(receivers, item)]
        ready: list[S] = []
        closes: list[Action[S]] = []
        for receiver in receivers:
            join = self._joins.get((receiver, channel))
            if join is not None:
                size = len(item)
                if (
                    len(join.buffer) < self.max_join_buffer
                    and join.buffered + size <= self.max_join_buffer_bytes
                ):
                    join.buffer.append((kind, seq, item))
                    join.buffered += size
                else:
                    closes.append(Close(receiver, TOO_SLOW_TO_JOIN))
                continue
            floor = floors.get(receiver) if floors is not None else None
            owed = floor is not None and floor.owed_terminals and kind is FrameKind.TERMINAL
            if floor is not None and seq <= floor.seq and not owed:
                continue
            ready.append(receiver)
        # Forgetting a subscriber edits the set iterated above, so it comes after.
        for close in closes:
            assert isinstance(close, Close)
            self.remove(close.subscriber)
        actions: list[Action[S]] = [Send(ready, item)] if ready else []
        actions.extend(closes)
        return actions

    # ------------------------------------------------------------ bookkeeping

    def _end_join(self, join: Join[S]) -> bool:
        key = (join.subscriber, join.channel)
        if self._joins.get(key) is not join:
            return False
        del self._joins[key]
        left = self._joining[join.channel] - 1
        if left:
            self._joining[join.channel] = left
        else:
            del self._joining[join.channel]
        return True

    def _forget(self, subscriber: S, channel: str) -> None:
        join = self._joins.get((subscriber, channel))
        if join is not None:
            self._end_join(join)
        self._lift_floor(subscriber, channel)

    def _lift_floor(self, subscriber: S, channel: str) -> None:
        floors = self._floors.get(channel)
        if floors is not None and floors.pop(subscriber, None) is not None and not floors:
            del self._floors[channel]

    def joins_in_progress(self) -> int:
        """Joins waiting for their cut."""
        return len(self._joins)

    def floors(self) -> int:
        """Subscriptions with a floor still up."""
        return sum(len(floors) for floors in self._floors.values())

    def subscribers(self) -> Iterable[S]:
        """Every subscriber holding at least one channel."""
        return self.hub.subscriber_handles()
