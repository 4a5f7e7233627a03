"""Which messages are in progress on each channel, and who produces them.

The relay needs this for two things: a deltas subscriber joining a channel gets
a snapshot of each message in progress there, and a ``cancel`` for a channel
and id must reach the producer connection that owns that message.

Ownership. An id has one owner per channel while its message is in progress: the
first to :meth:`InflightIndex.claim` it. Another owner's claim is refused, and so
is anything else of its message (:meth:`InflightIndex.may_publish`): a message
that opened is published (a delta, its final) only while its owner holds the claim, so a
refused message's final can't slip in once the holder is done; a one-shot
message (a final that opened it) is published only if nobody else holds the id.
The Redis broker keeps the same rule in its scripts, where a claim may also not
have landed (a write failed in an outage): there a refused claim is noted, and a
message that opened is refused only if its claim was refused or another owner
holds the id. Here a claim either holds until its terminal frame or was refused.

Holds. An id stays its owner's for ``hold`` seconds after its message completes on a
channel: in that time another owner's claim is refused, and so is its one-shot message,
as if the message were still in progress; the owner itself may open the id again. So two
producers that each send one message under one id deliver one message, whether the
second starts while the first is in progress or just after it completed. An aborted
message holds nothing: its text never reached anyone as a message, and a producer that
lost its session sends it again whole, as a new producer, under the same id. The held
ids are one map in the order they completed, pruned by ``now`` (the caller's monotonic
clock) at each call, at most ``max_held`` of them and ``max_held_chars`` characters of
ids and channel names: past either the oldest hold ends early.
``hold`` 0 holds nothing: an id is free once its message ended. A hold keeps what its
caller said of how the message was published (:meth:`InflightIndex.published`), so that an
exact copy of a whole message sent again by another owner is answered as the first was,
and published no more.

Entries are added when a message opens and removed when it completes or is
aborted, so the index never outgrows the producers' own limits on unfinished
messages. Empty channels are removed at once. Pure; an owner is any hashable.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["MAX_HELD_CHARS", "MAX_HELD_IDS", "InflightIndex"]

MAX_HELD_IDS = 100_000
"""Ids held after their message ended, at most; past it the oldest hold ends early."""
MAX_HELD_CHARS = 8 * 1024 * 1024
"""Characters of the held ids and their channels' names together, at most; past it the
oldest hold ends early."""

OwnerT = TypeVar("OwnerT", bound=Hashable)
_NEVER = float("inf")


class InflightIndex(Generic[OwnerT]):
    """Messages in progress, by channel, in the order they opened."""

    __slots__ = (
        "_by_channel",
        "_held",
        "_held_chars",
        "_holders",
        "_prune_at",
        "hold",
        "max_held",
        "max_held_chars",
    )

    def __init__(
        self,
        hold: float = 0.0,
        max_held: int = MAX_HELD_IDS,
        max_held_chars: int = MAX_HELD_CHARS,
    ) -> None:
        self._by_channel: dict[str, dict[tuple[OwnerT, str], None]] = {}
        self._holders: dict[tuple[str, str], OwnerT] = {}
        self.hold, self.max_held, self.max_held_chars = hold, max_held, max_held_chars
        self._held_chars = 0
        # (channel, id) -> (owner, until, what was published), in the order the holds end.
        self._held: OrderedDict[tuple[str, str], tuple[OwnerT, float, object]] = OrderedDict()
        # When the first hold in the map ends (inf if none): pruning before it does nothing.
        self._prune_at = _NEVER

    def add(self, channel: str, owner: OwnerT, message_id: str) -> None:
        """Record that ``owner`` opened ``message_id`` on ``channel``."""
        self._by_channel.setdefault(channel, {})[(owner, message_id)] = None
        self._holders.setdefault((channel, message_id), owner)

    def claim(self, channel: str, owner: OwnerT, message_id: str, now: float = 0.0) -> bool:
        """Open ``message_id`` on ``channel`` for ``owner``; False (nothing changed) if
        another owner holds it, in progress or ended less than ``hold`` seconds ago."""
        key = (channel, message_id)
        holder = self._holders.get(key)
        if holder is None:
            held = self._held
            if held:  # as _held_by_another(), inline
                if now >= self._prune_at:
                    self._prune(now)
                ended = held.get(key)
                if ended is not None and ended[0] != owner:
                    return False
            self._holders[key] = owner
        elif holder != owner:
            return False
        self._by_channel.setdefault(channel, {})[(owner, message_id)] = None  # as add()
        return True

    def may_publish(
        self, channel: str, owner: OwnerT, message_id: str, claimed: bool, now: float = 0.0
    ) -> bool:
        """Whether ``owner`` may publish a delta or the terminal frame of ``message_id``.

        ``claimed``: the message opened before (it claimed the id), so its owner must
        still hold the id. Else it is a one-shot message: nobody else may hold the id,
        in progress or ended less than ``hold`` seconds ago.
        """
        holder = self._holders.get((channel, message_id))
        if claimed or holder is not None:
            return holder == owner
        return not self._held_by_another(channel, owner, message_id, now)

    def end(
        self,
        channel: str,
        owner: OwnerT,
        message_id: str,
        now: float,
        *,
        completed: bool = True,
        published: object = None,
    ) -> None:
        """A message completed or was aborted: forget it, and if it completed, hold its id
        for ``owner`` until ``now + hold``, with what the caller says of how it was
        ``published`` (see :meth:`published`)."""
        self.remove(channel, owner, message_id)
        if self.hold <= 0 or not completed:
            return
        if now >= self._prune_at:
            self._prune(now)
        key = (channel, message_id)
        held = self._held
        ended = held.pop(key, None)
        if ended is None:
            self._held_chars += len(channel) + len(message_id)
        held[key] = (owner, now + self.hold, published)
        front_moved = ended is not None or len(held) == 1
        while len(held) > self.max_held or self._held_chars > self.max_held_chars:
            (old_channel, old_id), _ = held.popitem(last=False)
            self._held_chars -= len(old_channel) + len(old_id)
            front_moved = True
        if front_moved:
            self._prune_at = next(iter(held.values()))[1] if held else _NEVER

    def held(self, channel: str, message_id: str, now: float) -> OwnerT | None:
        """The owner whose message under ``message_id`` ended on ``channel`` less than
        ``hold`` seconds before ``now``, if any."""
        if now >= self._prune_at:
            self._prune(now)
        entry = self._held.get((channel, message_id))
        return None if entry is None else entry[0]

    def published(self, channel: str, message_id: str, now: float) -> object:
        """What :meth:`end` was told of how the message under ``message_id`` that ended on
        ``channel`` less than ``hold`` seconds before ``now`` was published, if its id is
        held and nobody has a message under it in progress; None otherwise."""
        if (channel, message_id) in self._holders:
            return None
        self._prune(now)
        entry = self._held.get((channel, message_id))
        return None if entry is None else entry[2]

    @property
    def held_count(self) -> int:
        """Ids held after their message ended (some may have expired since the last call)."""
        return len(self._held)

    @property
    def held_chars(self) -> int:
        """Characters of the held ids and their channels' names."""
        return self._held_chars

    def _held_by_another(self, channel: str, owner: OwnerT, message_id: str, now: float) -> bool:
        held = self.held(channel, message_id, now)
        return held is not None and held != owner

    def _prune(self, now: float) -> None:
        """End the holds that end by ``now``. Callers skip the call before
        ``_prune_at``, when the oldest hold ends later (nearly every time)."""
        if now < self._prune_at:
            return
        held = self._held
        while held:
            key, (_, until, _) = next(iter(held.items()))
            if until > now:
                self._prune_at = until
                return
            del held[key]
            self._held_chars -= len(key[0]) + len(key[1])
        self._prune_at = _NEVER

    def remove(self, channel: str, owner: OwnerT, message_id: str) -> None:
        """Forget a message that completed or was aborted."""
        entries = self._by_channel.get(channel)
        if entries is None:
            return
        entries.pop((owner, message_id), None)
        if self._holders.get((channel, message_id)) == owner:
            del self._holders[(channel, message_id)]
        if not entries:
            del self._by_channel[channel]

    def holder(self, channel: str, message_id: str) -> OwnerT | None:
        """The first owner that opened ``message_id`` on ``channel`` and still has it."""
        return self._holders.get((channel, message_id))

    def in_channel(self, channel: str) -> list[tuple[OwnerT, str]]:
        """``(owner, message_id)`` of every message in progress on ``channel``, oldest first."""
        return list(self._by_channel.get(channel, ()))

    def owners(self, channel: str, message_id: str) -> list[OwnerT]:
        """The owners of ``message_id`` on ``channel`` (usually one, possibly none)."""
        entries = self._by_channel.get(channel, ())
        return [owner for owner, open_id in entries if open_id == message_id]

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_channel.values())
