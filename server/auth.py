"""Connection tokens: HS256 JWTs that grant a role on a set of channels.

A token's claims are ``role`` (``produce`` or ``subscribe``), ``channels`` (exact
names or glob patterns such as ``chat-*``) and ``exp``. The relay checks the
token once, at the handshake, and then every channel a connection names against
its :class:`Grant`. Tokens are read from ``?token=`` (browsers can't set headers
on a WebSocket) or ``Authorization: Bearer``; they are never logged.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import jwt

from .errors import ErrorCode, FrameRejected

__all__ = ["ALGORITHM", "Grant", "InvalidToken", "Role", "mint", "verify"]

ALGORITHM = "HS256"


class Role(StrEnum):
    """What a connection may do, which fixes the endpoint it may use."""

    PRODUCE = "produce"
    SUBSCRIBE = "subscribe"


class InvalidToken(Exception):
    """The token is missing, malformed, badly signed, expired, or lacks a claim."""


@dataclass(frozen=True, slots=True)
class Grant:
    """What a verified token allows."""

    role: Role
    channels: tuple[str, ...]

    def allows(self, channel: str) -> bool:
        """Whether ``channel`` matches one of the granted names or patterns."""
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


def mint(secret: str, role: Role, channels: list[str], ttl: float) -> str:
    """A signed token granting ``role`` on ``channels`` for ``ttl`` seconds."""
    claims = {"role": role.value, "channels": channels, "exp": int(time.time() + ttl)}
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def verify(token: str, secret: str) -> Grant:
    """Check a token's signature, expiry and claims, or raise :class:`InvalidToken`."""
    try:
        claims: dict[str, Any] = jwt.decode(
            token, secret, algorithms=[ALGORITHM], options={"require": ["exp"]}
        )
    except jwt.PyJWTError as exc:
        raise InvalidToken(str(exc)) from None
    try:
        role = Role(str(claims.get("role")))
    except ValueError:
        raise InvalidToken("claim 'role' must be 'produce' or 'subscribe'") from None
    channels = claims.get("channels")
    if not isinstance(channels, list) or not all(isinstance(c, str) for c in channels):
        raise InvalidToken("claim 'channels' must be a list of names or patterns")
    return Grant(role, tuple(channels))
