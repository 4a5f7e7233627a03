"""One WebSocket connection after its upgrade: websockets' sans-I/O protocol over a transport.

The HTTP edge (:mod:`token_relay.edge.server`) owns the socket. Once a handshake
is accepted it hands every byte to a :class:`WebSocket`, which parses frames
with websockets' own :class:`~websockets.protocol.Protocol` (masking, control
frames, fragments, the close handshake, ``--max-frame-bytes`` and 1009 are all
websockets'), and queues whole messages for the endpoint that serves it.

Limits and policies
-------------------
* Incoming messages wait in a queue of at most :data:`MAX_QUEUE` messages and
  ``--max-frame-bytes`` bytes; past either, the socket is not read until the
  endpoint catches up (TCP backpressure on the peer).
* A text message that is not UTF-8 closes the connection with 1007.
* Every ``--ping-interval`` seconds the server pings each peer; one that sent
  nothing at all since the previous ping is cut (1011), so a half-open
  connection ends within two intervals.
* A peer whose unsent bytes pass ``--max-subscriber-buffer-bytes`` while it
  keeps sending (a ping flood: every ping is answered) is cut at once.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from websockets import CloseCode, State
from websockets.frames import Frame, Opcode
from websockets.protocol import SERVER, Event, Protocol

from ..core.grants import Grant
from .flow import SocketPeer

__all__ = ["MAX_QUEUE", "WebSocket"]

log = logging.getLogger("token_relay")
frames_log = logging.getLogger("token_relay.frames")
"""websockets' protocol logs each open and close at INFO; the relay logs its own."""
frames_log.setLevel(logging.WARNING)

MAX_QUEUE = 16
"""Whole incoming messages queued per connection before its socket stops being read."""

FAIR_SHARE = 32
"""Messages one connection is handed in a row before the event loop runs other work."""

CLOSE_TIMEOUT = 5.0
"""Seconds a peer has to answer a close frame before its socket is cut."""


