"""One WebSocket connection after its upgrade: websockets' sans-I/O protocol over a transport.

The HTTP edge (:mod:`token_relay.edge.server`) owns the socket. Once a handshake
is accepted it hands every byte to a :class:`WebSocket`, which parses frames
with a :class:`~token_relay.edge.frames.FrameReader` (sans I/O: a lean parser for
whole data frames, websockets' own :class:`~websockets.protocol.Protocol` for the rest),
and hands whole messages to the endpoint that serves it, or queues them.

Limits and policies
-------------------
* Incoming messages wait in a queue of at most :data:`MAX_QUEUE` messages and
  ``--max-frame-bytes`` bytes; past either, the socket is not read until the
  endpoint catches up (TCP backpressure on the peer).
* An endpoint that keeps up is handed each message as it is read, at most
  :data:`FAIR_SHARE` in a row; the rest of that read waits unparsed, with the socket
  not read, until the loop has run other work once. Nothing is queued for it.
* A text message that is not UTF-8 closes the connection with 1007, a frame or message
  over ``--max-frame-bytes`` with 1009, any other broken rule of RFC 6455 with 1002 (see
  :mod:`token_relay.edge.frames`).
* Frames written to one socket within one pass of the event loop go out in one write,
  at the end of the pass, after the first (see :class:`Cork`): a burst of acks or
  messages costs one system call, and a lone frame none of waiting.
* While the transport holds no unsent bytes, a write goes straight to the socket (see
  :meth:`~token_relay.edge.flow.SocketPeer.write_now`).
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
from collections.abc import Awaitable, Callable, Coroutine

from websockets import CloseCode, State

from ..core.grants import Grant
from .broadcast import Broadcast
from .flow import SocketPeer
from .frames import FrameReader, text_frame

__all__ = ["MAX_QUEUE", "Cork", "Handler", "WebSocket", "text_frame"]

log = logging.getLogger("token_relay")

MAX_QUEUE = 16
"""Whole incoming messages queued per connection before its socket stops being read."""

FAIR_SHARE = 128
"""Messages one connection is handed in a row before the event loop runs other work."""

CLOSE_TIMEOUT = 5.0
"""Seconds a peer has to answer a close frame before its socket is cut."""


Handler = Callable[[str | bytes], Awaitable[None] | None]
"""Takes one message; returns what to wait for before the next, if anything."""


async def _raise(exc: Exception) -> None:
    raise exc


def _nothing() -> None:
    """Nothing to settle (:meth:`WebSocket.dispatch` with no ``settle``)."""


class Cork:
    """Write coalescing for the WebSockets of one event loop.

    A socket's first frame in a pass of the loop is written at once (a lone frame
    never waits); the frames that follow it in the same pass are held and written
    together when the pass ends, in one system call. Held bytes are at most one pass's
    work, and a socket's frames keep their order: every write of a :class:`WebSocket`
    goes through here.
    """

    __slots__ = ("_held", "_loop", "_pass", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pass = 0
        """Which pass of the loop this is, as far as writes tell (one more at each flush)."""
        self._held: list[WebSocket] = []
        self._scheduled = False

    def write(self, peer: WebSocket, data: bytes) -> None:
        """Write ``data`` to the peer's socket, now or at the end of this pass."""
        held = peer.held
        if held is not None:
            held.append(data)
            return
        if peer.written_in == self._pass:
            peer.held = [data]
            self._held.append(peer)
            return
        peer.written_in = self._pass
        peer.write_now(data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """The pass ended: write what each socket holds."""
        self._scheduled = False
        self._pass += 1  # every socket written in this pass may be written at once again
        held, self._held = self._held, []
        for peer in held:
            peer.uncork()


class WebSocket(SocketPeer):
    """A WebSocket peer: messages in as an async iterator, frames out to its transport."""

    __slots__ = (
        "_handle",
        "_handled",
        "_later",
        "_messages",
        "_paused_reading",
        "_queued_bytes",
        "_resting",
        "_settle",
        "_unbroken",
        "_waiter",
        "cork",
        "heard",
        "held",
        "max_size",
        "max_unsent",
        "protocol",
        "reader",
        "written_in",
    )

    def __init__(
        self,
        transport: asyncio.Transport,
        *,
        path: str,
        client: str,
        grant: Grant,
        max_size: int,
        max_unsent: int,
        cork: Cork | None = None,
    ) -> None:
        super().__init__(transport, path=path, client=client, grant=grant)
        self.cork = cork or Cork(asyncio.get_running_loop())
        self.held: list[bytes] | None = None
        """Frames written in this pass of the loop after its first, not yet on the socket."""
        self.written_in = -1
        """The pass of the loop (see :class:`Cork`) that last wrote to the socket at once."""
        self.reader = FrameReader(max_size)
        self.protocol = self.reader.protocol
        """websockets' protocol: its state, and the frames to send (pongs, closes)."""
        self.max_size = max_size
        self.max_unsent = max_unsent
        self.heard = True
        """Whether the peer sent anything since the last keepalive ping."""
        self._messages: collections.deque[tuple[str | bytes, int]] = collections.deque()
        self._queued_bytes = 0
        self._waiter: asyncio.Future[None] | None = None
        self._paused_reading = False
        self._unbroken = 0
        self._handle: Handler | None = None
        """While :meth:`dispatch` keeps up: each message is handed to it as it is read."""
        self._later: Awaitable[None] | None = None
        """What a message handled as it was read left to wait for, before the next one."""
        self._handled = 0
        """Messages handled in a row within this pass of the loop (at most
        :data:`FAIR_SHARE`)."""
        self._resting = False
        """A fair share was handled: the rest of the read waits in the reader, unparsed,
        for the next pass of the loop (see :meth:`_go_on`)."""
        self._settle: Callable[[], None] | None = None
        """What :meth:`dispatch`'s handler left undone is done by this before anything
        else runs: called after each read's messages, and before each wait."""

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
        if self._resting:  # its socket is not read meanwhile; these came before it paused
            self.reader.partial += data
            return
        self._handled = 0
        if self.reader.receive(data, self._put):
            self._rest()
        self._parsed()

    def _parsed(self) -> None:
        """After a read's frames (or a fair share of them): settle what the handler left
        undone, wake the reader if no more will come, and write what the protocol
        answered."""
        settle = self._settle
        if settle is not None:
            settle()
        if self.protocol.state is not State.OPEN:
            self._wake()  # failed (1007, 1009, a protocol error) or closing: no more messages
        self._flush()
        transport = self.transport
        if self.max_unsent and transport.get_write_buffer_size() > self.max_unsent:
            log.warning("cutting %s: over %d bytes unsent", self.client, self.max_unsent)
            transport.abort()

    def receive_eof(self) -> None:
        """The peer half-closed its side."""
        self._unrest()
        self.protocol.receive_eof()
        self._flush()

    def lost(self) -> None:
        """The socket is gone."""
        self._unrest()
        if self.protocol.state is not State.CLOSED:
            self.protocol.receive_eof()  # 1006, unless the close handshake ended it
            self.protocol.state = State.CLOSED
        self._wake()
        self._gone()

    def _rest(self) -> None:
        """A fair share of this read's messages was handed over: leave the rest of it
        unparsed, and the socket unread, until the loop has run other work once."""
        self._resting = True
        if not self._paused_reading:
            self._paused_reading = True
            self.transport.pause_reading()
        asyncio.get_running_loop().call_soon(self._go_on)

    def _go_on(self) -> None:
        """The next pass of the loop: hand over the next fair share of the read."""
        if not self._resting:
            return  # the socket ended meanwhile: the rest was queued (see :meth:`_unrest`)
        self._resting, self._handled = False, 0
        if self.reader.resume(self._put):
            self._rest()
        if not self._resting and self._paused_reading and not self._messages:
            self._paused_reading = False
            if not self.transport.is_closing():
                self.transport.resume_reading()
        self._parsed()

    def _unrest(self) -> None:
        """The socket ends while a read waits unparsed: queue its messages now, since a
        message read before the end counts (the reader takes them before it stops)."""
        if self._resting:
            self._resting = False
            handle, self._handle = self._handle, None
            self.reader.resume(self._put)
            self._handle = handle
            if self.protocol.state is not State.OPEN:
                self._wake()  # a close frame was read: the reader stops

    def _put(self, message: str | bytes, payload: bytes) -> bool:
        """One whole message from the reader (see :data:`~token_relay.edge.frames.Deliver`):
        handled now, or queued. True once a fair share of the read was handled: the reader
        stops before its next frame, and the rest waits for the next pass of the loop.

        A message before the peer's close frame counts, even though the protocol has read
        the close already; nothing is read after it, or after a failure."""
        handle = self._handle
        if handle is not None and not self._messages and self._handled < FAIR_SHARE:
            self._handled += 1
            try:
                later = handle(message)
            except Exception as exc:  # a bug: raised in the serving task, as it would be
                later = _raise(exc)
            if later is not None:
                self._handle, self._later = None, later
                self._wake()
            return self._handled >= FAIR_SHARE and self._handle is not None and not self._messages
        size = len(payload)
        self._messages.append((message, size))
        self._queued_bytes += size
        if not self._paused_reading and (
            len(self._messages) >= MAX_QUEUE or self._queued_bytes >= self.max_size
        ):
            self._paused_reading = True
            self.transport.pause_reading()
        if self._waiter is not None:
            self._wake()
        return False

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> WebSocket:
        return self

    async def dispatch(self, handle: Handler, settle: Callable[[], None] | None = None) -> None:
        """Hand every message to ``handle``, in order, until the connection ends.

        While ``handle`` keeps up, each message is handled as it is read, inside the
        socket's read: no queue and no task switch. When it returns something to wait
        for, the messages after it queue (at most :data:`MAX_QUEUE`, then the socket is
        not read) until that is done. A read hands over at most :data:`FAIR_SHARE`
        messages this way; the rest queue, and the loop runs other work between them.

        ``settle``, if given, is called after each read's messages are handed over, and
        before every wait here: whatever ``handle`` put off is done before the loop runs
        anything else.
        """
        protocol, messages = self.protocol, self._messages
        self._settle = settle
        done = settle or _nothing
        try:
            while True:
                while messages:
                    if self._yields():
                        done()
                        await asyncio.sleep(0)
                        continue
                    later = handle(self._next())
                    if later is not None:
                        done()
                        await later
                done()
                self._unbroken = 0
                if protocol.state is not State.OPEN or protocol.close_rcvd is not None:
                    return
                self._handle = handle
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter, self._handle = None, None
                later, self._later = self._later, None
                if later is not None:
                    done()
                    await later
        finally:
            self._settle = None
            later, self._handle, self._later = self._later, None, None
            if isinstance(later, Coroutine):
                later.close()  # the connection ended first: nothing is left to wait for

    async def __anext__(self) -> str | bytes:
        """The next whole message; the iteration ends when the connection closes.

        A peer whose messages keep coming gets them without a wait, but the loop is let
        run every :data:`FAIR_SHARE` of them: a flood on one connection can delay others
        by that many frames' work, never by a whole socket read's worth.
        """
        messages = self._messages
        if self._yields() and messages:
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
        return self._next()

    def _yields(self) -> bool:
        """Count one more message taken in a row: every :data:`FAIR_SHARE`-th, True (the
        loop runs other work before it), and the count starts again."""
        self._unbroken += 1
        if self._unbroken < FAIR_SHARE:
            return False
        self._unbroken = 0
        return True

    def _next(self) -> str | bytes:
        """Take the first queued message; the socket is read again once none is left."""
        messages = self._messages
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
            self.cork.write(self, frame)

    def take(self, broadcast: Broadcast) -> None:
        """Write a frame sent to many peers: its bytes are built once, by the first
        WebSocket, and written as :meth:`write_frame` writes."""
        frame = broadcast.frame
        if frame is None:
            frame = broadcast.websocket_frame()
        if self.protocol.state is State.OPEN and not self.transport.is_closing():
            self.cork.write(self, frame)

    def uncork(self) -> None:
        """Write the frames held since this pass's first (see :class:`Cork`)."""
        held, self.held = self.held, None
        if held and not self.transport.is_closing():
            self.write_now(b"".join(held))

    async def send(self, data: str | bytes) -> None:
        """Send one text frame, then wait until the socket can take more."""
        if self.protocol.state is not State.OPEN or self.transport.is_closing():
            return
        payload = data.encode() if isinstance(data, str) else data
        self.cork.write(self, text_frame(payload))
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
                self.cork.write(self, data)
            else:
                # websockets' signal to end the TCP connection (a server closes first).
                self.uncork()
                transport.close()
