"""The HTTP/1.1 edge's two parsers: the fast one and h11 accept and refuse the same requests.

Generated request streams, valid and malformed (smuggling shapes included: Content-Length
with Transfer-Encoding, conflicting lengths, unknown codings, bare LF or CR, obs-fold, bad
chunk sizes), pipelined and cut at random points, are played through an
:class:`~token_relay.edge.connection.HttpConnection` of a real relay over an in-memory
transport, once per parser: the bytes written back and how the socket ended must be the
same. The writer is checked against h11's own, byte for byte.

``HTTP11_EXAMPLES=N`` plays N streams instead of the default few hundred.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from token_relay import Relay, Settings
from token_relay.core.errors import BadRequest, InvalidResponse
from token_relay.edge import http11
from token_relay.edge.connection import HttpConnection
from token_relay.edge.http import HttpRequest
from token_relay.edge.http11 import CLOSED, END, NEED_DATA, PAUSED, Body, Head, Http11

from tests.conftest import NO_SWEEPS

EXAMPLES = int(os.environ.get("HTTP11_EXAMPLES", "150"))


# ---------------------------------------------------------------------- the transport


@dataclass
class FakeTransport:
    """What a socket's transport records: the bytes written, and how it ended."""

    written: bytearray = field(default_factory=bytearray)
    closing: bool = False
    ended: list[str] = field(default_factory=list)
    paused: bool = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def write(self, data: bytes) -> None:
        if "eof" in self.ended or self.closing:
            raise RuntimeError("write after the end")
        self.written += data

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.ended.append("eof")

    def close(self) -> None:
        if not self.closing:
            self.ended.append("close")
        self.closing = True

    def abort(self) -> None:
        self.ended.append("abort")
        self.closing = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


async def _settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


async def _play(relay: Relay, parser: str, chunks: list[bytes], eof: bool) -> tuple[bytes, str]:
    assert relay.server is not None
    connection = HttpConnection(relay.server)
    connection.http = Http11(fast=parser == "fast")
    transport = FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    for chunk in chunks:
        await _settle()
        if transport.closing or (transport.paused and connection.ws is None):
            break  # the kernel would keep it
        connection.data_received(chunk)
    else:
        await _settle()
        if eof and not transport.closing and not transport.paused:
            connection.eof_received()
    await _settle()
    if not transport.closing:
        transport.closing = True
        connection.connection_lost(None)
        await _settle()
    return bytes(transport.written), ",".join(transport.ended)


async def _both(chunks: list[bytes], eof: bool) -> dict[str, tuple[bytes, str]]:
    seen = {}
    for parser in ("fast", "h11"):
        relay = Relay(Settings(port=0, max_body_bytes=64, http_parser=parser, **NO_SWEEPS))
        await relay.start()
        try:
            seen[parser] = await _play(relay, parser, chunks, eof)
        finally:
            await relay.stop()
    return seen


# ---------------------------------------------------------------------- requests

TARGETS = [
    "/healthz",
    "/readyz",
    "/healthz?x=1",
    "/nope",
    "/produce",
    "/produce?channel=c",
    "/subscribe?channel=c",
    "/cancel?channel=c",
    "http://h/healthz",
    "//h/healthz",
    "/healthz#f",
    "*",
    "/a b",
]
METHODS = ["GET", "GET", "HEAD", "POST", "POST", "PUT", "OPTIONS", "CONNECT", "G@T", ""]
BODY = b'{"id":"m","delta":"hi","final":true}'


