"""What a deltas subscriber makes of a channel's live frames: each message's parts so far.

:class:`LiveParts` follows the protocol's rule for rebuilding a reply while it streams,
with the relay's own assembler (:class:`~token_relay.core.parts.MessageParts`) as the
client's: a plain message's ``delta`` frames extend its implicit text part; a ``chunks``
frame applies its chunks; a ``snapshot`` replaces what was held of its message (its
``chunks``, or its text as the implicit text part); a ``message`` or ``aborted`` frame ends
it with its ``parts``. Applying a chunk twice (a part sent twice) fails loudly.
"""

from __future__ import annotations

from typing import Any

from token_relay.core.parts import MessageParts

__all__ = ["LiveParts"]


class LiveParts:
    """Each message's live parts, from the frames a deltas subscriber gets."""

    def __init__(self) -> None:
        self.live: dict[str, MessageParts] = {}
        self.ended: dict[str, dict[str, Any]] = {}
        """The terminal frame of each message that ended."""
        self.snapshots: dict[str, list[dict[str, Any]]] = {}
        """The chunks of each message's last structured snapshot."""

    def feed(self, frame: dict[str, Any]) -> None:
        """Take one frame (any kind; those about no message are ignored)."""
        kind, message_id = frame.get("type"), frame.get("id")
        if not isinstance(message_id, str):
            return
        if kind == "delta":
            self._parts(message_id).delta(frame["delta"])
        elif kind == "chunks":
            parts = self._parts(message_id)
            for chunk in frame["chunks"]:
                parts.apply(chunk)
        elif kind == "snapshot":
            parts = self.live[message_id] = MessageParts()
            if "chunks" in frame:
                self.snapshots[message_id] = frame["chunks"]
                for chunk in frame["chunks"]:
                    parts.apply(chunk)
                assert parts.text() == frame["text"], "a snapshot's text is its parts' text"
            else:
                assert "from" not in frame, "a resumed plain snapshot is not rebuilt here"
                parts.delta(frame["text"])
        elif kind in ("message", "aborted"):
            self.ended[message_id] = frame

    def parts(self, message_id: str, *, final: bool = False) -> list[dict[str, Any]]:
        """A message's parts so far (``final``: as its final would complete them)."""
        parts = self.live[message_id]
        if final:
            parts.finalize()
        return parts.parts()

    def _parts(self, message_id: str) -> MessageParts:
        parts = self.live.get(message_id)
        if parts is None:
            parts = self.live[message_id] = MessageParts()
        return parts
