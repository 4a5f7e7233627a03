"""What one message's parts hold: the records in order, the maps that find them by id,
and the characters held.

The message (:class:`~token_relay.core.parts.MessageParts`) is this state with the chunks
of each kind applied by its own module (``texts``, ``tools``), as mixins of this class:
one set of slots, one object per message, no call between objects on the hot path.
"""

from __future__ import annotations

from typing import Any, Final

from .records import Part, TextRecord, ToolRecord, held_size
from .refusals import TOO_MANY_PARTS, PartLimits, reject

DEFAULT_LIMITS: Final = PartLimits()
"""The bounds a message gets unless it is given its own."""


class PartsState:
    """What one message's parts hold; :class:`~token_relay.core.parts.MessageParts` and
    the chunks of each kind (texts, tools) work on it."""

    __slots__ = (
        "_approvals",
        "_chars",
        "_data",
        "_finalized",
        "_finish_marks",
        "_open_tools",
        "_parts",
        "_reasonings",
        "_text_ids",
        "_texts",
        "_tools",
        "limits",
    )

    def __init__(self, limits: PartLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._parts: list[Part] = []
        self._texts: dict[str, TextRecord] = {}
        """Open text parts by chunk id."""
        self._reasonings: dict[str, TextRecord] = {}
        """Open reasoning parts by chunk id."""
        self._text_ids: set[tuple[str, str]] = set()
        """(kind, chunk id) of every text and reasoning part, to tell ended from unknown."""
        self._tools: dict[str, ToolRecord] = {}
        """Every tool part, by tool call id."""
        self._open_tools: dict[str, ToolRecord] = {}
        """Tool parts whose input may still stream: started in the current step."""
        self._approvals: dict[str, ToolRecord] = {}
        """Tool parts by the approval id asked for them."""
        self._data: dict[tuple[str, str], tuple[int, int]] = {}
        """(type, id) of a data part → (its index, the bytes of its data's JSON)."""
        self._finish_marks: list[int] = []
        """The number of parts at each ``finish-step`` that ended open parts."""
        self._chars = 0
        self._finalized = False

    def _room(self) -> None:
        if len(self._parts) >= self.limits.max_parts:
            raise reject(TOO_MANY_PARTS, f"the message already has {self.limits.max_parts} parts")

    def _append(self, part: dict[str, Any]) -> int:
        """Add a part kept as an object, counting what it holds (:func:`held_size`)."""
        self._room()
        self._parts.append(part)
        self._chars += held_size(part)
        return len(self._parts) - 1

    def _recount(self, record: TextRecord | ToolRecord) -> None:
        """Count what ``record`` holds beside its text anew, in place of what it held:
        after every change of it but its text."""
        counted = record.count()
        self._chars += counted - record.counted
        record.counted = counted