@st.composite
def header_sets(draw: st.DrawFn) -> list[bytes]:
    """Header lines, well-formed or not."""
    lines: list[bytes] = []
    hosts = draw(st.sampled_from([1, 1, 1, 0, 2]))
    lines += [b"Host: relay"] * hosts
    extra = draw(
        st.lists(
            st.sampled_from(
                [
                    b"Content-Type: application/json",
                    b"Content-Type: application/x-ndjson",
                    b"Connection: keep-alive",
                    b"Connection: close",
                    b"Connection: Upgrade",
                    b"Upgrade: websocket",
                    b"Expect: 100-continue",
                    b"Transfer-Encoding: chunked",
                    b"Transfer-Encoding: Chunked",
                    b"Transfer-Encoding: chunked, identity",
                    b"Transfer-Encoding: xchunked",
                    b"Transfer-Encoding : chunked",
                    b"Transfer-Encoding:\tchunked ",
                    b"Content-Length: 5",
                    b"Content-Length: 0",
                    b"Content-Length: 36",
                    b"Content-Length: 36, 36",
                    b"Content-Length: 5, 6",
                    b"Content-Length: -1",
                    b"Content-Length: +5",
                    b"Content-Length: 99999999999999999999999",
                    b"Content-Length: 007",
                    b"Content-Length : 5",
                    b" folded: on",
                    b"\tfolded",
                    b"X-Thing: a b  c",
                    b"X-Thing:",
                    b"X-Obs: caf\xe9",
                    b"X-Ctl: a\x01b",
                    b"X Bad: 1",
                    b": empty",
                    b"Origin: http://example.com",
                    b"Authorization: Bearer nope",
                    b"Last-Event-ID: 1",
                ]
            ),
            max_size=4,
        )
    )
    lines += extra
    return draw(st.permutations(lines))


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """What follows a head: nothing, raw bytes, or chunks (good or bad)."""
    kind = draw(st.sampled_from(["none", "raw", "chunked", "badchunk"]))
    if kind == "none":
        return b""
    if kind == "raw":
        return draw(st.sampled_from([BODY, b"hello", b"x" * 80, b"12345"]))
    pieces = draw(st.lists(st.sampled_from([BODY, b"hi", b"x" * 40]), max_size=3))
    out = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
    if kind == "badchunk":
        out += draw(
            st.sampled_from(
                [b"zz\r\nhi\r\n", b"2;x=1\r\nhi\r\n", b"2 \r\nhi\r\n", b"-2\r\nhi\r\n", b"2\nhi\n"]
            )
        )
    return out + draw(st.sampled_from([b"0\r\n\r\n", b"0\r\nX-Trailer: 1\r\n\r\n", b""]))


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """One request (or something like one)."""
    method = draw(st.sampled_from(METHODS))
    target = draw(st.sampled_from(TARGETS))
    version = draw(st.sampled_from(["HTTP/1.1"] * 6 + ["HTTP/1.0", "HTTP/2.0", "HTTP/1.1 "]))
    lines = [f"{method} {target} {version}".encode(), *draw(header_sets())]
    endings = draw(st.sampled_from([b"\r\n"] * 8 + [b"\n", b"\r"]))
    head = b"".join(line + (b"\r\n" if endings == b"\r" and i else endings) for i, line in
                    enumerate(lines))  # fmt: skip
    prefix = draw(st.sampled_from([b""] * 8 + [b"\r\n", b"\x16\x03\x01"]))
    return prefix + head + b"\r\n" + draw(bodies())