class WebSocket(SocketPeer):
    """A WebSocket peer: messages in as an async iterator, frames out to its transport."""

    def __init__(
        self,
        transport: asyncio.Transport,
        *,
        path: str,
        client: str,
        grant: Grant,
        max_size: int,
        max_unsent: int,
    ) -> None:
        super().__init__(transport, path=path, client=client, grant=grant)
        self.protocol = Protocol(SERVER, state=State.OPEN, max_size=max_size, logger=frames_log)
        self.max_size = max_size
        self.max_unsent = max_unsent
        self.heard = True
        """Whether the peer sent anything since the last keepalive ping."""
        self._messages: collections.deque[tuple[str | bytes, int]] = collections.deque()
        self._queued_bytes = 0
        self._fragments: list[bytes] = []
        self._text = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused_reading = False
        self._failed = False
        self._unbroken = 0

    # ------------------------------------------------------------------ state

    @property
    def open(self) -> bool:
        """Whether frames may still be sent."""
        return self.protocol.state is State.OPEN

    @property
    def close_code(self) -> int | None:
        """The peer's close code, 1006 if the socket ended without one, None while open."""
        received = self.protocol.close_rcvd
        if received is not None:
            return received.code
        return CloseCode.ABNORMAL_CLOSURE if self.protocol.state is State.CLOSED else None

    @property
    def close_received(self) -> bool:
        """Whether the peer sent a close frame (a clean end) rather than vanishing."""
        return self.protocol.close_rcvd is not None

    # ------------------------------------------------------------------ incoming

    def receive(self, data: bytes) -> None:
        """Bytes from the socket."""
        self.heard = True
        protocol = self.protocol
        protocol.receive_data(data)
        events = protocol.events_received()
        if events:
            self._take(events)
        self._flush()
        transport = self.transport
        if self.max_unsent and transport.get_write_buffer_size() > self.max_unsent:
            log.warning("cutting %s: over %d bytes unsent", self.client, self.max_unsent)
            transport.abort()

    def receive_eof(self) -> None:
        """The peer half-closed its side."""
        self.protocol.receive_eof()
        self._flush()

    def lost(self) -> None:
        """The socket is gone."""
        if self.protocol.state is not State.CLOSED:
            self.protocol.receive_eof()  # 1006, unless the close handshake ended it
            self.protocol.state = State.CLOSED
        self._wake()
        self._gone()

    def _take(self, events: list[Event]) -> None:
        for frame in events:
            if self._failed or not isinstance(frame, Frame):
                continue
            opcode, data = frame.opcode, frame.data
            if not isinstance(data, bytes):
                data = bytes(data)
            if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
                if not frame.fin:
                    self._fragments, self._text = [data], opcode is Opcode.TEXT
                    continue
                self._put(data, opcode is Opcode.TEXT)
            elif opcode is Opcode.CONT:
                self._fragments.append(data)
                if frame.fin:
                    data, self._fragments = b"".join(self._fragments), []
                    self._put(data, self._text)
            elif opcode is Opcode.CLOSE:
                self._wake()

    def _put(self, data: bytes, text: bool) -> None:
        # A message before the peer's close frame counts, even though the protocol has
        # read the close already; nothing is parsed after it, or after a failure.
        message: str | bytes = data
        if text:
            try:
                message = data.decode()
            except UnicodeDecodeError as exc:
                self.protocol.fail(CloseCode.INVALID_DATA, f"{exc.reason} at {exc.start}")
                self._failed = True
                return
        self._messages.append((message, len(data)))
        self._queued_bytes += len(data)
        if not self._paused_reading and (
            len(self._messages) >= MAX_QUEUE or self._queued_bytes >= self.max_size
        ):
            self._paused_reading = True
            self.transport.pause_reading()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> WebSocket:
        return self

    async def __anext__(self) -> str | bytes:
        """The next whole message; the iteration ends when the connection closes.

        A peer whose messages keep coming gets them without a wait, but the loop is let
        run every :data:`FAIR_SHARE` of them: a flood on one connection can delay others
        by that many frames' work, never by a whole socket read's worth.
        """
        messages = self._messages
        self._unbroken += 1
        if self._unbroken >= FAIR_SHARE and messages:
            self._unbroken = 0
            await asyncio.sleep(0)
        while not messages:
            self._unbroken = 0
            if self.protocol.state is not State.OPEN or self.protocol.close_rcvd is not None:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        message, size = messages.popleft()
        self._queued_bytes -= size
        if self._paused_reading and not messages:
            self._paused_reading = False
            if not self.transport.is_closing():
                self.transport.resume_reading()
        return message

    # ------------------------------------------------------------------ outgoing

    def write_frame(self, frame: bytes) -> None:
        """Write one serialized frame, if the connection is open (and its socket not gone:
        asyncio warns of every write to a socket that failed)."""
        if self.protocol.state is State.OPEN and not self.transport.is_closing():
            self.transport.write(frame)

    async def send(self, data: str | bytes) -> None:
        """Send one text frame, then wait until the socket can take more."""
        if self.protocol.state is not State.OPEN or self.transport.is_closing():
            return
        self.transport.write(
            Frame(Opcode.TEXT, data.encode() if isinstance(data, str) else data).serialize(
                mask=False
            )
        )
        await self.drain()

    def ping(self) -> None:
        """A keepalive ping (answered by any data at all)."""
        if self.protocol.state is State.OPEN:
            self.protocol.send_ping(b"")
            self._flush()

    def gone(self) -> bool:
        """Whether the socket is gone."""
        return self.protocol.state is State.CLOSED

    def start_close(self, code: int, reason: str = "") -> None:
        """Send a close frame without waiting; the socket is cut if unanswered in time."""
        if self.protocol.state is State.OPEN:
            self.protocol.send_close(code, reason)
            self._flush()
            loop = asyncio.get_running_loop()
            loop.call_later(CLOSE_TIMEOUT, self.abort)
        self._wake()

    def _flush(self) -> None:
        transport = self.transport
        for data in self.protocol.data_to_send():
            if transport.is_closing():
                return
            if data:
                transport.write(data)
            else:
                # websockets' signal to end the TCP connection (a server closes first).
                transport.close()
