"""A client's WebSocket frames read into whole messages, sans I/O: bytes in, messages out.

Theory of operation
-------------------
A :class:`FrameReader` takes the bytes a server reads from one client (RFC 6455, after
the handshake) and hands each whole message to a ``deliver`` callable as soon as its last
frame is read; it never touches a socket, a loop or a clock. What it has to answer (a
pong, a close frame) waits in :attr:`FrameReader.protocol`'s ``data_to_send()`` for the
caller to write.

Two parsers share the stream, and only ever at a frame boundary:

* a lean one, for whole unfragmented data frames (final, text or binary, masked as a
  client must, no reserved bit, within the limit): nearly every frame a peer sends. It
  unmasks with websockets' C ``apply_mask`` and gathers a frame across reads up to
  :data:`MAX_HELD_FRAME` bytes;
* websockets' own :class:`~websockets.protocol.Protocol` for any other frame (control
  frames, fragments, reserved bits, an unmasked or oversized frame) and whatever follows
  it until the protocol is at a frame boundary again with no fragmented message or close
  under way. It owns masking, control frames, fragments, the close handshake and the
  limit on a whole message.

A frame that breaks the rules fails the connection: the reader reads nothing after it,
the protocol holds the close frame to send, and :attr:`FrameReader.failure` names the
close code:

* 1002 (protocol error): a reserved bit, an unknown opcode, an unmasked frame, a control
  frame over 125 bytes or fragmented, a continuation frame with no message under way, a
  data frame in the middle of a fragmented message, a close frame with a 1-byte payload or
  a code a peer may not send;
* 1009 (message too big): a frame or a fragmented message over ``max_size`` bytes, or a
  message in more than :data:`MAX_FRAGMENTS` frames;
* 1007 (invalid data): a text message, or a close frame's reason, that is not UTF-8.

A message read before a close frame or a failure counts; nothing after it is read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from websockets import CloseCode, State
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import SERVER, Event, Protocol

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets without its C extension
    from websockets.utils import apply_mask

__all__ = ["MAX_FRAGMENTS", "MAX_HELD_FRAME", "Deliver", "FrameReader", "frames_log", "text_frame"]

frames_log = logging.getLogger("token_relay.frames")
"""websockets' protocol logs each open and close at INFO; the relay logs its own."""
frames_log.setLevel(logging.WARNING)

MAX_HELD_FRAME = 64 * 1024
"""The largest frame the lean parser gathers across reads; a larger one is websockets'."""

MAX_FRAGMENTS = 65_536
"""The most frames one fragmented message may come in (1009 past it): far more than any
client sends (a message of 1 MiB in 16-byte frames), yet a peer sending empty continuation
frames cannot keep one message under way for ever. What the frames hold is gathered as one
buffer, so their count costs no memory of its own; their bytes are bounded by ``max_size``."""

Deliver = Callable[[str | bytes, bytes], bool]
"""Takes one whole message (``str`` for text) and its payload's bytes (whose size is what
the message weighs); returns whether the reader should stop before the next frame of the
read, leaving it unparsed in :attr:`FrameReader.partial` for :meth:`FrameReader.resume`."""


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