@st.composite
def good_requests(draw: st.DrawFn) -> bytes:
    """A well-formed request, as most clients send them."""
    method = draw(st.sampled_from(["GET", "HEAD", "POST", "POST", "OPTIONS"]))
    target = draw(st.sampled_from(TARGETS[:8]))
    lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: relay"]
    lines += draw(
        st.lists(
            st.sampled_from(
                [
                    b"Content-Type: application/json",
                    b"Connection: keep-alive",
                    b"Connection: close",
                    b"Expect: 100-continue",
                    b"Origin: http://example.com",
                    b"X-Thing: a b",
                ]
            ),
            max_size=2,
            unique=True,
        )
    )
    body = draw(st.sampled_from([b"", BODY, b"x" * 80]))
    if draw(st.booleans()) and body:
        lines.append(b"Transfer-Encoding: chunked")
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    elif body or draw(st.booleans()):
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[bytes], bool]:
    """Requests pipelined on one socket, cut into reads at random points."""
    one = st.one_of(good_requests(), requests())
    data = b"".join(draw(st.lists(one, min_size=1, max_size=3)))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return [chunk for chunk in chunks if chunk], draw(st.booleans())


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(streams())
def test_both_parsers_answer_every_stream_alike(stream: tuple[list[bytes], bool]) -> None:
    chunks, eof = stream
    seen = asyncio.run(_both(chunks, eof))
    assert seen["fast"] == seen["h11"]


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n", 200),
        (b"GET /healthz HTTP/1.1\r\n\r\n", 400),  # no Host
        (b"GET /healthz HTTP/1.1\r\nHost: r\r\nHost: s\r\n\r\n", 400),
        (b"POST /produce HTTP/1.1\r\nHost: r\r\nContent-Length: 5, 6\r\n\r\n", 400),
        (b"POST /produce HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: xchunked\r\n\r\n", 501),
        (b"GET /healthz HTTP/1.1\r\nHost : r\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nHost: r\r\n folded\r\n\r\n", 200),
    ],
)
def test_a_request_gets_its_status_under_both_parsers(raw: bytes, status: int) -> None:
    seen = asyncio.run(_both([raw], False))
    assert seen["fast"] == seen["h11"]
    assert seen["fast"][0].startswith(b"HTTP/1.1 %d " % status)


# ---------------------------------------------------------------------- the parser alone


def test_the_fast_parser_reads_a_common_request_itself() -> None:
    http = Http11()
    http.receive_data(b"POST /produce?channel=c HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n\r\nh")
    head = http.next_event()
    assert isinstance(head, Head) and http._h11 is None
    assert (head.method, head.target, head.length, head.has_body) == (
        b"POST",
        b"/produce?channel=c",
        2,
        True,
    )
    assert head.headers == ((b"host", b"r"), (b"content-length", b"2"))
    assert http.next_event() == Body(b"h")
    assert http.next_event() is NEED_DATA
    http.receive_data(b"iGET")
    assert http.next_event() == Body(b"i")
    assert http.next_event() is END
    assert http.next_event() is PAUSED
    assert http.trailing_data == b"GET"


def test_the_fast_parser_reads_a_request_that_asks_for_the_close() -> None:
    """``Connection: close`` (as Python's urllib sends, say): read by the fast parser, its
    response written the long way, saying ``Connection: close``, and no next cycle."""
    http = Http11()
    http.receive_data(b"GET /healthz HTTP/1.1\r\nHost: r\r\nConnection: Close\r\n\r\n")
    head = http.next_event()
    assert isinstance(head, Head) and http._h11 is None
    assert http.next_event() is END
    assert not http.keep_alive
    assert http.sized(b"HTTP/1.1 200 OK\r\n", b"ok") is None
    assert http.no_content(()) is None
    out = http.respond(200, [("Content-Length", "2")]) + http.body(b"ok") + http.end()
    assert out == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    assert not http.start_next_cycle()


