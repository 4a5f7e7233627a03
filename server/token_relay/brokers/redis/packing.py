"""Redis commands packed by hiredis' C packer: the bytes redis-py's own packer makes, in a
fraction of its time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.typing import EncodableT

hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as hiredis_pack
except ImportError:  # pragma: no cover - redis-py without the [redis] extra's hiredis
    hiredis_pack = None

__all__ = ["PACKING", "hiredis_pack", "packed", "packed_together"]

_PACKED_BY_HIREDIS = frozenset((str, bytes, int))
"""The argument types hiredis packs as redis-py would (redis-py refuses a bool)."""


def packed(args: tuple[EncodableT, ...]) -> list[bytes] | None:
    """A command packed by hiredis' C packer: the bytes redis-py's own packer makes from
    strings, bytes and integers (UTF-8, strict), in a fraction of its time; None for any
    other command (a name that is not one plain word, which redis-py splits at its
    spaces; another type of argument) or without hiredis."""
    first = args[0]
    if (
        hiredis_pack is None
        or not (type(first) is str and first.isascii() and first.isalnum())
        or not _PACKED_BY_HIREDIS.issuperset(map(type, args))
    ):
        return None
    return [hiredis_pack(args)]


def packed_together(commands: list[tuple[EncodableT, ...]]) -> list[bytes] | None:
    """The writer's scripts packed by :func:`packed` into one buffer, the bytes redis-py's
    packer makes; None if any one of them is not (redis-py's packer decides then)."""
    each = [packed(command) for command in commands]
    if None in each:
        return None
    return [b"".join(parts[0] for parts in each if parts is not None)]


class _HiredisPacking(AbstractConnection):
    """Mixed in before a redis-py connection class: its commands packed by :func:`packed`."""

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return packed(args) or super().pack_command(*args)


class _Connection(_HiredisPacking, Connection):
    pass


class _SSLConnection(_HiredisPacking, SSLConnection):
    pass


class _UnixConnection(_HiredisPacking, UnixDomainSocketConnection):
    pass


PACKING: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: _Connection,
    SSLConnection: _SSLConnection,
    UnixDomainSocketConnection: _UnixConnection,
}
"""redis-py's connection classes, each with its commands packed by hiredis."""
