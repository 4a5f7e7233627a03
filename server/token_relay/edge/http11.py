"""HTTP/1.1 on one socket, without I/O: its requests read, its responses written.

Theory of operation
-------------------
An :class:`Http11` is one connection's HTTP, one request/response cycle at a time. Bytes go
in with :meth:`Http11.receive_data`; :meth:`Http11.next_event` hands out what they make: a
request's :class:`Head`, pieces of its :class:`Body`, its :data:`END`, or :data:`NEED_DATA`,
:data:`PAUSED` (a next request is here, pipelined, and waits for this one's answer) and
:data:`CLOSED` (the client closed its side between requests). The response goes out as
bytes from :meth:`Http11.respond`, :meth:`Http11.body` and :meth:`Http11.end`, which the
caller writes; :meth:`Http11.start_next_cycle` then starts the next request.

Two parsers read a request, and both accept and refuse exactly the same requests (a
property test plays malformed and smuggling shapes through both):

- **h11** reads anything: a request it refuses raises
  :class:`~token_relay.core.errors.BadRequest` with the status to answer (h11's
  ``error_status_hint``).
- **fast** (the default) reads only the common well-formed shape: a whole head in
  ``CRLF`` lines, ``HTTP/1.1``, one ``Host``, at most one plain ``Content-Length``, every
  line matching h11's own grammar, and none of the headers that change framing or the
  connection (``Transfer-Encoding``, ``Expect``, ``Upgrade``, ``Connection`` other than
  ``keep-alive`` or ``close``; after ``close`` the response says so and the socket
  closes, as with h11). Any other request, complete or not, is handed whole to a fresh h11 for
  the rest of its cycle: the fast parser never refuses anything itself, except a body cut
  short by the client's close, which it answers as h11 does.

The writer is one for both parsers, and writes what h11 wrote before it: status lines
pre-built per status, header lines checked against HTTP's grammar (a bad one raises
:class:`~token_relay.core.errors.InvalidResponse`, where h11's raised its own error),
``Transfer-Encoding: chunked`` for a body of unknown length (for an HTTP/1.0 client: no
framing, and the connection closes after it),
``Connection: close`` whenever either side won't keep the connection, no body for ``HEAD``,
``204`` and ``304``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from http import HTTPStatus

import h11

from ..core.errors import BadRequest, InvalidResponse

__all__ = [
    "CLOSED",
    "END",
    "MAX_HEAD_BYTES",
    "NEED_DATA",
    "PARSERS",
    "PAUSED",
    "Body",
    "Event",
    "Head",
    "Http11",
    "sized_head",
]

MAX_HEAD_BYTES = 16 * 1024
"""A bigger request line and headers get 431."""

PARSERS = ("fast", "h11")
"""The request parsers (``--http-parser``)."""


class Signal(enum.Enum):
    """What :meth:`Http11.next_event` says when it has no request part to hand out."""

    NEED_DATA = "need data"
    PAUSED = "paused"
    """A next request waits until this one is answered."""
    CLOSED = "closed"
    """The client closed its side between requests."""
    END = "end"
    """The request's body (if any) is complete."""


NEED_DATA = Signal.NEED_DATA
PAUSED = Signal.PAUSED
CLOSED = Signal.CLOSED
END = Signal.END


@dataclass(slots=True)
class Head:
    """A request's line and headers."""

    method: bytes
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    """Names lower-cased; values without their surrounding whitespace."""
    raw_headers: tuple[tuple[bytes, bytes], ...]
    """Names as sent (for the WebSocket handshake)."""
    http_version: bytes
    length: int | None
    """The first ``Content-Length``, if any."""
    chunked: bool
    """Whether it has a ``Transfer-Encoding``."""
    size: int
    """The head's size, as the 431 check counts it."""

    @property
    def has_body(self) -> bool:
        """Whether it says a body follows."""
        return bool(self.length) or self.chunked


