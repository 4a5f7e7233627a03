"""One accepted socket: HTTP/1.1, then a WebSocket or a stream after its request.

Each accepted socket gets one :class:`HttpConnection` (an ``asyncio.Protocol``).
It reads requests with an :class:`~token_relay.edge.http11.Http11` (the fast parser, and
h11 for what it leaves; h11 alone with ``--http-parser h11``), writes its responses, and
asks the :class:`~token_relay.edge.http.Gate` what to do with each one: answer it
(health, readiness, metrics, static files and every refusal), read its body for its
route, or accept the WebSocket upgrade (or start the streamed response), after which every
byte goes to a :class:`~token_relay.edge.websocket.WebSocket` (or comes from the stream).
The gate's decision carries the request's route (:mod:`token_relay.edge.routes`),
parsed once: what the connection and the relay do next is read from it.

Every plain HTTP request gets a real response: 426 with ``Upgrade: websocket``
on the WebSocket endpoints, 405 for a wrong method, 413 for a body over
``--max-body-bytes``, 404 for anything else, each with ``Connection: close``.
The socket then closes cleanly: the response is flushed, our side is shut, and
whatever the client still sends is read and dropped for a moment, so the
response is never lost to a reset. Successful responses keep the connection
alive for the next request, and so does a stream that ends normally (an AI SDK
reply, or its 204).

Requests may be pipelined: the parser pauses after a request until its response is
complete, and what arrives meanwhile waits in its buffer (the socket is not read
until then) to be read as the next request. A body route answers ``Expect:
100-continue`` with ``100 Continue`` once the head is accepted; a refused request
gets its final status instead, and its body is never read.

A request whose body is read (an HTTP producer's, as long as it streams) counts
against ``--max-connections-per-ip`` as a WebSocket does, from its head until it
is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from http import HTTPStatus
from typing import Any, Protocol, cast

from websockets.datastructures import Headers
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.typing import Origin

from ..core.errors import BadRequest, InvalidResponse
from ..core.forwarded import Network
from ..core.protocol import MAX_FRAME_HEADER
from ..core.settings import Settings
from . import routes
from .aisdk import AiSdkStream
from .aisdkproduce import AiSdkProducer
from .aisdkws import AiSdkSocket
from .durablesse import DurableSse
from .frames import frames_log
from .http import Admit, Gate, HttpRequest, ReadBody, Reply
from .http11 import CLOSED, END, MAX_HEAD_BYTES, NEED_DATA, PAUSED, Body, Head, Http11, sized_head
from .httpproducer import NDJSON, HttpProducer
from .peer import Streamed
from .sse import SseStream
from .websocket import Cork, WebSocket

__all__ = ["LINGER_SECONDS", "MAX_HEAD_BYTES", "HttpConnection", "Listener", "raw_response"]

LINGER_SECONDS = 1.0
"""How long a socket closing after a refusal keeps reading (and dropping) its input."""
_READS = (b"GET", b"HEAD")
"""Requests that only read: a half-close after one is taken as the client gone."""


@functools.lru_cache(maxsize=256)
def _sized_head(
    status: int, headers: tuple[tuple[str, str], ...], content_type: str
) -> bytes | None:
    """A reply's head up to its ``Content-Length``, its lines as
    :meth:`HttpConnection._respond` orders them (:func:`~.http11.sized_head`), built once."""
    return sized_head(status, (("Server", "token-relay"), *headers, ("Content-Type", content_type)))


class Listener(Protocol):
    """What a connection asks of the server it was accepted by
    (:class:`~token_relay.edge.server.HttpServer`)."""

    @property
    def settings(self) -> Settings:
        """The relay's settings."""

    @property
    def gate(self) -> Gate:
        """Decides each request."""

    @property
    def trusted(self) -> Sequence[Network]:
        """``--trusted-proxy``."""

    @property
    def origins(self) -> Sequence[Origin | None] | None:
        """The origins a WebSocket handshake may come from (None: any)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop it runs on."""

    @property
    def cork(self) -> Cork:
        """Write coalescing for every WebSocket."""

    @property
    def read(self) -> Callable[[ReadBody, bytes], Awaitable[Reply]]:
        """Answers a request whose route takes a body, given the whole body."""

    @property
    def produce(self) -> Callable[[ReadBody, HttpProducer], Awaitable[Reply]]:
        """Serves a producer request, whose body it is fed as it arrives."""

    @property
    def once(self) -> Callable[[ReadBody, bytes], Reply | Awaitable[Reply] | None] | None:
        """Answers a producer request given its whole body, at once (or once its broker
        has replied), or declines."""

    @property
    def takes_once(self) -> Callable[[ReadBody], bool]:
        """Whether a producer request's body is read whole first, for :attr:`once`."""

    @property
    def read_now(self) -> Callable[[ReadBody, bytes], Reply | None] | None:
        """Answers a request whose route takes a body, given the whole body, at once, or
        declines (None): :attr:`read` answers it then."""

    def admit_socket(self, connection: HttpConnection) -> str | None:
        """A new socket: None to go on, or why it is refused at once."""

    def handshake_started(self, connection: HttpConnection) -> None:
        """The socket waits for a request head."""

    def handshake_ended(self, connection: HttpConnection) -> None:
        """The socket's request head is complete, or the socket is gone."""

    def refused(self, peer: str, reason: str) -> None:
        """Count and log a socket refused before its request."""

    def upgraded(self, ws: Streamed, admit: Admit) -> None:
        """A WebSocket (or a stream) is open: serve it."""

    def stream_ended(self, peer: Streamed) -> None:
        """A WebSocket or a stream is over."""

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a handler."""

    def closed(self, connection: HttpConnection) -> None:
        """The socket is gone."""

    def is_serving(self) -> bool:
        """Whether new connections are accepted."""


class HttpConnection(asyncio.Protocol):
    """One accepted socket: HTTP requests, then possibly a WebSocket."""

    def __init__(self, server: Listener) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown"
        self.http = Http11(fast=server.settings.http_parser == "fast")
        self.ws: Streamed | None = None
        self.request: Head | None = None
        self._view_of: HttpRequest | None = None
        """The request as the gate reads it: decoded once per request."""
        self.lingering = False
        self._reading: ReadBody | None = None
        self._once = False
        """The body being read is a producer's, read whole for :attr:`Listener.once`."""
        self._producer: HttpProducer | None = None
        self._body = bytearray()
        self._received = 0
        """Bytes of the request's body so far, whatever its framing."""
        self._dropping = False
        """The body is refused: what still comes is dropped until the answer has gone."""
        self._timer: asyncio.TimerHandle | None = None
        self._heard = 0.0
        """When the deadline was set, or a producer's body last sent something."""
        self._limit = 0.0
        self._reason: str | None = None
        """Why the socket is cut if :attr:`_limit` passes from :attr:`_heard`; None: no
        deadline."""
        self._counted: str | None = None
        """The client address this request counts against, while its body is read."""
        self._gone: asyncio.Future[None] | None = None
        """Done when the socket closes, while a long-poll waits on it (:meth:`_until_gone`)."""
        self._kept_alive = False
        """A response has gone whole and the connection was kept for the next request: past
        ``--handshake-timeout`` with no byte of one, it is closed as idle, not refused."""

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        transport = self.transport
        peername = transport.get_extra_info("peername")
        self.peer = str(peername[0]) if peername else "unknown"
        refusal = self.server.admit_socket(self)
        if refusal is not None:
            status, _, reason = refusal.partition(" ")
            self.server.refused(self.peer, reason)
            transport.write(raw_response(int(status), reason))
            transport.close()
            return
        self._waiting()

    def data_received(self, data: bytes) -> None:
        ws = self.ws
        if ws is not None:
            ws.receive(data)
            return
        if self.lingering or self._dropping:
            return
        self.http.receive_data(data)
        self._serve()

    def eof_received(self) -> bool | None:
        if self.ws is not None:
            self.ws.receive_eof()
            return True
        if self._dropping:
            return True  # the answer to the refused body is still to be written
        if not self.lingering:
            self.http.receive_data(b"")
            self._serve()
            if self._owed() and self.transport is not None:
                # The response is written first, and the close, read again after it
                # (_reply), closes the socket.
                return not self.transport.is_closing()
        return None

    def _owed(self) -> bool:
        """Whether a client that closes its side now (a half-close) is still owed the
        response: its request, one that writes (not ``GET`` nor ``HEAD``), was read whole
        and is being answered. A read's close is taken as the client gone, as before: a
        long-poll then frees its place at once, and what was read can be read again."""
        request = self.request
        return self.http.answering and request is not None and request.method not in _READS

    def _serve(self) -> None:
        """Handle the requests read so far. A bug of the relay's answers 500 and closes the
        socket; its traceback is logged within the client's budget of lines, so that no
        client can flood the log by repeating a request that trips it."""
        try:
            self._next_events()
        except Exception:
            self.server.gate.refusal_log.log(
                self.peer,
                "a request from %s failed: 500 internal error",
                self.peer,
                level=logging.ERROR,
                exc_info=True,
                event="failed",
                status=500,
            )
            transport = self.transport
            if transport is not None and not transport.is_closing():
                # Unless our side is shut already (a response was sent).
                with contextlib.suppress(RuntimeError, OSError):
                    transport.write(raw_response(500, "internal error"))
                transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.server.closed(self)
        self._body_lost()
        self._uncount()
        gone = self._gone
        if gone is not None and not gone.done():
            gone.set_result(None)
        if self.ws is not None:
            self.server.gate.release(self.ws)
            self.ws.lost()

    def pause_writing(self) -> None:
        if self.ws is not None:
            self.ws.pause_writing()

    def resume_writing(self) -> None:
        if self.ws is not None:
            self.ws.resume_writing()

    # ------------------------------------------------------------------ HTTP

    def _waiting(self) -> None:
        """Start (again) to wait for a request head, within ``--handshake-timeout``."""
        self.server.handshake_started(self)
        self._deadline(self.server.settings.handshake_timeout, "handshake timeout")

    def _head_done(self) -> None:
        self.server.handshake_ended(self)
        self._no_deadline()

    def _deadline(self, seconds: float, reason: str) -> None:
        """Cut the socket unless what it waits for comes within ``seconds``. For a
        producer's body the deadline moves on with every chunk (:attr:`_heard`). One timer
        serves them all: one that fires before the deadline (set for an earlier one) finds
        time left and waits again, so a kept-alive socket arms no timer per request."""
        loop = self.server.loop
        now = self._heard = loop.time()
        self._limit, self._reason = seconds, reason
        timer = self._timer
        if timer is None or timer.when() > now + seconds:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(now + seconds, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self._reason is None:
            return  # what it waited for came
        loop = self.server.loop
        silent = loop.time() - self._heard
        if silent < self._limit:
            self._timer = loop.call_later(self._limit - silent, self._expire)
            return
        if self._kept_alive and self.request is None and not self.http.pending:
            # Idle since its last response, nothing asked: closed as any server closes an
            # idle kept-alive connection, neither logged nor counted as a refusal.
            self.transport_close()
            return
        self.server.refused(self.peer, self._reason)
        self.abort()

    def _no_deadline(self) -> None:
        self._reason = None  # the timer, if one is set, finds nothing to do

    def _next_events(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        http = self.http
        while self.ws is None and not self.lingering and not self._dropping:
            try:
                event = http.next_event()
            except BadRequest as exc:
                self._head_done()
                self._body_lost()
                self._respond(Reply.text(exc.status, f"bad request: {exc}"), None)
                return
            if isinstance(event, Body):
                # Every body is bounded as it streams, whatever its framing.
                data = event.data
                limit = self.server.settings.max_body_bytes
                room = limit - self._received
                self._received += len(data)
                if self._producer is not None:
                    self._producer.feed(bytes(data if room >= len(data) else data[:room]))
                    self._heard = self.server.loop.time()
                elif self._reading is not None:
                    self._body += data
                if self._received > limit:
                    self._too_large(f"request body over {limit} bytes")
                    return
            elif event is END:
                if self._producer is not None:
                    self._no_deadline()
                    self._producer.end()
                    self._producer = None
                    return
                request = self.request
                reading, self._reading = self._reading, None
                if request is not None and reading is not None:
                    self._no_deadline()
                    if self._once:
                        self._once = False
                        # On the loop's next pass, not within this read: the reads of one
                        # pass, then their answers, as for a task (answering inside the
                        # read measured 15% slower under load: smaller batches per poll).
                        body = bytes(self._body)
                        self.server.loop.call_soon(self._produce_whole, request, reading, body)
                        return
                    self._spawn_body(request, reading, bytes(self._body))
                    return
                if request is not None:
                    self._answer(request)
            elif isinstance(event, Head):
                self._head_done()
                self.request = event
                self._view_of = None
                self._received = 0
                if event.size > MAX_HEAD_BYTES:
                    # h11 bounds a head that arrives in pieces; this, one that came whole.
                    reply = self.server.gate.refuse(
                        self._view(event), 431, f"request head over {MAX_HEAD_BYTES} bytes"
                    )
                    self._respond(reply, None)
                    return
                if event.has_body:
                    decision = self._body_route(event)
                    if isinstance(decision, Reply):
                        # Answered at once: the body is never read.
                        self._respond(decision, event)
                        return
                    if http.waiting_for_100_continue:
                        # The client holds its body back until it is asked for it.
                        self._write(http.continue_100())
                    self._count(decision.request.client)
                    settings = self.server.settings
                    if (
                        decision.stream
                        and event.length is not None
                        and self.server.once is not None
                        and self.server.takes_once(decision)
                    ):
                        # Perhaps a one-shot message: its body is read whole first.
                        whole = http.whole_body()
                        if whole is not None:  # here already, as it mostly is
                            self._received = len(whole)
                            self.server.loop.call_soon(self._produce_whole, event, decision, whole)
                            return
                        self._reading, self._body, self._once = decision, bytearray(), True
                        self._deadline(settings.idle_timeout, "request body stalled")
                        continue
                    if decision.stream:
                        self._produce(event, decision)
                        # A producer's body that sends nothing for --idle-timeout is cut
                        # (its messages abort as any idle message does).
                        self._deadline(self.server.settings.idle_timeout, "request body stalled")
                        continue
                    whole = http.whole_body()
                    if whole is not None:  # here already, as it mostly is
                        self._received = len(whole)
                        self._spawn_body(event, decision, whole)
                        return
                    self._reading, self._body = decision, bytearray()
                    self._deadline(self.server.settings.handshake_timeout, "handshake timeout")
            elif event is NEED_DATA:
                return
            elif event is PAUSED:
                # A next request (pipelined) waits in the parser's buffer until this one is
                # answered (:meth:`_next_cycle`); the socket is not read meanwhile.
                self._hold()
                return
            elif event is CLOSED:
                if not self._owed():  # else closed once the response is written
                    self.transport_close()
                return

    def _body_lost(self) -> None:
        """The body died in mid-request (its socket is gone, or its framing broke): its
        producer ends now, not at ``--idle-timeout``."""
        if self._producer is not None:
            self._producer.lost()
            self._producer = None

    def _too_large(self, refusal: str) -> None:
        """A body passed ``--max-body-bytes``: 413 at once, and nothing more of it is read."""
        producer, reading = self._producer, self._reading
        self._producer = self._reading = None
        self._body = bytearray()
        if producer is not None:
            # Its producer answers: the lines that came whole before the limit were applied.
            # The refusal is logged and counted as any other (its reply is the producer's).
            if self.request is not None:
                self.server.gate.refuse(self._view(self.request), 413, refusal)
            self._no_deadline()
            self._dropping = True
            producer.refuse(f"{refusal}; the rest of it was not read")
        elif reading is not None:
            self._respond(self.server.gate.refuse(reading.request, 413, refusal), None)

    def _answer(self, request: Head) -> None:
        decision = self.server.gate.route(self._view(request))
        if isinstance(decision, ReadBody):
            self._count(decision.request.client)
        if isinstance(decision, ReadBody) and decision.stream:
            self._produce(request, decision)
            if self._producer is not None:
                self._producer.end()  # a body of nothing
                self._producer = None
        elif isinstance(decision, ReadBody):
            self._spawn_body(request, decision, b"")  # it takes a body, and got none
        elif isinstance(decision, Reply):
            self._respond(decision, request)
        elif decision.streamed:
            self._stream(decision)
        else:
            self._upgrade(request, decision)

    def _count(self, client: str) -> None:
        """Count this request against its client's address until it is answered."""
        if self._counted is None:
            self._counted = client
            self.server.gate.count(client)

    def _uncount(self) -> None:
        if self._counted is not None:
            self.server.gate.uncount(self._counted)
            self._counted = None

    def _body_route(self, request: Head) -> Reply | ReadBody:
        """A request with a body: read it for a route that takes one, else refuse it
        (413 past ``--max-body-bytes``) without reading it."""
        view = self._view(request)
        length = request.length
        limit = self.server.settings.max_body_bytes
        gate = self.server.gate
        if length is not None and length > limit:
            return gate.refuse(view, 413, f"request body over {limit} bytes")
        decision = gate.route(view)
        if isinstance(decision, ReadBody):
            return decision
        if isinstance(decision, Admit):
            return gate.refuse(view, 400, "a WebSocket handshake or stream has no body")
        if decision.status < 400:
            return gate.refuse(view, 405, f"{view.path} takes no body", (("Allow", "GET, HEAD"),))
        return decision

    def _produce(self, request: Head, reading: ReadBody) -> None:
        """A producer request: its body's events are applied as they arrive."""
        assert self.transport is not None
        settings = self.server.settings
        route = reading.route
        producer: HttpProducer
        if isinstance(route, routes.AiSdkProduce):
            producer = AiSdkProducer(
                self.transport,
                path=reading.request.target,
                client=reading.request.client,
                grant=reading.grant,
                channel=route.channel,
                wanted=route.wanted,
                max_line=settings.max_frame_bytes,
            )
        else:
            producer = HttpProducer(
                self.transport,
                path=reading.request.target,
                client=reading.request.client,
                grant=reading.grant,
                ndjson=reading.request.media_type == NDJSON,
                named=isinstance(route, routes.HttpProduce) and route.named,
                max_line=settings.max_frame_bytes,
            )
        self._producer = producer
        self._answer_later(request, reading, self.server.produce(reading, producer))

    def _produce_whole(self, request: Head, reading: ReadBody, body: bytes) -> None:
        """A producer request whose whole body is here: answered at once, with no task, if
        it is a one-shot message; else served as any producer request, fed the body whole.
        Either way its message is applied even if the socket is gone meanwhile, as a body
        that came whole always is."""
        once = self.server.once
        reply = None if once is None else once(reading, body)
        if reply is None:
            self._produce(request, reading)
            producer, self._producer = self._producer, None
            if producer is not None:
                producer.feed(body)
                producer.end()
            return
        if not isinstance(reply, Reply):  # answered once its broker has replied
            self._answer_later(request, reading, reply)
            return
        self._reply(request, reading, reply)

    def _spawn_body(self, request: Head, reading: ReadBody, body: bytes) -> None:
        """Hand a whole body to its route, and answer with what it returns: on the loop's
        next pass, as a task would (the reads of a pass, then their answers), with no task
        if the route answers at once."""
        route = reading.route
        if (
            self.server.read_now is not None
            and isinstance(route, routes.StreamRequest)
            and route.method == "POST"
        ):  # perhaps an append that is answered at once
            self.server.loop.call_soon(self._read_whole, request, reading, body)
        else:
            if isinstance(route, routes.StreamRequest) and route.live == "long-poll":
                reading = self._until_gone(reading)
            self._answer_later(request, reading, self.server.read(reading, body))

    def _until_gone(self, reading: ReadBody) -> ReadBody:
        """A long-poll, told when its client goes (:attr:`ReadBody.gone`): it stops
        waiting then, rather than at ``--long-poll-timeout``, and holds nothing more."""
        gone = self._gone = self.server.loop.create_future()
        return ReadBody(reading.request, reading.route, reading.grant, reading.headers, gone)

    def _read_whole(self, request: Head, reading: ReadBody, body: bytes) -> None:
        """A request whose whole body is here: answered at once if its route can; else as
        any, from a task. Either way it is served even if the socket is gone meanwhile, as
        a body that came whole always is."""
        read_now = self.server.read_now
        reply = None if read_now is None else read_now(reading, body)
        if reply is None:
            self._answer_later(request, reading, self.server.read(reading, body))
            return
        self._reply(request, reading, reply)

    def _answer_later(self, request: Head, reading: ReadBody, replying: Awaitable[Reply]) -> None:
        """Answer the request with its route's reply once it comes (if the socket is open)."""

        async def answer() -> None:
            self._reply(request, reading, await replying)

        self.server.spawn(answer())

    def _reply(self, request: Head, reading: ReadBody, reply: Reply) -> None:
        """Answer a request whose body was read with its route's reply (if the socket is
        open), then go on to the request pipelined behind it."""
        if reading.headers:
            # Built directly: dataclasses.replace costs three times as much.
            headers = reply.headers + reading.headers
            reply = Reply(reply.status, reply.body, reply.content_type, headers)
        if self.transport is not None and not self.transport.is_closing() and not self.lingering:
            # (lingering: the request was answered already, a 400 for its broken body)
            self._respond(reply, request, read=True)
        self._dropping = False
        self._gone = None
        if self.http.pending:
            self._serve()  # a request pipelined behind this one, or the client's close

    def _view(self, request: Head) -> HttpRequest:
        """The request as the gate reads it, decoded once (for its head in this cycle)."""
        view = self._view_of
        if view is None or request is not self.request:
            view = HttpRequest.of(
                request.method.decode("latin-1"),
                request.target.decode("latin-1"),
                [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers],
                self.peer,
                self.server.trusted,
                lowered=True,  # a head's names are (Head.headers)
            )
            if request is self.request:
                self._view_of = view
        return view

    def _upgrade(self, request: Head, admit: Admit) -> None:
        """websockets checks the handshake itself (key, version, ``Origin``) and answers it."""
        assert self.transport is not None
        headers = Headers(
            (name.decode("latin-1"), value.decode("latin-1")) for name, value in request.raw_headers
        )
        handshake = ServerProtocol(origins=self.server.origins, logger=frames_log)
        response = handshake.accept(Request(admit.request.target, headers))
        if response.status_code != 101:
            extra = tuple(
                (k, v) for k, v in response.headers.raw_items() if k.lower() in {"upgrade", "allow"}
            )
            reason = (response.body or b"").decode(errors="replace").strip()
            reply = self.server.gate.refuse(admit.request, response.status_code, reason, extra)
            self._respond(reply, request)
            return
        settings = self.server.settings
        # The largest frame the relay reads (1009 past it), for clients that cut what they
        # send to fit (RelayProducer does).
        response.headers[MAX_FRAME_HEADER] = str(settings.max_frame_bytes)
        kind = AiSdkSocket if isinstance(admit.route, routes.AiSdkSocket) else WebSocket
        self.ws = kind(
            self.transport,
            path=admit.request.target,
            client=admit.request.client,
            grant=admit.grant,
            max_size=settings.max_frame_bytes,
            max_unsent=settings.max_subscriber_buffer_bytes,
            cork=self.server.cork,
        )
        # Counted now, in the same step as the decision: a burst of handshakes from one
        # address can't all pass --max-connections-per-ip before any is counted.
        self.server.gate.admit(self.ws)
        self.transport.write(response.serialize())
        trailing = self.http.trailing_data
        self.server.upgraded(self.ws, admit)
        if trailing:
            self.ws.receive(trailing)

    def _stream(self, admit: Admit) -> None:
        """Start an SSE response; every frame from now on is written by the stream."""
        assert self.transport is not None
        request, route = admit.request, admit.route
        stream: SseStream
        if isinstance(route, routes.StreamRequest):
            stream = DurableSse(
                self.transport,
                self.http,
                path=request.target,
                client=request.client,
                grant=admit.grant,
                positions={},
                headers=admit.headers,
            )
        elif isinstance(route, routes.AiSdkStream):
            stream = AiSdkStream(
                self.transport,
                self.http,
                route,
                path=request.target,
                client=request.client,
                grant=admit.grant,
                headers=admit.headers,
            )
        else:
            stream = SseStream(
                self.transport,
                self.http,
                path=request.target,
                client=request.client,
                grant=admit.grant,
                positions=admit.positions,
                headers=admit.headers,
            )
        self.ws = stream
        stream.completed = self._stream_completed
        self.server.gate.admit(stream)
        stream.start()
        self.server.upgraded(stream, admit)

    def _respond(self, reply: Reply, request: Head | None, *, read: bool = False) -> None:
        """Send a plain HTTP response; keep the connection for the next one, or close it."""
        transport = self.transport
        assert transport is not None
        self._uncount()
        # A reply given before its body ended (Stop of an AI SDK producer) closes the
        # connection: the rest of the body is read and dropped meanwhile.
        keep = (
            reply.status < 400
            and request is not None
            and (read or not request.has_body)
            and self._producer is None
        )
        http = self.http
        try:
            sized = None
            if keep and reply.status == 204 and not reply.body:  # an append's, mostly
                sized = http.no_content((("Server", "token-relay"), *reply.headers))
            elif keep:  # the common case, its head up to its length built once
                head = _sized_head(reply.status, reply.headers, reply.content_type)
                sized = None if head is None else http.sized(head, reply.body)
            if sized is not None:
                data = sized
            else:
                headers = [("Server", "token-relay"), *reply.headers]
                if reply.status != 204:  # a 204 has neither a body nor a length
                    headers += [
                        ("Content-Type", reply.content_type),
                        ("Content-Length", str(len(reply.body))),
                    ]
                if not keep:
                    headers.append(("Connection", "close"))
                data = http.respond(reply.status, headers)
                head_only = request is not None and request.method == b"HEAD"
                if reply.body and not head_only:
                    data += http.body(reply.body)
                data += http.end()
        except InvalidResponse:
            data = raw_response(reply.status, reply.body.decode(errors="replace"))
            keep = False
        transport.write(data)
        if keep and self._next_cycle():
            return
        self._linger()

    def _next_cycle(self) -> bool:
        """After a whole response on a connection kept alive: wait for the next request
        (one already here is read by the next :meth:`_next_events`). False if the
        connection can't go on."""
        if not self.http.start_next_cycle():
            return False
        self.request = None
        self._view_of = None
        self._kept_alive = True
        self._waiting()
        assert self.transport is not None
        self.transport.resume_reading()
        return True

    def _hold(self) -> None:
        """Stop reading while a request is being answered: what a client pipelines meanwhile
        stays in the kernel, not in our memory."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def _stream_completed(self, stream: Streamed) -> None:
        """A streamed response is complete, and its connection was kept alive: the socket
        is this connection's again, for the next request."""
        if self.ws is not stream:
            return
        self.ws = None
        self.server.stream_ended(stream)
        self.server.gate.release(stream)
        if self.server.is_serving() and self._next_cycle():
            # Not now: the stream may have ended inside a fan-out, or in its handler.
            self.server.loop.call_soon(self._serve)
        else:
            self.transport_close()

    def _write(self, data: bytes | None) -> None:
        if data and self.transport is not None:
            self.transport.write(data)

    def _linger(self) -> None:
        """Close after a response without losing it: shut our side, drop what comes, close."""
        transport = self.transport
        assert transport is not None
        self.lingering = True
        self._head_done()
        transport.resume_reading()  # held while it was answered: now read and dropped
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # the peer is gone already (it reset the response it was sent)
                transport.abort()
                return
        self.server.loop.call_later(LINGER_SECONDS, self.transport_close)

    def transport_close(self) -> None:
        """Close the socket once what is written has gone."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        """Cut the socket now."""
        if self.transport is not None:
            self.transport.abort()


def raw_response(status: int, reason: str) -> bytes:
    body = (reason + "\n").encode()
    phrase = HTTPStatus(status).phrase
    return (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nServer: token-relay\r\n\r\n"
    ).encode() + body
