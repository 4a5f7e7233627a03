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

Entries are added when a message opens and removed when it completes or is
aborted, so the index never outgrows the producers' own limits on unfinished
messages. Empty channels are removed at once. Pure; an owner is any hashable.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["InflightIndex"]

OwnerT = TypeVar("OwnerT", bound=Hashable)


class InflightIndex(Generic[OwnerT]):
    """Messages in progress, by channel, in the order they opened."""

    __slots__ = ("_by_channel", "_holders")

    def __init__(self) -> None:
        self._by_channel: dict[str, dict[tuple[OwnerT, str], None]] = {}
        self._holders: dict[tuple[str, str], OwnerT] = {}

    def add(self, channel: str, owner: OwnerT, message_id: str) -> None:
        """Record that ``owner`` opened ``message_id`` on ``channel``."""
        self._by_channel.setdefault(channel, {})[(owner, message_id)] = None
        self._holders.setdefault((channel, message_id), owner)

    def claim(self, channel: str, owner: OwnerT, message_id: str) -> bool:
        """Open ``message_id`` on ``channel`` for ``owner``; False (nothing changed) if
        another owner holds it."""
        holder = self._holders.get((channel, message_id))
        if holder is not None and holder != owner:
            return False
        self.add(channel, owner, message_id)
        return True

    def may_publish(self, channel: str, owner: OwnerT, message_id: str, claimed: bool) -> bool:
        """Whether ``owner`` may publish a delta or the terminal frame of ``message_id``.

        ``claimed``: the message opened before (it claimed the id), so its owner must
        still hold the id. Else it is a one-shot message: nobody else may hold the id.
        """
        holder = self._holders.get((channel, message_id))
        return holder == owner if claimed else holder is None or holder == owner

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
