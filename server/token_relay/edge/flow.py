"""Write flow control shared by every peer that owns a socket: wait while its buffer is full."""

from __future__ import annotations

import asyncio

__all__ = ["WriteFlow"]


class WriteFlow:
    """The ``pause_writing``/``resume_writing`` half of an ``asyncio.Protocol``, and a
    :meth:`drain` that waits for the socket's buffer to fall under its low-water mark."""

    def __init__(self) -> None:
        self._paused_writing = False
        self._drained: asyncio.Future[None] | None = None

    def gone(self) -> bool:
        """Whether the socket is gone (nothing to wait for then); each peer says."""
        return False

    async def drain(self) -> None:
        """Wait until the socket's buffer is under its high-water mark."""
        if not self._paused_writing or self.gone():
            return
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._drained)

    def pause_writing(self) -> None:
        """The transport's buffer passed its high-water mark."""
        self._paused_writing = True

    def resume_writing(self) -> None:
        """The transport's buffer fell under its low-water mark (or the socket is gone)."""
        self._paused_writing = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
