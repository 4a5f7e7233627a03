"""What a connection may do: a role and the channels it may name.

A :class:`Grant` is decided once, at the handshake (from a verified token, see
:mod:`token_relay.edge.tokens`, or :data:`OPEN` when the relay runs without a
secret), and then every channel a connection names is checked against it.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from enum import StrEnum

from .errors import ErrorCode, FrameRejected

__all__ = ["OPEN", "Grant", "Role"]


class Role(StrEnum):
    """What a connection may do, which fixes the endpoint it may use."""

    PRODUCE = "produce"
    SUBSCRIBE = "subscribe"


@dataclass(frozen=True, slots=True)
class Grant:
    """What a verified token allows."""

    role: Role
    channels: tuple[str, ...]

    def allows(self, channel: str) -> bool:
        """Whether ``channel`` matches one of the granted names or patterns."""
        if "*" in self.channels:
            return True
        return any(
            channel == pattern or fnmatch.fnmatchcase(channel, pattern) for pattern in self.channels
        )

    def check(self, channel: str, message_id: str | None = None) -> None:
        """Raise ``forbidden`` unless ``channel`` is granted."""
        if not self.allows(channel):
            raise FrameRejected(
                ErrorCode.FORBIDDEN,
                f"this connection's token does not grant channel '{channel}'",
                message_id,
            )


OPEN = Grant(Role.PRODUCE, ("*",))
"""What every connection may do when the relay runs without a secret."""
