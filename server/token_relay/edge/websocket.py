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
* An endpoint that keeps up is handed each message as it is read, at most
  :data:`FAIR_SHARE` in a row; the rest of that read waits unparsed, with the socket
  not read, until the loop has run other work once. Nothing is queued for it.
* A text message that is not UTF-8 closes the connection with 1007.
* Whole unfragmented data frames (nearly every frame a peer sends) are read by a lean
  parser of their own, unmasked by websockets' C ``apply_mask``; any other frame (control
  frames, fragments, reserved bits, an unmasked or oversized frame) and whatever follows
  it until the protocol is at a frame boundary again go to websockets' ``Protocol``.
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
from websockets.frames import Frame, Opcode
from websockets.protocol import SERVER, Event, Protocol

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets without its C extension
    from websockets.utils import apply_mask

from ..core.grants import Grant
from .flow import SocketPeer

__all__ = ["MAX_QUEUE", "Cork", "Handler", "WebSocket", "text_frame"]

log = logging.getLogger("token_relay")
frames_log = logging.getLogger("token_relay.frames")
"""websockets' protocol logs each open and close at INFO; the relay logs its own."""
frames_log.setLevel(logging.WARNING)

MAX_QUEUE = 16
"""Whole incoming messages queued per connection before its socket stops being read."""

FAIR_SHARE = 128
"""Messages one connection is handed in a row before the event loop runs other work."""

CLOSE_TIMEOUT = 5.0
"""Seconds a peer has to answer a close frame before its socket is cut."""

MAX_HELD_FRAME = 64 * 1024
"""The largest frame the lean parser gathers across reads; a larger one is websockets'."""


Handler = Callable[[str | bytes], Awaitable[None] | None]
"""Takes one message; returns what to wait for before the next, if anything."""


def text_frame(payload: bytes) -> bytes:
    """A final, unmasked text frame carrying ``payload``, as a server sends it (RFC 6455,
    5.2): the bytes websockets' ``Frame(Opcode.TEXT, payload).serialize(mask=False)``
    gives, built in a fifth of the time."""
    size = len(payload)
    if size < 126:
        return bytes((0x81, size)) + payload
    if size < 1 << 16:
        return b"\x81\x7e" + size.to_bytes(2, "big") + payload
    return b"\x81\x7f" + size.to_bytes(8, "big") + payload