@dataclass(frozen=True, slots=True)
class Body:
    """A piece of a request's body, as it arrived."""

    data: bytes | bytearray


Event = Head | Body | Signal


class _State(enum.Enum):
    IDLE = "idle"
    SEND_RESPONSE = "send response"
    SEND_BODY = "send body"
    DONE = "done"
    MUST_CLOSE = "must close"
    ERROR = "error"


# h11's grammar (h11/_abnf.py), so that both parsers accept the same heads.
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_FIELD_VCHAR = rb"[^\x00\s]"
_FIELD_CONTENT = _FIELD_VCHAR + rb"+(?:[ \t]+" + _FIELD_VCHAR + rb"+)*"
_FIELD_VALUE = rb"(" + _FIELD_CONTENT + rb")?"
_FIELD = _TOKEN + rb":[ \t]*(?:" + _FIELD_CONTENT + rb")?[ \t]*"
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb") ([\x21-\x7e]+) HTTP/1\.1")
"""The request line of the common shape."""
_FIELDS = re.compile(
    rb"\r\n(" + _TOKEN + rb"):[ \t]*((?:[^\x00\r\n\x0b\x0c]*[^\x00\s])?)[ \t]*(?=\r\n|$)"
)
"""Each header line's name and value, its surrounding whitespace left out. A line matches
exactly when it matches h11's grammar (:data:`_FIELD`): a value is VCHARs with spaces and
tabs between them. This is the same language in a form the regular expression engine runs
in one sweep of a character class, where h11's form loops once per word. A line that does
not match makes no match of its own, so a head whose matches are fewer than its line breaks
goes to h11."""
_NAME = re.compile(_TOKEN)
_VALUE = re.compile(_FIELD_VALUE)
_LENGTH = re.compile(rb"[0-9]{1,18}")
_BLANK_LINE = re.compile(rb"\n\r?\n")
_SPECIAL = frozenset(
    {b"host", b"content-length", b"transfer-encoding", b"connection", b"expect", b"upgrade"}
)
"""Headers the fast parser looks at: those that change framing or the connection."""

_FALLBACK = object()
"""The fast parser's answer for a head it leaves to h11."""


@lru_cache(maxsize=64)
def _status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())


_WRITER_SPECIAL = frozenset({"content-length", "connection", "transfer-encoding"})
"""Response headers the writer looks at (framing and the connection's end)."""


@lru_cache(maxsize=1024)
def _header_line(name: str, value: str) -> tuple[bytes, bool]:
    """One header line, and whether its name is one the writer looks at
    (:data:`_WRITER_SPECIAL`); a name or value HTTP doesn't allow raises, as h11's writer
    did."""
    try:
        # A value echoed from the request (Origin, a stream's Content-Type) was decoded as
        # latin-1: the same bytes go back.
        raw_name, raw_value = name.encode("ascii"), value.encode("latin-1")
    except UnicodeEncodeError:
        raise InvalidResponse(f"Illegal header {name!r}: {value!r}") from None
    if _NAME.fullmatch(raw_name) is None:
        raise InvalidResponse(f"Illegal header name {raw_name!r}")
    if _VALUE.fullmatch(raw_value) is None:
        raise InvalidResponse(f"Illegal header value {raw_value!r}")
    return b"%s: %s\r\n" % (raw_name, raw_value), name.lower() in _WRITER_SPECIAL


