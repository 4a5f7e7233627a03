"""Replies a redis-py connection has read and hiredis has parsed, taken without a pass
through redis-py's layers each.

redis-py reads a socket in big reads and parses with hiredis, but hands the replies out
one awaited call at a time, each through several layers (the connection's
``read_response``, its parser's, push handling, and for pub/sub the message's dict). A
burst of replies read at once (a pipeline's, or pub/sub messages) is taken here straight
from hiredis's reader: the first of them through redis-py as before, the rest from what
it parsed. Anything but a plain reply (a RESP3 push on a command connection, a
connection error) is left to redis-py's handling by the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    from redis._parsers.hiredis import NOT_ENOUGH_DATA
except ImportError:  # pragma: no cover - a redis-py without it reads a reply at a time
    NOT_ENOUGH_DATA = None

__all__ = ["NOT_ENOUGH_DATA", "buffered", "push_type"]


def buffered(connection: Any) -> Callable[[], Any] | None:
    """What takes the replies ``connection`` (a redis-py connection) has read and not yet
    handed out: the ``gets`` of hiredis's reader, through which redis-py parses them; it
    answers :data:`NOT_ENOUGH_DATA` once none is left whole. None where redis-py parses
    without hiredis, or keeps its reader elsewhere: each reply is read through redis-py."""
    if NOT_ENOUGH_DATA is None:
        return None
    reader = getattr(getattr(connection, "_parser", None), "_reader", None)
    gets: Callable[[], Any] | None = getattr(reader, "gets", None)
    return gets


def push_type(connection: Any) -> type | None:
    """The type hiredis gives a RESP3 push on ``connection``, if it tells them apart."""
    kind: type | None = getattr(
        getattr(connection, "_parser", None), "_hiredis_PushNotificationType", None
    )
    return kind
