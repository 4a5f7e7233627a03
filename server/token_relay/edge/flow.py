"""What every peer shares: who it is (:class:`PeerBase`) and, for one that owns its
socket, write flow control and its end (:class:`SocketPeer`); and the event loop's clock
as the hot path reads it (:func:`loop_clock`)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable

from websockets import CloseCode

from ..core.grants import Grant

__all__ = ["PeerBase", "SocketPeer", "loop_clock"]


def loop_clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """``loop.time``; for asyncio's own loops, the ``time.monotonic`` it returns, called
    directly (a call less per read of the clock, the same values)."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


def _direct_descriptor(transport: asyncio.BaseTransport) -> int:
    """The descriptor of a plain socket under ``transport``, or -1 (no socket, or TLS,
    whose bytes on the socket are not the peer's)."""
    if transport.get_extra_info("sslcontext") is not None:
        return -1
    sock = transport.get_extra_info("socket")
    return sock.fileno() if sock is not None else -1


class PeerBase:
    """A peer's identity: its id, its socket, the request that admitted it, its client's
    address (the peer's, or the one a trusted proxy forwarded for) and its grant."""

    __slots__ = ("_id", "client", "grant", "path", "transport")

    def __init__(
        self, transport: asyncio.Transport, *, path: str, client: str, grant: Grant
    ) -> None:
        self._id: uuid.UUID | None = None
        self.transport = transport
        self.path = path
        """The request target, query included."""
        self.client = client
        self.grant = grant

    @property
    def id(self) -> uuid.UUID:
        """Names the peer in logs: made when first asked for (most HTTP producers never
        are), then the same."""
        if self._id is None:
            self._id = uuid.uuid4()
        return self._id


class SocketPeer(PeerBase):
    """Writes straight to the socket while the transport holds nothing (:meth:`write_now`),
    the ``pause_writing``/``resume_writing`` half of an ``asyncio.Protocol``, a
    :meth:`drain` that waits for the socket's buffer to fall under its low-water mark,
    and the socket's end: :meth:`close` (each peer says how in :meth:`start_close`),
    :meth:`abort` and :meth:`wait_closed`."""

    __slots__ = ("_closed", "_drained", "_fd", "paused")

    def __init__(
        self, transport: asyncio.Transport, *, path: str, client: str, grant: Grant
    ) -> None:
        super().__init__(transport, path=path, client=client, grant=grant)
        self.paused = False
        """Whether the socket's buffer is over its high-water mark (:meth:`drain` waits)."""
        self._drained: asyncio.Future[None] | None = None
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._fd = _direct_descriptor(transport)
        """The socket, written to directly while the transport holds nothing; -1 if every
        byte must go through the transport."""

    def write_now(self, data: bytes) -> None:
        """Write ``data`` to the socket now, or behind what the transport still holds.

        The caller has checked that the transport is not closing, so the descriptor is
        still this socket's. Straight to the socket, a write is one system call without the
        transport's own Python, which is most of a fan-out's cost per socket after the
        system call. What the socket does not take (or a write that fails) goes to the
        transport, which sends it later, or meets the error and reports it; every write
        after it goes behind it until the transport is empty again, so bytes keep their
        order.
        """
        transport = self.transport
        fd = self._fd
        if fd >= 0 and not transport.get_write_buffer_size():
            try:
                sent = os.write(fd, data)
            except OSError:  # full (EAGAIN), or broken: the transport's write decides
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        transport.write(data)

    def gone(self) -> bool:
        """Whether the socket is gone (nothing to wait for then)."""
        return self._closed.done()

    @property
    def until_gone(self) -> asyncio.Future[None]:
        """Done once the socket is gone: a wait on something else that has no one left to
        serve then waits on this too."""
        return self._closed

    async def drain(self) -> None:
        """Wait until the socket's buffer is under its high-water mark."""
        if not self.paused or self.gone():
            return
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._drained)

    def pause_writing(self) -> None:
        """The transport's buffer passed its high-water mark."""
        self.paused = True

    def resume_writing(self) -> None:
        """The transport's buffer fell under its low-water mark (or the socket is gone)."""
        self.paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def start_close(self, code: int, reason: str = "") -> None:
        """Begin the end, without waiting; each peer says how."""

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """End, and wait until the socket is gone."""
        self.start_close(code, reason)
        await asyncio.shield(self._closed)

    def abort(self) -> None:
        """Cut the socket now."""
        if not self._closed.done():
            self.transport.abort()

    async def wait_closed(self) -> None:
        """Wait until the socket is gone."""
        await asyncio.shield(self._closed)

    def _gone(self) -> None:
        """The socket is gone: wake whoever waits on it."""
        self.resume_writing()
        if not self._closed.done():
            self._closed.set_result(None)
