"""A producer made of one HTTP request: ``POST /produce[?channel=C][&producer=NAME]``.

The body is one of:

* ``application/json``: one event, or a batch array, applied as one WebSocket frame
  would be, with the same rules and error codes;
* ``application/x-ndjson``: one event per line, each applied as soon as its line has
  arrived, so one chunked request can stream a whole reply.

The relay answers once the body has ended, with every frame a WebSocket producer would
have been sent, sorted: ``{"acks": [...], "errors": [...], "cancels": [...]}``.

The answer is bounded, as the body is: once the frames it keeps reach
:data:`MAX_ANSWER_BYTES`, or its errors :data:`MAX_ANSWER_ERRORS`, nothing more of the body
is applied, and the request ends as one over ``--max-body-bytes`` does (``body_too_large``,
413). Nothing it earned is dropped: the acks say exactly what was applied whole, and the
producer sends the rest again.

An :class:`HttpProducer` stands where a producer's
:class:`~token_relay.edge.websocket.WebSocket` would, for the producer endpoint and the
writer: its frames are collected for the response rather than written to the socket.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from websockets import CloseCode

from ..core.errors import ErrorCode, FrameRejected
from ..core.grants import Grant
from ..core.protocol import AbortReason
from .broadcast import Broadcast
from .flow import PeerBase

__all__ = [
    "MAX_ANSWER_BYTES",
    "MAX_ANSWER_ERRORS",
    "NDJSON",
    "AbortMessage",
    "HttpProducer",
    "Item",
    "answer_of",
]

NDJSON = "application/x-ndjson"
MAX_LINES = 64
"""Lines of an NDJSON body waiting to be applied before its socket stops being read (it also
stops once they hold ``--max-frame-bytes``)."""
MAX_ANSWER_BYTES = 4 * 1024 * 1024
"""Bytes of frames (acks, errors, cancels) one request's answer keeps before the rest of its
body is refused (see :meth:`HttpProducer.collect`). A reply streamed in one request earns one
ack; this is the acks of some 100,000 whole messages on a short channel (a 1 MiB body of the
smallest earns 1.7 MB of them), or of 14,000 on a channel of 256 characters."""
MAX_ANSWER_ERRORS = 1024
"""Errors one request's answer keeps before the rest of its body is refused: a body that
earns more is broken, and the ones listed already say how."""


@dataclass(frozen=True, slots=True)
class AbortMessage:
    """Abort a message of this request's producer, at the producer's own word: an AI SDK
    body's ``abort`` or ``error`` chunk, or a Stop it obeys
    (:mod:`token_relay.edge.aisdkproduce`). Nothing if the message is not in progress."""

    message_id: str
    reason: AbortReason


Item = str | FrameRejected | AbortMessage
"""A line (or the whole JSON body) to apply, the refusal of one that can't be, or a message
to abort."""


class HttpProducer(PeerBase):
    """The events of one request's body in, the frames for its response out.

    The body is read once, in linear time: each chunk is searched for newlines once, and
    only the line still arriving is kept (at most ``--max-frame-bytes`` of it). A line
    over that is refused whole (``line_too_long``, naming its line), and the rest of it is
    dropped up to its newline; a line that is not UTF-8 is refused (``invalid_json``, naming
    its line). The lines after either are applied as usual.

    The frames kept for the answer are bounded too (:data:`MAX_ANSWER_BYTES`,
    :data:`MAX_ANSWER_ERRORS`): past either, the lines still waiting are dropped, the rest
    of the body is read and dropped, and one ``body_too_large`` refusal ends the request
    (:meth:`_overflow`).
    """

    takes_runs = True
    """Whether its deltas read in a row may be applied as one run (see
    :meth:`dispatch`'s ``settle``)."""

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
        self.acks: list[bytes] = []
        """The JSON of every ack so far (an ``acks`` frame's entries, joined), as encoded once."""
        self.errors: list[bytes] = []
        self.cancels: list[bytes] = []
        self.codes: set[str] = set()
        """The codes of the errors so far."""
        self.held = 0
        """Bytes of the frames kept in :attr:`acks`, :attr:`errors` and :attr:`cancels`, a
        comma each: the answer is at most this and its 37 bytes of keys."""
        self._full = False
        """The answer reached its bound: nothing more of the body is applied."""
        self._refusals = 0
        """Lines refused before they were applied (each an error of the answer), so far."""
        self._arriving = bytearray()
        """The line still arriving (or, for a JSON body, the body so far)."""
        self._lines = 0
        """Lines of the body ended so far (blank ones too): the next line's number less one."""
        self._skipping = False
        """The line arriving was refused for its length: drop it up to its newline."""
        self._items: collections.deque[tuple[Item, int]] = collections.deque()
        """What is still to apply, in order, each with its size in bytes."""
        self._queued = 0
        """Bytes of the lines in :attr:`_items`."""
        self._ended = False
        self._displaced = False
        self.taken = 0
        """Lines (or bodies) handed on to be applied; after a displacement, none more."""
        self.unapplied: int | None = None
        """The first line (counted from 0) not applied because the relay began to stop (a
        rolling restart) while this body was being applied; None if none was refused so."""
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    # ------------------------------------------------------------------ the body in

    def feed(self, chunk: bytes) -> None:
        """Bytes of the body."""
        if self._ended:
            return
        if not self.ndjson:
            self._arriving += chunk
            return
        last = chunk.rfind(b"\n")
        start = 0
        if last >= 0:
            # The lines that end in this chunk, split at once; the first ends the line
            # arriving, if one is.
            lines = chunk[:last].split(b"\n")
            first = 0
            if self._arriving or self._skipping:
                self._line_ends(lines[0])
                first = 1
                if self._ended:
                    return  # cut at the answer's bound (_refuse_line)
            queue, max_line = self._queue, self.max_line
            for at in range(first, len(lines)):
                line = lines[at]
                self._lines += 1
                if len(line) > max_line:
                    self._too_long(self._lines)
                else:
                    queue(line)
                if self._ended:
                    return  # cut at the answer's bound (_refuse_line)
            start = last + 1
        if self._ended:
            return
        if not self._skipping:
            if len(self._arriving) + len(chunk) - start > self.max_line:
                self._too_long(self._lines + 1)
                self._skipping = True  # the rest of it, up to its newline, is dropped
            elif start < len(chunk):
                self._arriving += chunk[start:] if start else chunk
        if not self._paused and (len(self._items) >= MAX_LINES or self._queued >= self.max_line):
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def _line_ends(self, tail: bytes) -> None:
        """The line arriving ends with ``tail``: queue it (or its refusal)."""
        self._lines += 1
        if self._skipping:  # refused already
            self._skipping = False
        elif len(self._arriving) + len(tail) > self.max_line:
            self._too_long(self._lines)
        elif self._arriving:
            self._arriving += tail
            line, self._arriving = bytes(self._arriving), bytearray()
            self._queue(line)
        else:
            self._queue(bytes(tail))

    def _too_long(self, number: int) -> None:
        """Line ``number`` is over the limit: refuse it whole."""
        self._arriving = bytearray()
        if self._ended:
            return
        refusal = FrameRejected(
            ErrorCode.LINE_TOO_LONG,
            f"line {number} is over {self.max_line} bytes; none of it was applied",
            line=number,
        )
        self._refuse_line(refusal)

    def _queue(self, line: bytes) -> None:
        if not line or line.isspace():
            return
        try:
            text = line.decode()
        except UnicodeDecodeError:
            number = self._lines
            refusal = FrameRejected(
                ErrorCode.INVALID_JSON, f"line {number} is not UTF-8", line=number
            )
            self._refuse_line(refusal)
            return
        self._items.append((text, len(line)))
        self._queued += len(line)

    def end(self) -> None:
        """The body is complete."""
        if self._ended:
            return
        if not self.ndjson:
            try:
                self._items.append((self._arriving.decode(), 0))
            except UnicodeDecodeError:
                refusal = FrameRejected(ErrorCode.INVALID_JSON, "the body is not UTF-8")
                self._items.append((refusal, 0))
        elif self._arriving and not self._skipping:
            self._lines += 1
            self._queue(bytes(self._arriving))
        self._finish()

    def refuse(self, reason: str) -> None:
        """The body is over its limit (``reason``): apply what came whole before it, refuse
        the rest, and read nothing more."""
        if self._ended:
            return
        self._items.append((FrameRejected(ErrorCode.BODY_TOO_LARGE, reason), 0))
        self._finish()

    def lost(self) -> None:
        """The socket is gone in mid-body: apply the lines that came whole, then end."""
        self._finish()

    def _refuse_line(self, refusal: FrameRejected) -> None:
        """Queue the refusal of a line. Each is an error of the answer once applied: past
        :data:`MAX_ANSWER_ERRORS` of them the answer reaches its bound, so the body is cut
        right here, before a line more of it is queued (:meth:`_cut`)."""
        self._items.append((refusal, 0))
        self._refusals += 1
        if self._refusals >= MAX_ANSWER_ERRORS:
            self._cut(f"{MAX_ANSWER_ERRORS} errors", ahead=True)

    def _overflow(self) -> None:
        """The answer reached its bound while the body was applied: apply nothing more of
        it (:meth:`_cut`). Nothing to refuse if nothing of the body is left."""
        self._full = True
        if self._displaced or not self._left():
            return
        if len(self.errors) >= MAX_ANSWER_ERRORS:
            self._cut(f"{MAX_ANSWER_ERRORS} errors", ahead=False)
        else:
            self._cut(f"{MAX_ANSWER_BYTES} bytes of frames", ahead=False)

    def _cut(self, bound: str, *, ahead: bool) -> None:
        """End the body at the answer's ``bound``, as when it passes ``--max-body-bytes``:
        after every line queued (``ahead``: the refusals waiting will take the answer to
        its bound), or after the line being applied (its frames are kept, and so are those
        still to come of the lines before it), the lines waiting dropped. What still comes
        of the body is read and dropped, and one ``body_too_large`` refusal, the body's
        last event, says from where nothing was applied."""
        refusal = self._cut_refusal(bound, ahead)
        if not ahead:
            self._drop_waiting()
        self._items.append((refusal, 0))
        self._finish()

    def _left(self) -> bool:
        """Whether some of the body is still to apply: lines waiting, or still to come."""
        return bool(self._items) or not self._ended

    def _drop_waiting(self) -> None:
        """Drop what waits to be applied."""
        self._items.clear()
        self._queued = 0

    def _cut_refusal(self, bound: str, ahead: bool) -> FrameRejected:
        """The refusal that ends a body cut at the answer's ``bound`` (see :meth:`_cut`);
        its ``index`` is the first of its lines not applied, counted from 0 (as for
        ``producer_moved``)."""
        index = self.taken + len(self._items) if ahead else self.taken
        return FrameRejected(
            ErrorCode.BODY_TOO_LARGE,
            f"the answer to this request reached {bound}: its lines from index {index} on "
            "were not applied, and the rest of the body was not read; send what was not "
            "acked again, in another request",
            index=index,
        )

    def _finish(self) -> None:
        self._arriving = bytearray()
        self._ended = True
        if self._paused:
            self._paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()  # what still comes is read and dropped
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> HttpProducer:
        return self

    async def dispatch(
        self,
        handle: Callable[[Item], Awaitable[None] | None],
        settle: Callable[[], None] | None = None,
    ) -> None:
        """Hand every line (or the whole body), or its refusal, to ``handle``, in order,
        waiting for what it returns before the next.

        The lines read so far are handed over in a row, with no wait between them.
        ``settle``, if given, is called before every wait: whatever ``handle`` put off is
        done before the loop runs anything else (as :meth:`WebSocket.dispatch` calls it)."""
        items = self._items
        while True:
            while items and not self._displaced:
                later = handle(self._next())
                if later is not None:
                    if settle is not None:
                        settle()
                    await later
            if settle is not None:
                settle()
            if self._ended or self._displaced:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def __anext__(self) -> Item:
        """The next line (or the whole JSON body); the iteration ends with the body."""
        while not self._items or self._displaced:
            if self._ended or self._displaced:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._next()

    def _next(self) -> Item:
        """Take the first line waiting; the socket is read again once few are left."""
        item, size = self._items.popleft()
        self._queued -= size
        self.taken += 1
        if (
            self._paused
            and len(self._items) < MAX_LINES // 2
            and self._queued <= self.max_line // 2
        ):
            self._paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()
        return item

    # ------------------------------------------------------------------ frames out

    def take(self, broadcast: Broadcast) -> None:
        """A frame sent to this producer (and maybe others), kept for the response."""
        self.collect(broadcast.data())

    def collect(self, data: bytes) -> None:
        """A frame the relay sends this producer, kept for the response as it was encoded:
        it is told by how it starts (the relay's encoders put ``type`` first, and an
        error's ``code`` next), never decoded nor encoded again. A frame that starts
        otherwise is read as JSON for its type (and its code).

        Every frame is kept, but once they reach the answer's bound nothing more of the
        body is applied (:meth:`_overflow`)."""
        if data.startswith(ACK_HEAD):
            self.acks.append(data)
        elif data.startswith(ACKS_HEAD) and data.endswith(b"]}"):
            if len(data) <= len(ACKS_HEAD) + 2:
                return
            data = data[len(ACKS_HEAD) : -2]
            self.acks.append(data)
        elif data.startswith(ERROR_HEAD):
            start = len(ERROR_HEAD)
            code = CODES.get(data[start : data.find(b'"', start)])
            if code is None:
                self.collect_parsed(data)
                return
            self.errors.append(data)
            self.codes.add(code)
        elif data.startswith(CANCEL_HEAD):
            self.cancels.append(data)
        else:
            if not data.startswith(SESSION_HEAD):
                self.collect_parsed(data)
            return
        self._kept(len(data))

    def collect_parsed(self, data: bytes) -> None:
        """:meth:`collect` for a frame of any spacing: read as JSON for its type."""
        frame = json.loads(data)
        kind = frame.get("type")
        if kind == "ack":
            self.acks.append(data)
        elif kind == "acks":
            data = _entries(data, frame)
            if not data:
                return
            self.acks.append(data)
        elif kind == "error":
            self.errors.append(data)
            self.codes.add(str(frame.get("code")))
        elif kind == "cancel":
            self.cancels.append(data)
        else:
            return
        self._kept(len(data))

    def _kept(self, size: int) -> None:
        """A frame of ``size`` bytes was kept for the answer."""
        self.held += size + 1
        if (
            self.held >= MAX_ANSWER_BYTES or len(self.errors) >= MAX_ANSWER_ERRORS
        ) and not self._full:
            self._overflow()

    def answer(self) -> bytes:
        """The response's body: ``{"acks": [...], "errors": [...], "cancels": [...]}``, the
        frames' own JSON joined."""
        return answer_of(self.acks, self.errors, self.cancels)

    def ended(self, message_id: str, frame: str) -> None:
        """The terminal frame (``message`` or ``aborted``, with its offset) of a message of
        this producer's session was published while this request was attached. Nothing to
        keep here: the answer of ``POST /produce`` has its acks."""

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


ACKS_HEAD = b'{"type":"acks","acks":['
"""How an ``acks`` frame starts (:func:`~token_relay.core.codec.acks_frame`)."""
ACK_HEAD = b'{"type":"ack",'
ERROR_HEAD = b'{"type":"error","code":"'
CANCEL_HEAD = b'{"type":"cancel",'
SESSION_HEAD = b'{"type":"session",'
"""How the relay's other frames to a producer start (their models' first fields)."""
CODES = {code.value.encode(): code.value for code in ErrorCode}
"""Every error code, as it is written in a frame."""


def answer_of(
    acks: Sequence[bytes], errors: Sequence[bytes], cancels: Sequence[bytes] = ()
) -> bytes:
    """The body answering ``POST /produce``: every frame the request earned, as encoded."""
    return b'{"acks":[%b],"errors":[%b],"cancels":[%b]}' % (
        b",".join(acks),
        b",".join(errors),
        b",".join(cancels),
    )


def _entries(data: bytes, frame: dict[str, Any]) -> bytes:
    """The entries of an ``acks`` frame, their JSON joined by commas, cut from the frame."""
    if data.startswith(ACKS_HEAD) and data.endswith(b"]}"):
        return data[len(ACKS_HEAD) : -2]
    # Another encoder's spacing: encode the entries (this frame only) as the answer does.
    listed = json.dumps(frame.get("acks", []), ensure_ascii=False, separators=(",", ":"))
    return listed[1:-1].encode()