def test_a_head_the_fast_parser_is_unsure_of_goes_to_h11() -> None:
    http = Http11()
    http.receive_data(b"POST / HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    head = http.next_event()
    assert isinstance(head, Head) and head.chunked and http._h11 is not None
    assert http.next_event() is END


def test_a_client_closing_between_requests_is_closed() -> None:
    http = Http11()
    http.receive_data(b"")
    assert http.next_event() is CLOSED


@pytest.mark.parametrize("fast", [True, False])
def test_a_client_closing_after_a_whole_request_is_still_answered(fast: bool) -> None:
    """A half-close: the request came whole, then the client's end. The response is still
    owed (answering) while the close is read; once it is written and the next cycle starts,
    the close ends the connection."""
    http = Http11(fast=fast)
    http.receive_data(b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n\r\nhi")
    assert isinstance(http.next_event(), Head)
    assert not http.answering  # its body is still to be read
    body = b""
    while (event := http.next_event()) is not END:
        assert isinstance(event, Body)
        body += event.data
    assert body == b"hi"
    assert http.answering
    assert http.pending is not fast  # nothing left to read; h11 is always asked
    http.receive_data(b"")
    assert http.pending
    assert http.next_event() is CLOSED
    assert http.answering  # the close did not take the response away
    written = http.respond(200, [("Content-Length", "2")]) + http.body(b"ok") + http.end()
    assert written.startswith(b"HTTP/1.1 200 ") and written.endswith(b"\r\n\r\nok")
    assert not http.answering
    assert http.start_next_cycle()
    assert http.pending and http.next_event() is CLOSED
    assert not http.answering


def test_a_body_cut_short_is_refused_as_h11_refuses_it() -> None:
    messages = []
    for fast in (True, False):
        http = Http11(fast=fast)
        http.receive_data(b"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: 5\r\n\r\nab")
        assert isinstance(http.next_event(), Head)
        assert http.next_event() == Body(b"ab")
        http.receive_data(b"")
        with pytest.raises(BadRequest) as caught:
            http.next_event()
        messages.append((str(caught.value), caught.value.status))
    assert messages[0] == messages[1]
    assert messages[0][1] == 400


# ---------------------------------------------------------------------- the writer

HEADER_SETS = [
    [("Server", "token-relay")],
    [("Server", "token-relay"), ("Content-Type", "text/plain"), ("Content-Length", "3")],
    [("Content-Length", "3"), ("Connection", "close")],
    [("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Content-Length", "3")],
    [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")],
    [("Connection", "close")],
    [("X-Bad", " spaced")],
    [("X Bad", "1")],
]
REQUESTS = [
    b"GET / HTTP/1.1\r\nHost: r\r\n\r\n",
    b"HEAD / HTTP/1.1\r\nHost: r\r\n\r\n",
    b"GET / HTTP/1.0\r\n\r\n",
    b"HEAD / HTTP/1.0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: r\r\nConnection: keep-alive\r\n\r\n",
    b"",
]


def _written(send: Any, *steps: Any) -> tuple[bytes, str]:
    out = b""
    for step in steps:
        try:
            out += send(step) or b""
        except (h11.LocalProtocolError, InvalidResponse):
            return out, "refused"
    return out, "ok"


@pytest.mark.parametrize("request_bytes", REQUESTS)
@pytest.mark.parametrize("headers", HEADER_SETS)
@pytest.mark.parametrize("status", [200, 204, 304, 426])
@pytest.mark.parametrize("body", [b"", b"abc"])
@pytest.mark.parametrize("fast", [False, True])
def test_the_writer_writes_what_h11_wrote(
    request_bytes: bytes, headers: list[tuple[str, str]], status: int, body: bytes, fast: bool
) -> None:
    """Whichever parser read the request (the fast one reads a ``Connection: close``)."""
    reference = h11.Connection(h11.SERVER)
    ours = Http11(fast=fast)
    if request_bytes:
        reference.receive_data(request_bytes)
        assert isinstance(reference.next_event(), h11.Request)
        ours.receive_data(request_bytes)
        assert isinstance(ours.next_event(), Head)

    def theirs(step: str) -> bytes | None:
        if step == "head":
            return reference.send(h11.Response(status_code=status, headers=headers, reason=b""))
        if step == "body":
            return reference.send(h11.Data(data=body))
        return reference.send(h11.EndOfMessage())

    def mine(step: str) -> bytes:
        if step == "head":
            return ours.respond(status, headers)
        if step == "body":
            return ours.body(body)
        return ours.end()

    expected = _written(theirs, "head", "body", "end")
    got = _written(mine, "head", "body", "end")
    # h11 was given no reason phrase here; the writer always writes HTTPStatus's.
    reason = b" " + HTTPStatus(status).phrase.encode()
    assert got[1] == expected[1]
    assert got[0].replace(reason + b"\r\n", b" \r\n", 1) == expected[0]
    done = reference.our_state is h11.DONE and reference.their_state is h11.DONE
    assert ours.start_next_cycle() is done


@pytest.mark.parametrize("request_bytes", REQUESTS)
@pytest.mark.parametrize(
    "headers", [*HEADER_SETS, [("Server", "token-relay"), ("Stream-Next-Offset", "0_12")]]
)
def test_a_204_written_whole_is_what_respond_and_end_write(
    request_bytes: bytes, headers: list[tuple[str, str]]
) -> None:
    # The short way of a 204 (an append's answer): the same bytes and the same state after
    # as the writer's, or None (and nothing changed) where the writer must write it.
    short, writer = Http11(), Http11()
    if request_bytes:
        for http in (short, writer):
            http.receive_data(request_bytes)
            assert isinstance(http.next_event(), Head)

    def written(http: Http11) -> bytes | None:
        try:
            return http.respond(204, headers) + http.end()
        except InvalidResponse:
            return None  # refused

    expected = written(writer)
    try:
        whole = short.no_content(headers)
    except InvalidResponse:
        assert expected is None  # refused both ways
        return
    if whole is None:  # left to the writer, as it was: the same bytes
        assert written(short) == expected
    else:
        assert whole == expected
    assert short.start_next_cycle() is writer.start_next_cycle()
    framing = {"content-length", "connection", "transfer-encoding"}
    common = request_bytes in (REQUESTS[0], REQUESTS[5]) and not any(
        name.lower() in framing for name, _ in headers
    )
    assert (whole is not None) is common  # the short way is the common case's


# ---------------------------------------------------------------------- the target


@given(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=24))
def test_a_target_splits_as_urlsplit_splits_it(tail: str) -> None:
    target = "/" + tail
    try:
        parts = urlsplit(target)
    except ValueError:  # "//[": a bad IPv6 host
        with pytest.raises(ValueError):
            HttpRequest.of("GET", target, [], "127.0.0.1", [])
        return
    request = HttpRequest.of("GET", target, [], "127.0.0.1", [])
    assert (request.path, request.query) == (parts.path, parts.query)


# ---------------------------------------------------------------------- the header grammar

_H11_FIELDS = re.compile(
    rb"\r\n(" + http11._TOKEN + rb"):[ \t]*((?:" + http11._FIELD_CONTENT + rb")?)[ \t]*(?=\r\n|$)"
)
"""The header lines as h11's own grammar reads them (the fast parser's form before)."""
_LINE_BYTES = b"aZ0-_~:;/ \t\x00\x0b\x0c\r\n\x7f\x80\xff\"'"


@settings(max_examples=EXAMPLES * 20, deadline=None)
@given(st.lists(st.sampled_from(list(_LINE_BYTES)), max_size=16).map(bytes))
def test_the_fast_header_grammar_is_h11s(line: bytes) -> None:
    """A header line matches the fast parser's form exactly when it matches h11's grammar,
    with the same name and value; and in a head, a line that matches neither makes no match
    at all (so the head's matches are fewer than its lines)."""
    ours = http11._FIELDS.fullmatch(b"\r\n" + line)
    theirs = _H11_FIELDS.fullmatch(b"\r\n" + line)
    assert (ours is None) == (theirs is None) == (re.fullmatch(http11._FIELD, line) is None)
    if ours is not None and theirs is not None:
        assert ours.groups() == theirs.groups()
    head = b"GET / HTTP/1.1\r\nHost: r\r\n" + line + b"\r\nX: y"
    fields = http11._FIELDS.findall(head, head.find(b"\r\n"))
    whole = b"\r\n" not in line and theirs is not None
    assert (len(fields) == head.count(b"\r\n")) == (whole or _all_lines_match(line))


def _all_lines_match(line: bytes) -> bool:
    """Whether ``line``, split at its own line breaks, is header lines that all match."""
    return b"\r\n" in line and all(
        _H11_FIELDS.fullmatch(b"\r\n" + part) is not None for part in line.split(b"\r\n")
    )
