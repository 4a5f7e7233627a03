"""Why a chunk is refused: the codes of :class:`~token_relay.core.errors.PartRejected`,
and the bounds of one message's parts (:class:`PartLimits`).

Every refusal changes nothing: the chunk is refused whole and every part stays as it
was. Each bound's policy is in :class:`PartLimits`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ..errors import ConfigError, PartRejected

INVALID_CHUNK: Final = "invalid_chunk"
UNKNOWN_PART: Final = "unknown_part"
PART_ENDED: Final = "part_ended"
PART_EXISTS: Final = "part_exists"
TOO_MANY_PARTS: Final = "too_many_parts"
PART_TOO_LARGE: Final = "part_too_large"
CODES: Final = frozenset(
    {INVALID_CHUNK, UNKNOWN_PART, PART_ENDED, PART_EXISTS, TOO_MANY_PARTS, PART_TOO_LARGE}
)
"""Every :attr:`PartRejected.code` this package raises."""


@dataclass(frozen=True, slots=True)
class PartLimits:
    """Bounds on one message's parts; a chunk past one is refused and changes nothing."""

    max_parts: int = 256
    """Parts in the message, steps included (``too_many_parts``)."""
    max_part_chars: int = 1_048_576
    """Characters of one text or reasoning part, and of any string field (``part_too_large``)."""
    max_tool_input_chars: int = 262_144
    """Characters of one tool call's streamed input text (``part_too_large``)."""
    max_data_bytes: int = 65_536
    """Bytes of the compact JSON of one structured value: data, tool input or output,
    metadata (``part_too_large``)."""

    def __post_init__(self) -> None:
        if min(self.max_parts, self.max_part_chars, self.max_tool_input_chars) < 1:
            raise ConfigError("max_parts, max_part_chars and max_tool_input_chars must be >= 1")
        if self.max_data_bytes < 4:  # room for ``null``
            raise ConfigError("max_data_bytes must be at least 4")


def reject(code: str, message: str, part_id: str | None = None) -> PartRejected:
    """The refusal to raise: ``code`` is one of :data:`CODES`, ``part_id`` the id named."""
    return PartRejected(code, message, part_id)
