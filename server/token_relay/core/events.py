"""What a broker hands the relay: frame kinds, deltas, and the cut a joining subscriber reads.

These are the values that cross the line between a broker
(:mod:`token_relay.brokers`) and the channel router
(:mod:`token_relay.core.router`). They live in the core, so the router can
decide joins synchronously and brokers depend on nothing above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .codec import encode_delta

__all__ = ["CatchUp", "Delta", "FrameKind", "LiveMessage", "Outgoing", "Payload"]

Payload = str | bytes
"""A frame already serialized to JSON text."""


class FrameKind(StrEnum):
    """What an event carries, which decides who receives it."""

    TERMINAL = "t"
    """A ``message`` or ``aborted`` frame: every subscriber of the channel."""
    DELTA = "d"
    """A ``delta`` frame: deltas subscribers only."""
    SNAPSHOT = "s"
    """A ``snapshot`` frame replacing a message's text (after a broker outage): deltas only."""


class Delta:
    """One ``delta`` frame, kept as its fields and serialized once, when first needed.

    Brokers hand deltas over in this form, so that whoever merges deltas (the
    flush window, a slow subscriber's backlog) joins texts and never parses JSON.
    A delta is shared by every receiver: nothing may change it after it is made.
    """

    __slots__ = ("_rendered", "channel", "message_id", "text")

    def __init__(self, channel: str, message_id: str, text: str) -> None:
        self.channel = channel
        self.message_id = message_id
        self.text = text
        self._rendered: bytes | None = None

    def render(self) -> bytes:
        """The frame's JSON, serialized on the first call and reused after."""
        rendered = self._rendered
        if rendered is None:
            rendered = self._rendered = encode_delta(
                self.channel, self.message_id, self.text
            ).encode()
        return rendered

    def __len__(self) -> int:
        """Roughly the bytes of the frame, for buffer accounting, without serializing it."""
        return len(self.text) + len(self.message_id) + len(self.channel) + 48

    def __repr__(self) -> str:
        return f"Delta({self.channel!r}, {self.message_id!r}, {self.text!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Delta):
            return NotImplemented
        return (self.channel, self.message_id, self.text) == (
            other.channel,
            other.message_id,
            other.text,
        )

    __hash__ = None  # type: ignore[assignment]


Outgoing = Payload | Delta
"""A frame on its way to a socket: serialized, or a delta to serialize once."""


@dataclass(frozen=True, slots=True)
class LiveMessage:
    """A message in progress: its owner (a producer session), id and text so far."""

    owner: str
    message_id: str
    text: str
    chunks: list[dict[str, Any]] | None = None
    """A structured message's compacted catch-up chunks (its ``text`` is its text parts')."""


@dataclass(frozen=True, slots=True)
class CatchUp:
    """A consistent cut of a channel, for a joining subscriber."""

    offset: int
    epoch: str
    recovered: bool | None
    """None when no ``since`` was given; else whether ``frames`` close the gap."""
    frames: list[str]
    """The missed terminal frames, in offset order (empty unless recovered)."""
    seq: int
    """Events with a ``seq`` up to this one are reflected in the cut."""
    live: list[LiveMessage]
    """Messages in progress (only when asked for)."""
    ages: list[float] = field(default_factory=list)
    """For a rewind: seconds since each of ``frames`` was recorded (empty otherwise)."""
