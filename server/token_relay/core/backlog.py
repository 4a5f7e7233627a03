"""Frames waiting for one slow subscriber, with its pending deltas merged losslessly.

When a subscriber reads slower than the relay writes, its frames queue here
instead of in the socket. A delta joins the queued delta of the same message if
nothing else of that message was queued after it, so a reply streamed token by
token to a stalled reader costs one growing frame, not one frame per token,
and the text that finally arrives is exactly the same. Every other frame
(messages, aborts, snapshots, confirmations, errors) is queued as is, in order:
nothing is ever dropped here. The caller bounds the total with :attr:`bytes`.

Pure: it parses a delta frame only when it has to merge it.
"""

from __future__ import annotations

import json
from collections import deque

from .protocol import DeltaFrame, encode

__all__ = ["MAX_MERGED_CHARS", "Backlog"]

Payload = str | bytes

MAX_MERGED_CHARS = 64 * 1024
"""A merged delta stops growing here and the next one starts a new frame, so no merged
frame outgrows what clients accept (1 MiB by default in websockets)."""


class _MergedDelta:
    __slots__ = ("channel", "chars", "message_id", "parts")

    def __init__(self, channel: str, message_id: str, delta: str) -> None:
        self.channel = channel
        self.message_id = message_id
        self.parts = [delta]
        self.chars = len(delta)

    def render(self) -> str:
        frame = DeltaFrame(channel=self.channel, id=self.message_id, delta="".join(self.parts))
        return encode(frame)


class Backlog:
    """A subscriber's queue of unsent frames."""

    __slots__ = ("_items", "_open", "bytes", "merged")

    def __init__(self) -> None:
        self._items: deque[Payload | _MergedDelta] = deque()
        self._open: dict[tuple[str, str], _MergedDelta] = {}
        self.bytes = 0
        """Approximate bytes queued."""
        self.merged = 0
        """Deltas merged into an earlier one so far."""

    def add(self, payload: Payload, is_delta: bool = False) -> bool:
        """Queue a frame; returns True if it was a delta merged into a queued one."""
        self.bytes += len(payload)
        frame = json.loads(payload) if is_delta or self._open else None
        if frame is None:
            self._items.append(payload)
            return False
        key = (frame.get("channel", ""), frame.get("id", ""))
        if not is_delta:
            # Anything else about this message closes its open delta to merging.
            self._open.pop(key, None)
            self._items.append(payload)
            return False
        pending = self._open.get(key)
        delta = frame["delta"]
        if pending is not None and pending.chars + len(delta) <= MAX_MERGED_CHARS:
            pending.parts.append(delta)
            pending.chars += len(delta)
            self.merged += 1
            return True
        pending = _MergedDelta(key[0], key[1], delta)
        self._open[key] = pending
        self._items.append(pending)
        return False

    def pop(self) -> Payload:
        """The oldest queued frame, serialized (merged deltas are rendered now)."""
        item = self._items.popleft()
        if isinstance(item, _MergedDelta):
            if self._open.get((item.channel, item.message_id)) is item:
                del self._open[(item.channel, item.message_id)]
            payload: Payload = item.render()
        else:
            payload = item
        self.bytes = max(0, self.bytes - len(payload)) if self._items else 0
        return payload

    def clear(self) -> None:
        """Drop everything queued (its socket is being closed)."""
        self._items.clear()
        self._open.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)
