"""One delta merger: an ordered queue of frames in which a message's pending deltas join.

Two places hold frames back and merge the deltas among them:

* the ``--delta-flush-ms`` window (:class:`~token_relay.core.router.ChannelRouter`),
  which holds a channel's deltas for a few milliseconds and sends one frame per message;
* a slow subscriber's backlog (:class:`Backlog`), which queues frames for a socket
  that reads slower than the relay writes.

Both use :class:`DeltaQueue`. A :class:`~token_relay.core.events.Delta` joins the
queued delta of the same message if nothing but deltas was queued after it, so a
reply streamed token by token to a stalled reader costs one growing frame, not
one frame per token, and the text that arrives is exactly the concatenation.
Any other frame is queued as it is and closes every open delta to merging, so
nothing ever moves past a frame queued before it. A merged delta stops growing
at :data:`MAX_MERGED_CHARS`, and the next one starts a new frame.

The queue holds structured deltas and serializes each frame once, when it leaves;
it never parses JSON. Pure: the caller bounds it with :attr:`DeltaQueue.bytes`.
"""

from __future__ import annotations

from collections import deque

from .events import Delta, Outgoing, Payload

__all__ = ["MAX_MERGED_CHARS", "Backlog", "DeltaQueue"]

MAX_MERGED_CHARS = 64 * 1024
"""A merged delta stops growing here, so no merged frame outgrows what clients accept."""


class _Pending:
    """A queued delta, and the texts merged into it since."""

    __slots__ = ("chars", "first", "parts", "seq")

    def __init__(self, first: Delta, seq: int) -> None:
        self.first = first
        self.parts: list[str] | None = None
        self.chars = len(first.text)
        self.seq = seq

    def add(self, text: str, seq: int) -> None:
        if self.parts is None:
            self.parts = [self.first.text]
        self.parts.append(text)
        self.chars += len(text)
        self.seq = seq

    def delta(self) -> Delta:
        """The delta as merged: the first one itself if nothing joined it."""
        if self.parts is None:
            return self.first
        first = self.first
        return Delta(first.channel, first.message_id, "".join(self.parts))


class DeltaQueue:
    """Frames in order, with consecutive deltas of one message merged."""

    __slots__ = ("_items", "_open", "bytes", "merged")

    def __init__(self) -> None:
        self._items: deque[Payload | _Pending] = deque()
        self._open: dict[tuple[str, str], _Pending] = {}
        self.bytes = 0
        """Approximate bytes queued."""
        self.merged = 0
        """Deltas merged into an earlier one so far."""

    def push(self, item: Outgoing, seq: int = 0) -> bool:
        """Queue a frame; True if it was a delta merged into a queued one.

        ``seq`` is the broker's event number; a merged delta keeps its last part's.
        """
        self.bytes += len(item)
        if not isinstance(item, Delta):
            self._open.clear()
            self._items.append(item)
            return False
        key = (item.channel, item.message_id)
        pending = self._open.get(key)
        if pending is not None and pending.chars + len(item.text) <= MAX_MERGED_CHARS:
            pending.add(item.text, seq)
            self.merged += 1
            return True
        pending = self._open[key] = _Pending(item, seq)
        self._items.append(pending)
        return False

    def pop(self) -> Outgoing:
        """The oldest queued frame (a merged delta as one :class:`Delta`)."""
        item = self._items.popleft()
        if isinstance(item, _Pending):
            key = (item.first.channel, item.first.message_id)
            if self._open.get(key) is item:
                del self._open[key]
            outgoing: Outgoing = item.delta()
        else:
            outgoing = item
        self.bytes = max(0, self.bytes - len(outgoing)) if self._items else 0
        return outgoing

    def take(self) -> list[tuple[int, Outgoing]]:
        """Everything queued, ``(seq, frame)`` in order, emptying the queue."""
        taken: list[tuple[int, Outgoing]] = []
        for item in self._items:
            if isinstance(item, _Pending):
                taken.append((item.seq, item.delta()))
            else:
                taken.append((0, item))
        self.clear()
        return taken

    def clear(self) -> None:
        """Drop everything queued."""
        self._items.clear()
        self._open.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)


class Backlog(DeltaQueue):
    """A slow subscriber's queue of unsent frames; :meth:`pop` serializes each one."""

    __slots__ = ()

    def pop_payload(self) -> Payload:
        """The oldest queued frame, serialized."""
        item = self.pop()
        return item.render() if isinstance(item, Delta) else item
