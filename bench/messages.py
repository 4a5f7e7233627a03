"""The messages every case sends: deterministic texts, pre-encoded event frames.

Message number ``n`` is ``deltas`` deltas of about four characters, accented letters and an
emoji among them, so that a relay that splits or re-encodes text wrongly is caught by the
exact comparison; the first delta (``#NNN``) makes neighbouring messages differ. Any process
can rebuild a message's text from its number alone (:func:`message_text`), which is how the
subscriber processes check what they receive.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

PIECES = ("The ", "quic", "k br", "own ", "fox ", "jump", "s ov", "er é", "🚀 la", "zy d", "og. ")


def encode(frame: dict[str, Any] | list[Any]) -> str:
    """Compact JSON, as a gateway would send it."""
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Message:
    """One message to send: its id, its events and their frames, and its text."""

    id: str
    events: tuple[dict[str, Any], ...]
    """``deltas`` delta events, then the final event (which carries no delta)."""
    frames: tuple[str, ...]
    """The events encoded as JSON text, one frame each."""
    text: str


def message_text(index: int, deltas: int) -> list[str]:
    """The deltas of message number ``index``."""
    pieces = [f"#{index % 1000:03d}"]
    pieces += [PIECES[(index + n) % len(PIECES)] for n in range(1, deltas)]
    return pieces[:deltas]


def build_messages(count: int, deltas: int, prefix: str = "m") -> list[Message]:
    """``count`` messages of ``deltas`` deltas and a final; number ``n`` has id ``prefix + n``."""
    messages = []
    for index in range(count):
        message_id = f"{prefix}{index}"
        pieces = message_text(index, deltas)
        events: list[dict[str, Any]] = [{"id": message_id, "delta": piece} for piece in pieces]
        events.append({"id": message_id, "final": True})
        frames = tuple(encode(event) for event in events)
        messages.append(Message(message_id, tuple(events), frames, "".join(pieces)))
    return messages
