"""Live reads waiting for a change, by what they read (a Durable Streams path, a channel).

A reader listens *before* it reads (:meth:`Waiters.listen`), so that a change whose wake
comes while its read is under way wakes its next wait; it is forgotten once woken, timed out
or done (:meth:`Waiters.discard`). Each waiter is one reader's: the map holds at most one per
live read in progress, and a key with none is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

__all__ = ["Waiters", "woken"]


async def woken(
    waiter: asyncio.Future[None],
    timeout: float,  # noqa: ASYNC109
    gone: asyncio.Future[None] | None,
) -> None:
    """Wait until ``waiter`` is woken, ``timeout`` seconds pass, or the reader is ``gone``
    (its socket closed: no one is left to answer)."""
    await asyncio.wait(
        (waiter,) if gone is None else (waiter, gone),
        timeout=timeout,
        return_when=asyncio.FIRST_COMPLETED,
    )


class Waiters:
    """The futures of the reads waiting on each key."""

    def __init__(self) -> None:
        self._by_key: dict[str, set[asyncio.Future[None]]] = {}

    def listen(self, key: str) -> asyncio.Future[None]:
        """A waiter for the next change at ``key``, done once :meth:`wake` is called for it."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._by_key.setdefault(key, set()).add(waiter)
        return waiter

    def discard(self, key: str, waiter: asyncio.Future[None]) -> None:
        """Forget ``waiter`` (woken, timed out, or its reader done)."""
        waiting = self._by_key.get(key)
        if waiting is not None:
            waiting.discard(waiter)
            if not waiting:
                del self._by_key[key]

    def wake(self, key: str) -> None:
        """``key`` changed: every read waiting on it looks again."""
        for waiter in self._by_key.pop(key, ()):
            if not waiter.done():
                waiter.set_result(None)

    def wake_all(self) -> None:
        """Every read waiting on anything looks again (the relay is stopping)."""
        for key in list(self._by_key):
            self.wake(key)

    def __bool__(self) -> bool:
        """Whether any read waits."""
        return bool(self._by_key)

    def __iter__(self) -> Iterator[str]:
        """The keys some read waits on."""
        return iter(self._by_key)
