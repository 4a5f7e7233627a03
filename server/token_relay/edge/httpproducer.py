"""A producer made of one HTTP request: ``POST /produce[?channel=C][&producer=NAME]``.

The body is one of:

* ``application/json``: one event, or a batch array, applied as one WebSocket frame
  would be, with the same rules and error codes;
* ``application/x-ndjson``: one event per line, each applied as soon as its line has
  arrived, so one chunked request can stream a whole reply.

The relay answers once the body has ended, with every frame a WebSocket producer would
have been sent, sorted: ``{"acks": [...], "errors": [...], "cancels": [...]}``.

An :class:`HttpProducer` stands where a producer's
:class:`~token_relay.edge.websocket.WebSocket` would, for the producer endpoint and the
writer: its frames are collected for the response rather than written to the socket.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Awaitable, Callable
from typing import Any

from websockets import CloseCode

from ..core.grants import Grant
from .flow import PeerBase

__all__ = ["NDJSON", "HttpProducer"]

NDJSON = "application/x-ndjson"
MAX_LINES = 64
"""Lines of an NDJSON body waiting to be applied before its socket stops being read."""


class HttpProducer(PeerBase):
    """The events of one request's body in, the frames for its response out."""

    def __init__(
        self,
        transport: asyncio.Transport,
        *,
        path: str,
        client: str,
        grant: Grant,
        ndjson: bool,
        named: bool,
        max_line: int,
    ) -> None:
        super().__init__(transport, path=path, client=client, grant=grant)
        self.ndjson = ndjson
        self.named = named
        """A named producer's session outlives the request (it is parked, not ended)."""
        self.max_line = max_line
        self.acks: list[Any] = []
        self.errors: list[Any] = []
        self.cancels: list[Any] = []
        self.too_long = False
        self._pending = b""
        self._items: collections.deque[str | bytes] = collections.deque()
        self._ended = False
        self._displaced = False
        self.taken = 0
        """Lines (or bodies) handed on to be applied; after a displacement, none more."""
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    # ------------------------------------------------------------------ the body in

    def feed(self, chunk: bytes) -> None:
        """Bytes of the body."""
        if not self.ndjson:
            self._pending += chunk
            return
        data = self._pending + chunk
        *lines, self._pending = data.split(b"\n")
        self._items.extend(line for line in lines if line.strip())
        if len(self._pending) > self.max_line:
            self.too_long = True
            self._pending = b""
        if len(self._items) >= MAX_LINES and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def end(self) -> None:
        """The body is complete."""
        if self._pending.strip():
            self._items.append(self._pending)
        self._pending = b""
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> HttpProducer:
        return self

    async def dispatch(self, handle: Callable[[str | bytes], Awaitable[None] | None]) -> None:
        """Hand every line (or the whole body) to ``handle``, in order, waiting for what it
        returns before the next."""
        async for item in self:
            later = handle(item)
            if later is not None:
                await later

    async def __anext__(self) -> str | bytes:
        """The next line (or the whole JSON body); the iteration ends with the body."""
        while not self._items or self._displaced:
            if self._ended or self._displaced:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        self.taken += 1
        if self._paused and len(self._items) < MAX_LINES // 2:
            self._paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()
        return item.decode() if isinstance(item, bytes) else item

    # ------------------------------------------------------------------ frames out

    def collect(self, data: bytes) -> None:
        """A frame the relay sends this producer, kept for the response."""
        frame = json.loads(data)
        kind = frame.get("type")
        if kind == "ack":
            self.acks.append(frame)
        elif kind == "acks":
            self.acks.extend(frame.get("acks", []))
        elif kind == "error":
            self.errors.append(frame)
        elif kind == "cancel":
            self.cancels.append(frame)

    async def send(self, data: str | bytes) -> None:
        """Collect one frame."""
        self.collect(data.encode() if isinstance(data, str) else data)

    async def drain(self) -> None:
        """Nothing to wait for: frames are collected, not written."""

    paused = False
    """Never: frames are collected, not written."""

    # ------------------------------------------------------------------ state

    @property
    def open(self) -> bool:
        """Whether frames may still be collected."""
        return not self._displaced

    @property
    def close_received(self) -> bool:
        """An unnamed request ends its producer with its body; a named one parks it."""
        return not self.named

    @property
    def displaced(self) -> bool:
        """The session went elsewhere before the body ended: its later lines were not
        applied."""
        return self._displaced

    @property
    def close_code(self) -> int | None:
        """What a WebSocket would have logged."""
        return CloseCode.POLICY_VIOLATION if self._displaced else CloseCode.NORMAL_CLOSURE

    def start_close(self, code: int, reason: str = "") -> None:
        """The session went elsewhere (another request of the same producer, or a hand-off):
        stop applying this body's events."""
        self._displaced = True
        self._wake()

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """As :meth:`start_close`."""
        self.start_close(code, reason)

    def abort(self) -> None:
        """Cut the socket."""
        self.transport.abort()
