"""Connection tokens: HS256 JWTs that grant a role on a set of channels.

This is the public API for minting tokens from application code, for example a
backend that hands each browser a token for its own chat channel::

    from token_relay.tokens import Role, mint

    token = mint(secret, Role.SUBSCRIBE, ["chat-42"], ttl=3600)

Importing it loads the core's grant rules and PyJWT, and no part of the relay.

A token's claims are ``role`` (``produce``, ``subscribe`` or ``admin``), ``channels``
(exact names or prefixes ending in ``*`` such as ``chat-*``) and ``exp``. The relay checks
the token once, at the handshake, and keeps the resulting
:class:`~token_relay.core.grants.Grant` on the connection. Tokens are read from
``?token=`` (browsers can't set headers on a WebSocket) or ``Authorization:
Bearer``; they are never logged.
"""

from __future__ import annotations

import time
from typing import Any

import jwt

from .core.errors import ConfigError, InvalidToken
from .core.grants import Grant, Role, refusal

__all__ = ["ALGORITHM", "Role", "mint", "verify"]

ALGORITHM = "HS256"


def mint(secret: str, role: Role, channels: list[str], ttl: float) -> str:
    """A signed token granting ``role`` on ``channels`` for ``ttl`` seconds.

    Raises :class:`ConfigError` for a channel that cannot be a grant (see
    :func:`~token_relay.core.grants.refusal`).
    """
    for channel in channels:
        problem = refusal(channel)
        if problem is not None:
            raise ConfigError(problem)
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
        raise InvalidToken("claim 'role' must be 'produce', 'subscribe' or 'admin'") from None
    channels = claims.get("channels")
    if not isinstance(channels, list) or not all(isinstance(c, str) for c in channels):
        raise InvalidToken("claim 'channels' must be a list of names or patterns")
    for channel in channels:
        problem = refusal(channel)
        if problem is not None:
            raise InvalidToken(problem)
    return Grant(role, tuple(channels))
