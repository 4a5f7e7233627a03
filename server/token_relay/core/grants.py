"""What a connection may do: a role and the channels it may name.

A grant names channels exactly, or by prefix: ``chat-*`` is every channel that starts
with ``chat-`` (:func:`refusal` says what may not be a grant).

A :class:`Grant` is decided once, at the handshake (from a verified token, see
:mod:`token_relay.tokens`, or :data:`OPEN` when the relay runs without a
secret), and then every channel a connection names is checked against it.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from .errors import ErrorCode, FrameRejected

__all__ = ["METACHARACTERS", "OPEN", "Grant", "Role", "refusal"]


class Role(StrEnum):
    """What a connection may do, which fixes the endpoint it may use."""

    PRODUCE = "produce"
    SUBSCRIBE = "subscribe"
    ADMIN = "admin"
    """The operator's endpoints (``/webhooks/dead``); no channel endpoint takes it."""


METACHARACTERS = frozenset("*?[")
"""Characters a grant may not hold, but for one ``*`` at its very end (a prefix grant)."""


def refusal(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a grant, or None if it can.

    A grant is an exact channel name, or a prefix followed by one ``*`` at the end
    (``chat-*`` grants every channel that starts with ``chat-``; ``*`` grants every
    channel). Channel names may hold ``*``, ``?`` and ``[`` themselves, so a grant that
    holds them anywhere else would be ambiguous, and is refused.
    """
    body = pattern[:-1] if pattern.endswith("*") else pattern
    if METACHARACTERS & set(body):
        return (
            f"grant {pattern!r}: a grant is an exact channel name, or a prefix ending in one "
            "'*'; '*', '?' and '[' are not allowed anywhere else"
        )
    return None


@dataclass(frozen=True, slots=True)
class Grant:
    """What a verified token allows: exact channel names and prefix grants (``chat-*``)."""

    role: Role
    channels: tuple[str, ...]
    _exact: frozenset[str] = field(init=False, repr=False, compare=False)
    _prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        exact = frozenset(c for c in self.channels if not c.endswith("*"))
        prefixes = tuple(c[:-1] for c in self.channels if c.endswith("*"))
        object.__setattr__(self, "_exact", exact)
        object.__setattr__(self, "_prefixes", prefixes)

    def allows(self, channel: str) -> bool:
        """Whether ``channel`` is one of the granted names or starts with a granted prefix."""
        return channel in self._exact or channel.startswith(self._prefixes)

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
