"""The ``--delta-flush-ms`` window: a channel's deltas merged per message before fan-out.

Under high token rates to many subscribers, every delta frame costs a write per
subscriber. With a window, the deltas a channel receives within it are held,
the deltas of each message joined in order, and sent as one ``delta`` frame per
message when the window closes, or at once before any other frame of the
channel (a completed message never overtakes its deltas). Lossless: the joined
delta is exactly the concatenation. Each merged frame keeps the highest event
number (``seq``) of its parts.

Pure: the relay owns the timer.
"""

from __future__ import annotations

import json

from .protocol import encode_delta

__all__ = ["DeltaWindow"]


class DeltaWindow:
    """Deltas held back per channel, per message, in arrival order."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: dict[str, dict[str, tuple[list[str], int]]] = {}

    def add(self, channel: str, seq: int, payload: str | bytes) -> bool:
        """Hold a delta frame; True if it is the channel's first held one (start a timer)."""
        frame = json.loads(payload)
        messages = self._pending.get(channel)
        first = messages is None
        if messages is None:
            messages = self._pending[channel] = {}
        held = messages.get(frame["id"])
        if held is None:
            messages[frame["id"]] = ([frame["delta"]], seq)
        else:
            held[0].append(frame["delta"])
            messages[frame["id"]] = (held[0], seq)
        return first

    def holds(self, channel: str) -> bool:
        """Whether the channel has deltas held."""
        return channel in self._pending

    def take(self, channel: str) -> list[tuple[int, str]]:
        """The channel's merged delta frames, ``(seq, frame)``, releasing them."""
        messages = self._pending.pop(channel, None)
        if not messages:
            return []
        return [
            (seq, encode_delta(channel, message_id, "".join(parts)))
            for message_id, (parts, seq) in messages.items()
        ]

    def __len__(self) -> int:
        return len(self._pending)
