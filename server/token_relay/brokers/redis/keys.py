"""The names of the broker's keys and topics in Redis, how long they live, and how what
Redis hands back reads as text."""

from __future__ import annotations

__all__ = ["INSTANCES", "KEY_TTL", "key", "session_keys", "text"]

KEY_TTL = 7 * 24 * 3600
"""Seconds an idle channel's epoch and offset are kept."""
INSTANCES = "tr:instances"
"""The set of every process that holds, or held, a lease."""


def key(kind: str, name: str) -> str:
    """The key (or pub/sub topic) of ``kind`` for ``name``: ``tr:KIND:NAME``."""
    return f"tr:{kind}:{name}"


def session_keys(token: str, owner: str) -> tuple[str, ...]:
    """The keys of a session and of what its owner noted: forgotten together."""
    return (
        key("session", token),
        key("msg", owner),
        key("done", owner),
        key("dl", owner),
        key("meta", owner),
    )


def text(value: bytes | str) -> str:
    """A value read from Redis, as text."""
    return value.decode() if isinstance(value, bytes) else value