def _comma_values(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    """A comma-separated header's values, lower-cased (h11's ``get_comma_header``)."""
    values: list[bytes] = []
    for found, value in headers:
        if found == name:
            for item in value.split(b","):
                item = item.strip().lower()
                if item:
                    values.append(item)
    return values


def sized_head(status: int, headers: tuple[tuple[str, str], ...]) -> bytes | None:
    """A response head up to its ``Content-Length`` (its status line and ``headers``'
    lines, checked), for :meth:`Http11.sized`; None if a header is one that
    :meth:`Http11.respond` must look at (``Content-Length``, ``Connection``,
    ``Transfer-Encoding``) or the status has no body."""
    if status in (204, 304):
        return None
    lines = [_header_line(name, value) for name, value in headers]
    if any(special for _, special in lines):
        return None
    return _status_line(status) + b"".join(line for line, _ in lines)


def _head_of(request: h11.Request) -> Head:
    raw = tuple((bytes(name), bytes(value)) for name, value in request.headers.raw_items())
    lowered = tuple((bytes(name), bytes(value)) for name, value in request.headers)
    length = next((int(value) for name, value in lowered if name == b"content-length"), None)
    return Head(
        method=bytes(request.method),
        target=bytes(request.target),
        headers=lowered,
        raw_headers=raw,
        http_version=bytes(request.http_version),
        length=length,
        chunked=any(name == b"transfer-encoding" for name, _ in lowered),
        size=len(request.target) + sum(len(k) + len(v) + 4 for k, v in lowered),
    )


class Http11:
    """One connection's HTTP/1.1: requests in, responses out (see the module's docstring)."""

    def __init__(self, *, fast: bool = True) -> None:
        self.fast = fast
        """Whether the fast parser reads the requests it can (else h11 reads every one)."""
        self._buffer = bytearray()
        self._eof = False
        self._h11: h11.Connection | None = None
        """The h11 reading this cycle's request, if the fast parser left it to h11."""
        self._closing = False
        """The fast parser's request asked for the connection's close (``Connection:
        close``): its response says so, and the socket closes after it, as with h11."""
        self._their = _State.IDLE
        self._remaining = 0
        """Bytes of the request's body still to come (fast parser)."""
        self._our = _State.IDLE
        self._framing = "length"
        self._left = 0
        """Bytes of the response's body still to send, for a ``Content-Length`` body."""
        self._keep = True
        """Whether the connection goes on after the response being sent."""
        self.request: Head | None = None
        """This cycle's request, once its head is read."""
        self.waiting_for_100_continue = False
        """Whether the client holds its body back until ``100 Continue``."""

    # ------------------------------------------------------------------ requests in

    def receive_data(self, data: bytes) -> None:
        """Bytes from the socket; ``b""`` for its end."""
        if self._h11 is not None:
            self._h11.receive_data(data)
        elif data:
            self._buffer += data
        else:
            self._eof = True

    @property
    def pending(self) -> bool:
        """Whether :meth:`next_event` may have something to hand out beyond
        :data:`NEED_DATA`: bytes (or the socket's end) not read yet, or h11 reading."""
        return self._h11 is not None or self._eof or bool(self._buffer)

    @property
    def answering(self) -> bool:
        """Whether the request was read whole and its response not yet begun: a client
        that closes its side now (a half-close) is still owed the response."""
        return self._their is _State.DONE and self._our is _State.SEND_RESPONSE

    @property
    def trailing_data(self) -> bytes:
        """What came after the request (for a WebSocket, its first frames)."""
        if self._h11 is not None:
            return self._h11.trailing_data[0]
        return bytes(self._buffer)

    def next_event(self) -> Event:
        """The next part of the request. A request that breaks HTTP raises
        :class:`~token_relay.core.errors.BadRequest`, with the status to answer."""
        if self._h11 is not None:
            return self._h11_event(self._h11)
        their = self._their
        if their is _State.SEND_BODY:
            remaining = self._remaining
            if remaining == 0:
                self._their = _State.DONE
                return END
            buffer = self._buffer
            if not buffer:
                if self._eof:
                    self._their = _State.ERROR
                    length = self.request.length if self.request is not None else 0
                    raise BadRequest(
                        400,
                        "peer closed connection without sending complete message body "
                        f"(received {(length or 0) - remaining} bytes, expected {length})",
                    )
                return NEED_DATA
            if len(buffer) <= remaining:
                data = bytes(buffer)
                buffer.clear()
            else:
                data = bytes(buffer[:remaining])
                del buffer[:remaining]
            self._remaining = remaining - len(data)
            return Body(data)
        if their is _State.DONE:
            if self._buffer:
                if self._closing:  # h11's MUST_CLOSE: nothing may follow the request
                    self._their = _State.ERROR
                    raise BadRequest(400, "Got data when expecting EOF")
                return PAUSED
            if self._eof:
                return CLOSED
            return NEED_DATA
        if their is not _State.IDLE:
            raise BadRequest(400, f"Can't receive data when peer state is {their}")
        head = self._fast_head() if self.fast else _FALLBACK
        if head is _FALLBACK:
            conn = self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
            if self._buffer:
                conn.receive_data(bytes(self._buffer))
                self._buffer.clear()
            if self._eof:
                conn.receive_data(b"")
            return self._h11_event(conn)
        if head is None:
            return CLOSED if self._eof else NEED_DATA
        assert isinstance(head, Head)
        self.request = head
        self._their = _State.SEND_BODY
        self._remaining = head.length or 0
        self._our = _State.SEND_RESPONSE
        return head

    def whole_body(self) -> bytes | None:
        """The request's whole body, if all of it is here already and the fast parser read
        its head: what :meth:`next_event` would hand out as its :class:`Body` pieces, and its
        :data:`END` with them. None (nothing taken) otherwise."""
        if self._h11 is not None or self._their is not _State.SEND_BODY:
            return None
        remaining, buffer = self._remaining, self._buffer
        if len(buffer) < remaining:
            return None
        if len(buffer) == remaining:
            data = bytes(buffer)
            buffer.clear()
        else:
            data = bytes(buffer[:remaining])
            del buffer[:remaining]
        self._remaining = 0
        self._their = _State.DONE
        return data

    def _fast_head(self) -> Head | object | None:
        """The request's head if it is whole and of the common shape; None if nothing came
        yet or not all of it; :data:`_FALLBACK` for h11 to read it."""
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if not buffer:
                return None
            if (
                self._eof
                or buffer[0] < 0x21
                or len(buffer) > MAX_HEAD_BYTES
                or _BLANK_LINE.search(buffer) is not None
            ):
                return _FALLBACK
            return None
        if end > MAX_HEAD_BYTES:
            return _FALLBACK
        head = bytes(buffer[:end])
        first = head.find(b"\r\n")
        if first < 0:
            return _FALLBACK  # no Host
        line = _REQUEST_LINE.fullmatch(head, 0, first)
        if line is None:
            return _FALLBACK
        method, target = line.group(1, 2)
        if method == b"CONNECT":
            return _FALLBACK
        fields: list[tuple[bytes, bytes]] = _FIELDS.findall(head, first)
        if len(fields) != head.count(b"\r\n"):
            return _FALLBACK  # a line h11's grammar refuses (or h11 reads what it means)
        headers: list[tuple[bytes, bytes]] = []
        hosts = 0
        length: int | None = None
        closing = False
        size = len(target)
        for name, value in fields:
            lowered = name.lower()
            if lowered in _SPECIAL:
                if lowered == b"host":
                    hosts += 1
                elif lowered == b"content-length":
                    if length is not None or _LENGTH.fullmatch(value) is None:
                        return _FALLBACK
                    length = int(value)
                elif lowered == b"connection":
                    option = value.lower()
                    if option == b"close":
                        closing = True
                    elif option != b"keep-alive":
                        return _FALLBACK
                else:
                    return _FALLBACK
            headers.append((lowered, value))
            size += len(name) + len(value) + 4
        if hosts != 1:
            return _FALLBACK
        del buffer[: end + 4]
        self._closing = closing
        return Head(method, target, tuple(headers), tuple(fields), b"1.1", length, False, size)

    def _h11_event(self, conn: h11.Connection) -> Event:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise BadRequest(exc.error_status_hint, str(exc)) from None
        if isinstance(event, h11.Data):
            return Body(event.data)
        if isinstance(event, h11.Request):
            version = bytes(event.http_version)
            if version not in (b"1.0", b"1.1"):  # h11 reads any digit.digit
                raise BadRequest(505, f"HTTP/{version.decode()} is not served: HTTP/1.1 is")
            if version == b"1.0" and any(
                name == b"upgrade" and b"websocket" in value.lower()
                for name, value in event.headers
            ):
                raise BadRequest(400, "a WebSocket handshake takes HTTP/1.1 (RFC 6455)")
            head = self.request = _head_of(event)
            self.waiting_for_100_continue = conn.they_are_waiting_for_100_continue
            self._our = _State.SEND_RESPONSE
            return head
        if isinstance(event, h11.EndOfMessage):
            self._their = _State.DONE
            return END
        if event is h11.NEED_DATA:
            return NEED_DATA
        if event is h11.PAUSED:
            return PAUSED
        return CLOSED  # h11.ConnectionClosed: no other event comes from a client

    # ------------------------------------------------------------------ responses out

    @property
    def keep_alive(self) -> bool:
        """Whether the client lets the connection go on after this cycle."""
        request = self.request
        if request is None:
            return True
        if self._h11 is None:
            # The fast parser reads HTTP/1.1 only, with no Connection but keep-alive or close.
            return not self._closing
        if request.http_version < b"1.1":
            return False
        return b"close" not in _comma_values(request.headers, b"connection")

    @property
    def chunked(self) -> bool:
        """Whether the response's body is chunked (so a stream may frame chunks itself)."""
        return self._framing == "chunked"

    def respond(self, status: int, headers: Sequence[tuple[str, str]]) -> bytes:
        """A response's head, as h11 wrote it."""
        if self._our is not _State.SEND_RESPONSE and self._our is not _State.IDLE:
            self._our = _State.ERROR
            raise InvalidResponse(f"can't send a response in state {self._our}")
        try:
            return self._head(status, headers)
        except BaseException:
            self._our = _State.ERROR
            raise

    def _head(self, status: int, headers: Sequence[tuple[str, str]]) -> bytes:
        request = self.request
        method = request.method if request is not None else None
        parts = [_status_line(status)]
        length: int | None = None
        closing: list[bytes] = []
        """The values of the response's own ``Connection`` headers."""
        connection: list[bytes] = []
        for name, value in headers:
            line, special = _header_line(name, value)
            if special:
                lowered = name.lower()
                if lowered == "content-length":
                    length = int(value)
                elif lowered == "connection":
                    closing += _comma_values(((b"connection", line[12:-2]),), b"connection")
                    connection.append(line)
                else:
                    raise InvalidResponse("the relay never sets Transfer-Encoding itself")
            parts.append(line)
        keep = self.keep_alive
        if status in (204, 304) or (method == b"CONNECT" and 200 <= status < 300):
            framing, left = "length", 0
        elif length is not None:
            framing, left = "length", length
        elif request is None or request.http_version < b"1.1":
            # A body of unknown length to an HTTP/1.0 client: no framing, then the close.
            framing, left = "http/1.0", 0
            if method != b"HEAD":
                keep = False
        else:
            framing, left = "chunked", 0
            parts.append(b"Transfer-Encoding: chunked\r\n")
        if method == b"HEAD":
            framing, left = "length", 0
        if not keep:
            # As h11 did: every Connection header goes, and one per value comes last.
            if connection:
                parts = [part for part in parts if part not in connection]
            values = set(closing)
            values.discard(b"keep-alive")
            values.add(b"close")
            parts += [b"Connection: %s\r\n" % value for value in sorted(values)]
        if b"close" in closing:
            keep = False
        parts.append(b"\r\n")
        self._framing, self._left = framing, left
        self._our = _State.SEND_BODY
        self._keep = keep
        return b"".join(parts)

    def _written_whole(self) -> bool:
        """Whether a response may be written whole, its state changed at once: the request
        was read by the fast parser (so HTTP/1.1) and keeps the connection alive, is
        neither ``HEAD`` nor ``CONNECT``, and has no response yet."""
        request = self.request
        return (
            self._our is _State.SEND_RESPONSE
            and self._h11 is None
            and not self._closing
            and request is not None
            and request.method not in (b"HEAD", b"CONNECT")
        )

    def sized(self, head: bytes, body: bytes) -> bytes | None:
        """The whole response, ``head`` (from :func:`sized_head`) with its
        ``Content-Length`` and ``body``, byte for byte what :meth:`respond`, :meth:`body`
        and :meth:`end` write for it, with the same change of state; None (nothing
        changed) unless the request was read by the fast parser (so HTTP/1.1, kept alive)
        and is neither ``HEAD`` nor ``CONNECT``: :meth:`respond` writes those."""
        if not self._written_whole():
            return None
        self._framing, self._left, self._keep = "length", 0, True
        self._our = _State.DONE
        return b"%bContent-Length: %d\r\n\r\n%b" % (head, len(body), body)

    def no_content(self, headers: Sequence[tuple[str, str]]) -> bytes | None:
        """The whole ``204`` response with ``headers``, byte for byte what :meth:`respond`
        and :meth:`end` write for it, with the same change of state; None (nothing
        changed) where :meth:`sized` gives None, or for a header :meth:`respond` must look
        at (``Content-Length``, ``Connection``, ``Transfer-Encoding``)."""
        if not self._written_whole():
            return None
        parts = [_status_line(204)]
        for name, value in headers:
            line, special = _header_line(name, value)
            if special:
                return None
            parts.append(line)
        parts.append(b"\r\n")
        self._framing, self._left, self._keep = "length", 0, True
        self._our = _State.DONE
        return b"".join(parts)

    def continue_100(self) -> bytes:
        """``100 Continue``: the client may send its body."""
        if self._our is not _State.SEND_RESPONSE:
            raise InvalidResponse(f"can't send 100 Continue in state {self._our}")
        self.waiting_for_100_continue = False
        return b"HTTP/1.1 100 \r\n\r\n"

    def body(self, data: bytes) -> bytes:
        """A piece of the response's body, framed."""
        if self._our is not _State.SEND_BODY:
            self._our = _State.ERROR
            raise InvalidResponse(f"can't send data in state {self._our}")
        framing = self._framing
        if framing == "chunked":
            return b"%x\r\n%b\r\n" % (len(data), data) if data else b""
        if framing == "length":
            if len(data) > self._left:
                self._our = _State.ERROR
                raise InvalidResponse("Too much data for declared Content-Length")
            self._left -= len(data)
        return data

    def end(self) -> bytes:
        """The end of the response."""
        if self._our is not _State.SEND_BODY:
            self._our = _State.ERROR
            raise InvalidResponse(f"can't end a response in state {self._our}")
        if self._framing == "length" and self._left:
            self._our = _State.ERROR
            raise InvalidResponse("Too little data for declared Content-Length")
        self._our = _State.DONE if self._keep else _State.MUST_CLOSE
        return b"0\r\n\r\n" if self._framing == "chunked" else b""

    # ------------------------------------------------------------------ cycles

    def start_next_cycle(self) -> bool:
        """After a whole request and a whole response on a connection kept alive: ready
        for the next request (which may be here already). False if it can't go on."""
        if self._our is not _State.DONE or self._their is not _State.DONE:
            return False
        if self._h11 is not None:
            trailing, closed = self._h11.trailing_data
            self._buffer = bytearray(trailing)
            self._eof = closed
            self._h11 = None
        self._their = self._our = _State.IDLE
        self.request = None
        self.waiting_for_100_continue = False
        return True
