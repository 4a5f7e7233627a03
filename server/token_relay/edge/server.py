"""The listening socket: HTTP/1.1 with h11, then WebSocket after an upgrade.

Each accepted socket gets one :class:`HttpConnection` (an ``asyncio.Protocol``).
It parses requests with h11 and asks the :class:`~token_relay.edge.http.Gate`
what to do with each one: answer it (health, readiness, metrics, static files
and every refusal), or accept the WebSocket upgrade, after which every byte goes
to a :class:`~token_relay.edge.websocket.WebSocket`.

Every plain HTTP request gets a real response: 426 with ``Upgrade: websocket``
on the WebSocket endpoints, 405 for a wrong method, 413 for a body over
``--max-body-bytes``, 404 for anything else, each with ``Connection: close``.
The socket then closes cleanly: the response is flushed, our side is shut, and
whatever the client still sends is read and dropped for a moment, so the
response is never lost to a reset. Successful responses keep the connection
alive for the next request, and so does a stream that ends normally (an AI SDK
reply, or its 204).

Requests may be pipelined: h11 pauses after a request until its response is
complete, and what arrives meanwhile waits in its buffer (the socket is not read
until then) to be read as the next request. A body route answers ``Expect:
100-continue`` with ``100 Continue`` once the head is accepted; a refused request
gets its final status instead, and its body is never read.

Handshakes
----------
A socket is *handshaking* from its accept until its request head is complete
(and again while it idles between keep-alive requests). Handshakes are bounded:

* ``--handshake-timeout``: a request head that takes longer is cut.
* ``--max-handshakes``: past this many in flight, the *oldest* is cut, so a
  slow trickle of heads (slowloris) never shuts out a real client.
* ``--max-handshakes-per-ip``: one client address past this many gets 429 at
  once. A ``--trusted-proxy`` peer is exempt: it sends whole heads.
* File descriptors: when open sockets come within :data:`FD_RESERVE` of the
  process's limit (``ulimit -n``), a new socket is let in only by cutting one of
  the address holding the most sockets (by peer address: a trusted proxy's
  sockets are all its own): its oldest handshake, or if it has none, its oldest
  socket, unless the newcomer is from that address itself (or one holding about
  as many); otherwise the newcomer gets 503 at once. One address never shuts
  out another, and the listening socket never runs into ``EMFILE``.

A request whose body is read (an HTTP producer's, as long as it streams) counts
against ``--max-connections-per-ip`` as a WebSocket does, from its head until it
is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import resource
import socket
from collections.abc import Awaitable, Callable, Coroutine
from http import HTTPStatus
from typing import Any, cast

import h11
from websockets.datastructures import Headers
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.typing import Origin

from ..core.forwarded import is_trusted, parse_networks
from ..core.settings import Settings
from .aisdk import AiSdkStream
from .frames import frames_log
from .http import Admit, Gate, HttpRequest, ReadBody, Reply, query_of
from .httpproducer import NDJSON, HttpProducer
from .metrics import Metrics
from .peer import Streamed
from .sse import SseStream
from .websocket import Cork, WebSocket

__all__ = ["FD_RESERVE", "HttpConnection", "HttpServer"]

log = logging.getLogger("token_relay")

FD_RESERVE = 128
"""File descriptors kept free for everything but client sockets (Redis, logs, files)."""

ACCEPT_BURST = 64
"""Sockets accepted in one go, before the loop turns."""

LISTEN_BACKLOG = 4096
"""Connections the kernel queues for accepting (capped by ``net.core.somaxconn``)."""

LINGER_SECONDS = 1.0
"""How long a socket closing after a refusal keeps reading (and dropping) its input."""

MAX_HEAD_BYTES = 16 * 1024
"""A bigger request line and headers get 431."""

Handler = Callable[[Streamed], Coroutine[Any, Any, None]]
BodyHandler = Callable[[ReadBody, bytes], Awaitable[Reply]]
ProduceHandler = Callable[[ReadBody, HttpProducer], Awaitable[Reply]]


SWEEP_SLICES = 64
"""The slices a sweep over every peer (keepalive pings, SSE heartbeats) is spread over: a
pass of the event loop visits a 64th of the peers, not all of them at once (a sweep of
10,000 sockets at once held every other message back by a few hundred milliseconds)."""


class HttpServer:
    """The listening socket and every connection on it."""

    def __init__(
        self,
        settings: Settings,
        gate: Gate,
        metrics: Metrics,
        handler: Handler,
        read: BodyHandler,
        produce: ProduceHandler,
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.metrics = metrics
        self.handler = handler
        self.read = read
        """Answers a request whose route takes a body, given the whole body."""
        self.produce = produce
        """Serves a producer request, whose body it is fed as it arrives."""
        origins = settings.allowed_origins
        self.origins: list[Origin | None] | None = (
            [*(Origin(origin) for origin in origins), None] if origins else None
        )
        self.trusted = parse_networks(settings.trusted_proxies)
        self.open: set[HttpConnection] = set()
        self.handshaking: dict[HttpConnection, None] = {}
        """Sockets whose request head is not complete yet, oldest first."""
        self.handshaking_per_address: dict[str, int] = {}
        self.by_address: dict[str, dict[HttpConnection, None]] = {}
        """Open sockets by peer address, oldest first: whom the descriptor guard cuts."""
        self.connections: set[Streamed] = set()
        """Open WebSocket connections and SSE streams."""
        self._slices: list[set[Streamed]] = [set() for _ in range(SWEEP_SLICES)]
        """The same peers, each in the slice of the sweeps it is visited in (:meth:`_every`)."""
        self.fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.sockets_open = 0
        """Accepted sockets not yet closed: what counts against the descriptor limit."""
        self._listening: list[socket.socket] = []
        self._serving = False
        self._closed = asyncio.Event()
        self._accepting: set[asyncio.Task[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self.cork = Cork(asyncio.get_running_loop())
        """Write coalescing for every WebSocket of this server."""

    async def start(self) -> None:
        """Listen on ``--host``/``--port``."""
        settings = self.settings
        infos = socket.getaddrinfo(
            settings.host, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        seen: set[tuple[int, Any]] = set()
        for family, _, _, _, address in infos:
            if (family, address) in seen or (settings.port == 0 and self._listening):
                continue  # port 0: one free port on the first address
            seen.add((family, address))
            sock = socket.create_server(
                address[:2],
                family=family,
                backlog=LISTEN_BACKLOG,
                reuse_port=settings.workers > 1,
            )
            sock.setblocking(False)
            self._listening.append(sock)
        loop = asyncio.get_running_loop()
        for sock in self._listening:
            loop.add_reader(sock.fileno(), self._accept, sock)
        self._serving = True
        settings = self.settings
        self._sweeper = asyncio.create_task(self._every(settings.ping_interval, self._keepalive))
        self._heartbeat = asyncio.create_task(
            self._every(settings.sse_heartbeat, self._sse_heartbeat)
        )

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        """The listening sockets."""
        return tuple(self._listening)

    @property
    def port(self) -> int:
        """The port listened on."""
        return int(self._listening[0].getsockname()[1])

    def is_serving(self) -> bool:
        """Whether new connections are accepted."""
        return self._serving

    def close(self) -> None:
        """Stop accepting, and close every socket that is not a WebSocket."""
        self._closed.set()
        if self._serving:
            self._serving = False
            loop = asyncio.get_running_loop()
            for sock in self._listening:
                loop.remove_reader(sock.fileno())
                sock.close()
        for connection in list(self.open):
            if connection.ws is None:
                connection.transport_close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._heartbeat is not None:
            self._heartbeat.cancel()

    async def wait_closed(self) -> None:
        """Wait until the server is closed and every handler is done."""
        await self._closed.wait()
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    # ------------------------------------------------------------------ accepting

    def _accept(self, sock: socket.socket) -> None:
        """Accept what is waiting, a few at a time, never past the descriptors left."""
        loop = asyncio.get_running_loop()
        for _ in range(ACCEPT_BURST):
            # Near the limit a socket is still accepted (from the reserve) to see whose it
            # is: room is made for it from the address holding the most, or it gets 503.
            low = self.sockets_open + FD_RESERVE >= self.fd_limit
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: out of room for now
                log.warning("cannot accept a connection: %s; trying again in 1 s", exc)
                self._pause(sock, 1.0)
                return
            if low and not self._make_room(str(address[0])):
                self.refused(str(address[0]), "file descriptors low")
                with contextlib.suppress(OSError):
                    conn.send(_raw_response(503, "out of file descriptors; try again later"))
                conn.close()
                continue
            conn.setblocking(False)
            self.sockets_open += 1
            task = loop.create_task(self._connect(conn))
            self._accepting.add(task)
            task.add_done_callback(self._accepting.discard)
            if low:
                # The cut socket's descriptor is freed on the loop's next turn.
                self._pause(sock, 0.0)
                return

    async def _connect(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(lambda: HttpConnection(self), conn)
        except OSError:
            self.sockets_open -= 1  # it went away before its transport was made
            conn.close()

    def _pause(self, sock: socket.socket, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(sock.fileno())

        def resume() -> None:
            if self._serving:
                loop.add_reader(sock.fileno(), self._accept, sock)

        if seconds:
            loop.call_later(seconds, resume)
        else:
            loop.call_soon(resume)

    # ------------------------------------------------------------------ bookkeeping

    def admit_socket(self, connection: HttpConnection) -> str | None:
        """A new socket: None to go on, or why it is refused at once."""
        peer = connection.peer
        exempt = is_trusted(peer, self.trusted)
        if not exempt and (
            self.handshaking_per_address.get(peer, 0) >= self.settings.max_handshakes_per_ip
        ):
            return "429 too many handshakes in flight from this address"
        if len(self.handshaking) >= self.settings.max_handshakes:
            self._cut_oldest_handshake("too many handshakes in flight")
        self.open.add(connection)
        self.by_address.setdefault(peer, {})[connection] = None
        return None

    def handshake_started(self, connection: HttpConnection) -> None:
        """The socket waits for a request head."""
        if connection in self.handshaking:
            return
        self.handshaking[connection] = None
        peer = connection.peer
        self.handshaking_per_address[peer] = self.handshaking_per_address.get(peer, 0) + 1
        self.metrics.handshakes.set(len(self.handshaking))

    def handshake_ended(self, connection: HttpConnection) -> None:
        """The socket's request head is complete, or the socket is gone."""
        if self.handshaking.pop(connection, 0) is None:
            peer = connection.peer
            left = self.handshaking_per_address.get(peer, 1) - 1
            if left > 0:
                self.handshaking_per_address[peer] = left
            else:
                self.handshaking_per_address.pop(peer, None)
            self.metrics.handshakes.set(len(self.handshaking))

    def _make_room(self, newcomer: str) -> bool:
        """Out of descriptors: cut a socket of the address holding the most, its oldest
        handshake if it has one in flight, else (for a ``newcomer`` from an address that
        holds fewer) its oldest socket. False if there is nothing to cut."""
        top = max(self.by_address, key=lambda address: len(self.by_address[address]), default="")
        held = self.by_address.get(top, {})
        victim = next((c for c in held if c in self.handshaking), None)
        if victim is not None:
            self.refused(top, "file descriptors low")
            self.handshake_ended(victim)
        elif held and top != newcomer and len(held) > len(self.by_address.get(newcomer, {})) + 1:
            victim = next(iter(held))
            self.refused(top, "file descriptors low: cut the address holding the most")
        else:
            return False
        self._forget(victim)
        victim.abort()
        return True

    def _forget(self, connection: HttpConnection) -> None:
        held = self.by_address.get(connection.peer)
        if held is not None and held.pop(connection, 0) is None and not held:
            del self.by_address[connection.peer]

    def _cut_oldest_handshake(self, reason: str) -> bool:
        oldest = next(iter(self.handshaking), None)
        if oldest is None:
            return False
        self.refused(oldest.peer, reason)
        self.handshake_ended(oldest)
        oldest.abort()
        return True

    def refused(self, peer: str, reason: str) -> None:
        """Count a socket refused before its request, and log it within its address's
        budget of lines (a flood would otherwise be a flood of log lines)."""
        self.metrics.sockets_refused.labels(reason).inc()
        self.gate.refusal_log.log(
            peer, "refused a socket from %s: %s", peer, reason, level=logging.WARNING, reason=reason
        )

    def upgraded(self, ws: Streamed) -> None:
        """A WebSocket (or an SSE stream) is open: serve it."""
        self.connections.add(ws)
        self._slice(ws).add(ws)
        self.spawn(self.handler(ws))

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a handler; :meth:`wait_closed` waits for it."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def closed(self, connection: HttpConnection) -> None:
        """The socket is gone."""
        self.sockets_open -= 1
        self.open.discard(connection)
        self._forget(connection)
        self.handshake_ended(connection)
        if connection.ws is not None:
            self.stream_ended(connection.ws)

    def stream_ended(self, peer: Streamed) -> None:
        """A WebSocket or a stream is over (its socket may serve another request)."""
        self.connections.discard(peer)
        self._slice(peer).discard(peer)

    def _slice(self, peer: Streamed) -> set[Streamed]:
        """The slice of the sweeps a peer is visited in, for as long as it is open."""
        return self._slices[peer.id.int % SWEEP_SLICES]

    async def _every(self, interval: float, visit: Callable[[Streamed], None]) -> None:
        """Call ``visit`` on every open peer once each ``interval`` seconds, spread over it:
        one slice of the peers every ``interval / SWEEP_SLICES`` seconds, each peer in the
        same slice every time, so each is visited exactly ``interval`` apart."""
        loop = asyncio.get_running_loop()
        tick, due = interval / SWEEP_SLICES, loop.time()
        while True:
            for peers in self._slices:
                due += tick
                await asyncio.sleep(max(0.0, due - loop.time()))
                for peer in list(peers):
                    visit(peer)

    @staticmethod
    def _keepalive(peer: Streamed) -> None:
        """Ping a WebSocket peer; cut one that stayed silent since the last ping."""
        if isinstance(peer, SseStream):
            return  # a stream's client sends nothing; its heartbeat is its own
        if not peer.heard:
            log.info("cutting %s (%s): no answer to a ping", peer.client, peer.id)
            peer.abort()
        else:
            peer.heard = False
            peer.ping()

    @staticmethod
    def _sse_heartbeat(peer: Streamed) -> None:
        """A comment line on an SSE stream, so proxies keep it open."""
        if isinstance(peer, SseStream):
            peer.ping()