async def _raise(exc: Exception) -> None:
    raise exc


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
        "_failed",
        "_fragments",
        "_handle",
        "_handled",
        "_later",
        "_messages",
        "_partial",
        "_paused_reading",
        "_queued_bytes",
        "_resting",
        "_slow_left",
        "_text",
        "_unbroken",
        "_waiter",
        "cork",
        "heard",
        "held",
        "max_size",
        "max_unsent",
        "protocol",
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
        self._partial = b""
        """The start of a frame the lean parser is gathering (or a frame header)."""
        self._slow_left = 0
        """Bytes still to come of a frame websockets is reading."""
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
        self._handle: Handler | None = None
        """While :meth:`dispatch` keeps up: each message is handed to it as it is read."""
        self._later: Awaitable[None] | None = None
        """What a message handled as it was read left to wait for, before the next one."""
        self._handled = 0
        """Messages handled in a row within this pass of the loop (at most
        :data:`FAIR_SHARE`)."""
        self._resting = False
        """A fair share was handled: the rest of the read waits in ``_partial``, unparsed,
        for the next pass of the loop (see :meth:`_go_on`)."""

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
            self._partial += data
            return
        self._handled = 0
        left = self._slow_left
        if left:  # the rest of a frame websockets is reading
            self._slow_left = max(0, left - len(data))
            self._feed(data[:left])
            data = data[left:]
        if self._partial:
            data, self._partial = self._partial + data, b""
        if data:
            self._parse(data)
        self._parsed()

    def _parsed(self) -> None:
        """After a read's frames (or a fair share of them): wake the reader if no more
        will come, and write what the protocol answered."""
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

    def _parse(self, data: bytes) -> None:
        """Read ``data`` frame by frame: a whole unfragmented data frame here, any other
        frame (all of it, however many reads it takes) by websockets; a partial header
        waits for the next read, and so does a partial frame of ours up to 64 KiB.

        The lean parser reads only at frame boundaries, so websockets' parser is always at
        one when it is handed a frame, and their messages keep the order of the frames.
        """
        at, end, limit = 0, len(data), self.max_size
        fits = limit >= 125  # any frame of 125 bytes or fewer is within the limit
        lean = self._lean() and not self._failed
        small = lean and fits
        while end - at >= 2:
            first, second = data[at], data[at + 1]
            if small and (first == 0x81 or first == 0x82) and 0x80 <= second < 0xFE:
                # Nearly every producer frame: final, text or binary, masked, under 126 bytes.
                head, stop = 6, at + 6 + (second & 0x7F)
                if stop > end:
                    break
            else:
                length, head = second & 0x7F, 6 if second & 0x80 else 2
                if length == 126:
                    if end - at < 4:
                        break
                    length, head = int.from_bytes(data[at + 2 : at + 4]), head + 2
                elif length == 127:
                    if end - at < 10:
                        break
                    length, head = int.from_bytes(data[at + 2 : at + 10]), head + 8
                stop = at + head + length
                ours = (
                    # FIN, no reserved bits, text or binary, masked (as a client must), not
                    # too big, and no fragmented message or close under way.
                    first & 0xF0 == 0x80
                    and 0 < first & 0x0F < 3
                    and head >= 6
                    and length <= limit
                    and (stop <= end or head + length <= MAX_HELD_FRAME)
                    and lean
                )
                if not ours:
                    # websockets reads this frame: what of it is here now, the rest as it
                    # comes.
                    here = min(stop, end)
                    self._slow_left = stop - here
                    self._feed(data[at:here])
                    lean = self._lean() and not self._failed
                    small = lean and fits
                    at = here
                    continue
                if stop > end:
                    break
            if self._handled >= FAIR_SHARE and self._handle is not None and not self._messages:
                self._rest()
                break
            self._put(
                apply_mask(data[at + head : stop], data[at + head - 4 : at + head]), first == 0x81
            )
            at = stop
            if self._failed:  # nothing more is read after invalid UTF-8
                small = lean = False
        self._partial = data[at:]

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
        data, self._partial = self._partial, b""
        self._parse(data)
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
            data, self._partial, handle, self._handle = self._partial, b"", self._handle, None
            self._parse(data)
            self._handle = handle

    def _lean(self) -> bool:
        """Whether the lean parser may read the next frame, as far as websockets' protocol
        says: no fragmented message or close under way. Only websockets' parser (fed by
        :meth:`_feed`) changes that within a read, so it is asked once, and after each feed."""
        protocol = self.protocol
        return (
            protocol.current_size is None
            and protocol.state is State.OPEN
            and protocol.close_rcvd is None
        )

    def _feed(self, data: bytes) -> None:
        """Bytes of frames websockets reads; their messages are taken at once, in order."""
        if not data:
            return
        protocol = self.protocol
        protocol.receive_data(data)
        events = protocol.events_received()
        if events:
            self._take(events)

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
            return
        self._messages.append((message, len(data)))
        self._queued_bytes += len(data)
        if not self._paused_reading and (
            len(self._messages) >= MAX_QUEUE or self._queued_bytes >= self.max_size
        ):
            self._paused_reading = True
            self.transport.pause_reading()
        if self._waiter is not None:
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> WebSocket:
        return self

    async def dispatch(self, handle: Handler) -> None:
        """Hand every message to ``handle``, in order, until the connection ends.

        While ``handle`` keeps up, each message is handled as it is read, inside the
        socket's read: no queue and no task switch. When it returns something to wait
        for, the messages after it queue (at most :data:`MAX_QUEUE`, then the socket is
        not read) until that is done. A read hands over at most :data:`FAIR_SHARE`
        messages this way; the rest queue, and the loop runs other work between them.
        """
        protocol, messages = self.protocol, self._messages
        try:
            while True:
                while messages:
                    if self._yields():
                        await asyncio.sleep(0)
                        continue
                    later = handle(self._next())
                    if later is not None:
                        await later
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
                    await later
        finally:
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