class FrameReader:
    """The frames of one client connection, read into messages."""

    __slots__ = (
        "_fragments",
        "_frames",
        "_slow_left",
        "_text",
        "failed",
        "max_size",
        "partial",
        "protocol",
    )

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        """The largest message, in bytes, a frame's or a fragmented message's (1009 past it)."""
        self.protocol = Protocol(SERVER, state=State.OPEN, max_size=max_size, logger=frames_log)
        """websockets' protocol: the frames the lean parser leaves, and what to send back."""
        self.partial = b""
        """Bytes not parsed yet: the start of a frame the lean parser is gathering (or a
        frame header), or the rest of a read that :meth:`receive` was told to stop in."""
        self.failed = False
        """Whether the reader failed the connection itself: a text message that is not UTF-8
        (1007), or one in too many frames (1009). Nothing more is read."""
        self._slow_left = 0
        """Bytes still to come of a frame websockets is reading."""
        self._fragments = bytearray()
        """The payload of a fragmented message under way, gathered."""
        self._frames = 0
        """The frames it came in so far, at most :data:`MAX_FRAGMENTS`."""
        self._text = False

    @property
    def failure(self) -> Close | None:
        """The close frame the connection was failed with because of what the peer sent
        (1002, 1007 or 1009, and its reason); None while no frame broke the rules."""
        protocol = self.protocol
        if self.failed or (
            protocol.parser_exc is not None and not isinstance(protocol.parser_exc, EOFError)
        ):
            return protocol.close_sent
        return None

    def receive(self, data: bytes, deliver: Deliver) -> bool:
        """Read ``data``, handing each whole message to ``deliver`` in order; True if
        ``deliver`` asked to stop (the rest of ``data`` waits in :attr:`partial`)."""
        left = self._slow_left
        if left:  # the rest of a frame websockets is reading
            self._slow_left = max(0, left - len(data))
            self._feed(data[:left], deliver, False)
            data = data[left:]
        if self.partial:
            data, self.partial = self.partial + data, b""
        if data:
            return self._parse(data, deliver)
        return False

    def resume(self, deliver: Deliver) -> bool:
        """Read what waits in :attr:`partial` (after :meth:`receive` stopped), as
        :meth:`receive` reads."""
        data, self.partial = self.partial, b""
        return self._parse(data, deliver)

    def _parse(self, data: bytes, deliver: Deliver) -> bool:
        """Read ``data`` frame by frame: a whole unfragmented data frame here, any other
        frame (all of it, however many reads it takes) by websockets; a partial header
        waits for the next read, and so does a partial frame of ours up to 64 KiB.

        The lean parser reads only at frame boundaries, so websockets' parser is always at
        one when it is handed a frame, and their messages keep the order of the frames.
        ``deliver``'s answer is heeded before the next frame of ours.
        """
        at, end, limit = 0, len(data), self.max_size
        fits = limit >= 125  # any frame of 125 bytes or fewer is within the limit
        lean = self._lean() and not self.failed
        small = lean and fits
        stop = False
        while end - at >= 2:
            first, second = data[at], data[at + 1]
            if small and first == 0x81 and 0x80 <= second < 0xFE:
                # Nearly every producer frame: final, text, masked, under 126 bytes (what
                # the lines below do for it, in fewer steps).
                start = at + 6
                end_of_frame = start + second - 0x80
                if end_of_frame > end:
                    break
                if stop:  # the rest waits for resume()
                    self.partial = data[at:]
                    return True
                payload = apply_mask(data[start:end_of_frame], data[at + 2 : start])
                at = end_of_frame
                try:
                    message = payload.decode()
                except UnicodeDecodeError as exc:
                    self._fail(exc)  # nothing more is read after invalid UTF-8
                    small = lean = False
                    continue
                stop = deliver(message, payload)
                continue
            if small and first == 0x82 and 0x80 <= second < 0xFE:
                # A small binary frame: final, masked, under 126 bytes.
                head, end_of_frame = 6, at + 6 + (second & 0x7F)
                if end_of_frame > end:
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
                end_of_frame = at + head + length
                ours = (
                    # FIN, no reserved bits, text or binary, masked (as a client must), not
                    # too big, and no fragmented message or close under way.
                    first & 0xF0 == 0x80
                    and 0 < first & 0x0F < 3
                    and head >= 6
                    and length <= limit
                    and (end_of_frame <= end or head + length <= MAX_HELD_FRAME)
                    and lean
                )
                if not ours:
                    # websockets reads this frame: what of it is here now, the rest as it
                    # comes.
                    here = min(end_of_frame, end)
                    self._slow_left = end_of_frame - here
                    stop = self._feed(data[at:here], deliver, stop)
                    lean = self._lean() and not self.failed
                    small = lean and fits
                    at = here
                    continue
                if end_of_frame > end:
                    break
            if stop:  # the rest waits for resume()
                self.partial = data[at:]
                return True
            payload = apply_mask(data[at + head : end_of_frame], data[at + head - 4 : at + head])
            at = end_of_frame
            if first == 0x81:
                try:
                    message = payload.decode()
                except UnicodeDecodeError as exc:
                    self._fail(exc)  # nothing more is read after invalid UTF-8
                    small = lean = False
                    continue
                stop = deliver(message, payload)
            else:
                stop = deliver(payload, payload)
        self.partial = data[at:]
        return False

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

    def _feed(self, data: bytes, deliver: Deliver, stop: bool) -> bool:
        """Bytes of frames websockets reads; their messages are delivered at once, in
        order. Returns ``deliver``'s last answer (``stop`` if it was not called)."""
        if not data:
            return stop
        protocol = self.protocol
        protocol.receive_data(data)
        events = protocol.events_received()
        if events:
            return self._take(events, deliver, stop)
        return stop

    def _take(self, events: list[Event], deliver: Deliver, stop: bool) -> bool:
        for frame in events:
            if self.failed:
                break
            if not isinstance(frame, Frame):
                continue
            opcode = frame.opcode
            if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
                data = bytes(frame.data)
                if not frame.fin:
                    self._fragments, self._text = bytearray(data), opcode is Opcode.TEXT
                    self._frames = 1
                    continue
                stop = self._message(data, opcode is Opcode.TEXT, deliver, stop)
            elif opcode is Opcode.CONT:
                self._frames += 1
                if self._frames > MAX_FRAGMENTS:
                    self._fragments = bytearray()
                    reason = f"message in more than {MAX_FRAGMENTS} frames"
                    self._fail_with(CloseCode.MESSAGE_TOO_BIG, reason)
                    break
                self._fragments += frame.data
                if frame.fin:
                    data, self._fragments = bytes(self._fragments), bytearray()
                    stop = self._message(data, self._text, deliver, stop)
        return stop

    def _message(self, payload: bytes, text: bool, deliver: Deliver, stop: bool) -> bool:
        if not text:
            return deliver(payload, payload)
        try:
            message = payload.decode()
        except UnicodeDecodeError as exc:
            self._fail(exc)
            return stop
        return deliver(message, payload)

    def _fail(self, exc: UnicodeDecodeError) -> None:
        self._fail_with(CloseCode.INVALID_DATA, f"{exc.reason} at {exc.start}")

    def _fail_with(self, code: CloseCode, reason: str) -> None:
        self.protocol.fail(code, reason)
        self.failed = True