class HttpConnection(asyncio.Protocol):
    """One accepted socket: HTTP requests, then possibly a WebSocket."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown"
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.ws: Streamed | None = None
        self.request: h11.Request | None = None
        self.lingering = False
        self._reading: ReadBody | None = None
        self._producer: HttpProducer | None = None
        self._body = bytearray()
        self._received = 0
        """Bytes of the request's body so far, whatever its framing."""
        self._dropping = False
        """The body is refused: what still comes is dropped until the answer has gone."""
        self._timer: asyncio.TimerHandle | None = None
        self._heard = 0.0
        self._counted: str | None = None
        """The client address this request counts against, while its body is read."""

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
            transport.write(_raw_response(int(status), reason))
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
        self.h11.receive_data(data)
        self._serve()

    def eof_received(self) -> bool | None:
        if self.ws is not None:
            self.ws.receive_eof()
            return True
        if self._dropping:
            return True  # the answer to the refused body is still to be written
        if not self.lingering:
            self.h11.receive_data(b"")
            self._serve()
        return None

    def _serve(self) -> None:
        """Handle the requests h11 has read. A bug of the relay's answers 500 and closes the
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
                    transport.write(_raw_response(500, "internal error"))
                transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.server.closed(self)
        self._body_lost()
        self._uncount()
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
        producer's body the deadline moves on with every chunk (:attr:`_heard`): one timer
        per request, not one per chunk."""
        self._no_deadline()
        loop = asyncio.get_running_loop()
        self._heard = loop.time()

        def expire() -> None:
            silent = loop.time() - self._heard
            if self._producer is not None and silent < seconds:
                self._timer = loop.call_later(seconds - silent, expire)  # it spoke since
                return
            self._timer = None
            self.server.refused(self.peer, reason)
            self.abort()

        self._timer = loop.call_later(seconds, expire)

    def _no_deadline(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _next_events(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        conn = self.h11
        while self.ws is None and not self.lingering and not self._dropping:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._head_done()
                self._body_lost()
                self._respond(Reply.text(exc.error_status_hint, f"bad request: {exc}"), None)
                return
            if event is h11.NEED_DATA:
                return
            if event is h11.PAUSED:
                # A next request (pipelined) waits in h11's buffer until this one is
                # answered (:meth:`_next_cycle`); the socket is not read meanwhile.
                self._hold()
                return
            if isinstance(event, h11.Request):
                self._head_done()
                self.request = event
                self._received = 0
                if _head_size(event) > MAX_HEAD_BYTES:
                    # h11 bounds a head that arrives in pieces; this, one that came whole.
                    reply = self.server.gate.refuse(
                        self._view(event), 431, f"request head over {MAX_HEAD_BYTES} bytes"
                    )
                    self._respond(reply, None)
                    return
                if _has_body(event):
                    decision = self._body_route(event)
                    if isinstance(decision, Reply):
                        # Answered at once: the body is never read.
                        self._respond(decision, event)
                        return
                    if conn.they_are_waiting_for_100_continue:
                        # The client holds its body back until it is asked for it.
                        go_on = h11.InformationalResponse(status_code=100, headers=[])
                        self._write(conn.send(go_on))
                    self._count(decision.request.client)
                    if decision.stream:
                        self._produce(event, decision)
                        # A producer's body that sends nothing for --idle-timeout is cut
                        # (its messages abort as any idle message does).
                        self._deadline(self.server.settings.idle_timeout, "request body stalled")
                        continue
                    self._reading, self._body = decision, bytearray()
                    self._deadline(self.server.settings.handshake_timeout, "handshake timeout")
            elif isinstance(event, h11.Data):
                # Every body is bounded as it streams, whatever its framing.
                limit = self.server.settings.max_body_bytes
                room = limit - self._received
                self._received += len(event.data)
                if self._producer is not None:
                    data = event.data if room >= len(event.data) else event.data[:room]
                    self._producer.feed(bytes(data))
                    self._heard = asyncio.get_running_loop().time()
                elif self._reading is not None:
                    self._body += event.data
                if self._received > limit:
                    self._too_large(f"request body over {limit} bytes")
                    return
            elif isinstance(event, h11.EndOfMessage):
                if self._producer is not None:
                    self._no_deadline()
                    self._producer.end()
                    self._producer = None
                    return
                request = self.request
                reading, self._reading = self._reading, None
                if request is not None and reading is not None:
                    self._no_deadline()
                    self._spawn_body(request, reading, bytes(self._body))
                    return
                if request is not None:
                    self._answer(request)
            elif isinstance(event, h11.ConnectionClosed):
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

    def _answer(self, request: h11.Request) -> None:
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
        elif decision.positions is not None:
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

    def _body_route(self, request: h11.Request) -> Reply | ReadBody:
        """A request with a body: read it for a route that takes one, else refuse it
        (413 past ``--max-body-bytes``) without reading it."""
        view = self._view(request)
        length = _content_length(request)
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

    def _produce(self, request: h11.Request, reading: ReadBody) -> None:
        """A producer request: its body's events are applied as they arrive."""
        assert self.transport is not None
        settings = self.server.settings
        content_type = reading.request.header("content-type").split(";")[0].strip().lower()
        producer = HttpProducer(
            self.transport,
            path=reading.request.target,
            client=reading.request.client,
            grant=reading.grant,
            ndjson=content_type == NDJSON,
            named=bool(query_of(reading.request.target).get("producer", [""])[-1]),
            max_line=settings.max_frame_bytes,
        )
        self._producer = producer
        self._answer_later(request, reading, self.server.produce(reading, producer))

    def _spawn_body(self, request: h11.Request, reading: ReadBody, body: bytes) -> None:
        """Hand a whole body to its route, and answer with what it returns."""
        self._answer_later(request, reading, self.server.read(reading, body))

    def _answer_later(
        self, request: h11.Request, reading: ReadBody, replying: Awaitable[Reply]
    ) -> None:
        """Answer the request with its route's reply once it comes (if the socket is open)."""

        async def answer() -> None:
            reply = await replying
            reply = dataclasses.replace(reply, headers=reply.headers + reading.headers)
            if self.transport is not None and not self.transport.is_closing():
                self._respond(reply, request, read=True)
            self._dropping = False
            self._serve()  # a request pipelined behind this one

        self.server.spawn(answer())

    def _view(self, request: h11.Request) -> HttpRequest:
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers]
        return HttpRequest.of(
            request.method.decode("latin-1"),
            request.target.decode("latin-1"),
            headers,
            self.peer,
            self.server.trusted,
        )

    def _upgrade(self, request: h11.Request, admit: Admit) -> None:
        """websockets checks the handshake itself (key, version, ``Origin``) and answers it."""
        assert self.transport is not None
        headers = Headers(
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in request.headers.raw_items()
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
        self.ws = WebSocket(
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
        trailing, _ = self.h11.trailing_data
        self.server.upgraded(self.ws)
        if trailing:
            self.ws.receive(trailing)

    def _stream(self, admit: Admit) -> None:
        """Start an SSE response; every frame from now on is written by the stream."""
        assert self.transport is not None and admit.positions is not None
        kind = AiSdkStream if admit.stream == "ai-sdk" else SseStream
        stream = kind(
            self.transport,
            self.h11,
            path=admit.request.target,
            client=admit.request.client,
            grant=admit.grant,
            positions=admit.positions,
            headers=admit.headers,
        )
        self.ws = stream
        stream.completed = self._stream_completed
        self.server.gate.admit(stream)
        stream.start()
        self.server.upgraded(stream)

    def _respond(self, reply: Reply, request: h11.Request | None, *, read: bool = False) -> None:
        """Send a plain HTTP response; keep the connection for the next one, or close it."""
        transport = self.transport
        assert transport is not None
        self._uncount()
        keep = reply.status < 400 and request is not None and (read or not _has_body(request))
        headers = [("Server", "token-relay"), *reply.headers]
        if reply.status != 204:  # a 204 has neither a body nor a length
            headers += [
                ("Content-Type", reply.content_type),
                ("Content-Length", str(len(reply.body))),
            ]
        if not keep:
            headers.append(("Connection", "close"))
        conn = self.h11
        try:
            phrase = HTTPStatus(reply.status).phrase.encode()
            data = conn.send(h11.Response(status_code=reply.status, headers=headers, reason=phrase))
            head_only = request is not None and request.method == b"HEAD"
            if reply.body and not head_only:
                data = (data or b"") + (conn.send(h11.Data(data=reply.body)) or b"")
            data = (data or b"") + (conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:
            data = _raw_response(reply.status, reply.body.decode(errors="replace"))
            keep = False
        transport.write(data)
        if keep and self._next_cycle():
            return
        self._linger()

    def _next_cycle(self) -> bool:
        """After a whole response on a connection kept alive: wait for the next request
        (one already here is read by the next :meth:`_next_events`). False if the
        connection can't go on."""
        conn = self.h11
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return False
        conn.start_next_cycle()
        self.request = None
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
            asyncio.get_running_loop().call_soon(self._serve)
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
        asyncio.get_running_loop().call_later(LINGER_SECONDS, self.transport_close)

    def transport_close(self) -> None:
        """Close the socket once what is written has gone."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        """Cut the socket now."""
        if self.transport is not None:
            self.transport.abort()


def _has_body(request: h11.Request) -> bool:
    length = _content_length(request)
    if length:
        return True
    return any(name == b"transfer-encoding" for name, _ in request.headers)


def _head_size(request: h11.Request) -> int:
    return len(request.target) + sum(len(k) + len(v) + 4 for k, v in request.headers)


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)
    return None


def _raw_response(status: int, reason: str) -> bytes:
    body = (reason + "\n").encode()
    phrase = HTTPStatus(status).phrase
    return (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nServer: token-relay\r\n\r\n"
    ).encode() + body
