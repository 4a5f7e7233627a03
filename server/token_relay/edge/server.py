"""The listening socket, and the bookkeeping of every socket accepted on it.

Each accepted socket is served by an :class:`~token_relay.edge.connection.HttpConnection`
(HTTP/1.1, then a WebSocket or a stream); the server accepts sockets, bounds
handshakes and file descriptors, keeps the open WebSockets and streams, and sweeps
them (keepalive pings, SSE heartbeats).

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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from typing import Any, TypeVar

from websockets.typing import Origin

from ..core.forwarded import is_trusted, parse_networks
from ..core.settings import Settings
from .connection import HttpConnection, raw_response
from .http import Admit, Gate, ReadBody, Reply
from .httpproducer import HttpProducer
from .metrics import Metrics
from .peer import Streamed
from .sse import SseStream
from .websocket import Cork

__all__ = ["FD_RESERVE", "HttpConnection", "HttpServer"]

log = logging.getLogger("token_relay")

FD_RESERVE = 128
"""File descriptors kept free for everything but client sockets (Redis, logs, files)."""

ACCEPT_BURST = 64
"""Sockets accepted in one go, before the loop turns."""

LISTEN_BACKLOG = 4096
"""Connections the kernel queues for accepting (capped by ``net.core.somaxconn``)."""

Handler = Callable[[Streamed, Admit], Coroutine[Any, Any, None]]
BodyHandler = Callable[[ReadBody, bytes], Awaitable[Reply]]
ProduceHandler = Callable[[ReadBody, HttpProducer], Awaitable[Reply]]
OnceHandler = Callable[[ReadBody, bytes], Reply | Awaitable[Reply] | None]
"""Answers a producer request whose whole body is here at once (or once its broker has
replied), or declines (None)."""


T = TypeVar("T")

SWEEP_SLICES = 64
"""The slices a sweep over every peer (keepalive pings, SSE heartbeats) is spread over: a
pass of the event loop visits a 64th of the peers, not all of them at once (a sweep of
10,000 sockets at once held every other message back by a few hundred milliseconds)."""


async def sweep(
    slices: Sequence[Collection[T]], interval: float, visit: Callable[[T], None]
) -> None:
    """Call ``visit`` on every member of ``slices`` once each ``interval`` seconds, spread
    over it: one slice every ``interval / len(slices)`` seconds, each member in the same
    slice every time, so each is visited ``interval`` apart.

    A loop more than a slice's time behind (a stall) is not caught up: the sweep goes on
    from when it woke. Catching up would visit the overdue slices in one burst, then again
    on the old schedule, less than an interval later, and a keepalive would cut a peer that
    had less than an interval to answer its ping. So two visits of a member are at least
    ``interval`` less two slices' time apart, whatever the loop's load; a wake-up a little
    late (less than a slice's time) is caught up, so the sweeps keep their pace."""
    loop = asyncio.get_running_loop()
    tick, due = interval / len(slices), loop.time()
    while True:
        for members in slices:
            due += tick
            now = loop.time()
            if due < now - tick:
                due = now
            await asyncio.sleep(max(0.0, due - now))
            for member in list(members):
                visit(member)


def _never(reading: ReadBody) -> bool:
    return False


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
        once: OnceHandler | None = None,
        takes_once: Callable[[ReadBody], bool] | None = None,
        read_now: Callable[[ReadBody, bytes], Reply | None] | None = None,
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.metrics = metrics
        self.handler = handler
        self.read = read
        """Answers a request whose route takes a body, given the whole body."""
        self.produce = produce
        """Serves a producer request, whose body it is fed as it arrives."""
        self.once = once
        """Answers a producer request given its whole body, at once, if it can (a one-shot
        message, :mod:`token_relay.edge.oneshot`); when it declines, the request is served
        by :attr:`produce`, fed the body whole."""
        self.takes_once: Callable[[ReadBody], bool] = takes_once or _never
        """Whether a producer request's body is read whole first, for :attr:`once`."""
        self.read_now = read_now
        """Answers a request whose route takes a body, given the whole body, within the
        call and with no task, if it can; when it declines (None), :attr:`read` answers."""
        origins = settings.allowed_origins
        self.origins: list[Origin | None] | None = (
            [*(Origin(origin) for origin in origins), None] if origins else None
        )
        self.trusted = parse_networks(settings.trusted_proxies)
        self.open: set[HttpConnection] = set()
        self.handshaking: dict[HttpConnection, None] = {}
        """Sockets whose request head is not complete yet, oldest first."""
        # Read when scraped, not set on every request head.
        metrics.handshakes.set_function(lambda: len(self.handshaking))
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
        self.loop = asyncio.get_running_loop()
        """The loop this server runs on, kept: on Python 3.11 each
        ``asyncio.get_running_loop()`` costs a ``getpid`` system call."""
        self.cork = Cork(self.loop)
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
                    conn.send(raw_response(503, "out of file descriptors; try again later"))
                conn.close()
                continue
            conn.setblocking(False)
            if conn.family != socket.AF_UNIX:
                # A frame written just after another must not wait for the peer's delayed
                # ACK (Nagle): asyncio sets this only on sockets whose proto names TCP, and an
                # accepted socket's proto is 0.
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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

    def handshake_ended(self, connection: HttpConnection) -> None:
        """The socket's request head is complete, or the socket is gone."""
        if self.handshaking.pop(connection, 0) is None:
            peer = connection.peer
            left = self.handshaking_per_address.get(peer, 1) - 1
            if left > 0:
                self.handshaking_per_address[peer] = left
            else:
                self.handshaking_per_address.pop(peer, None)

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

    def upgraded(self, ws: Streamed, admit: Admit) -> None:
        """A WebSocket (or an SSE stream) is open: serve it, as its admission says."""
        self.connections.add(ws)
        self._slice(ws).add(ws)
        self.spawn(self.handler(ws, admit))

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a handler; :meth:`wait_closed` waits for it."""
        task = self.loop.create_task(coroutine)
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
        """Call ``visit`` on every open peer once each ``interval`` seconds (see
        :func:`sweep`)."""
        await sweep(self._slices, interval, visit)

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
