"""One relay process: its lifecycle, and the wiring of its parts.

Endpoints
---------
* ``/produce[?channel=C]``: a producer (model gateway) pushes delta events
  (:mod:`token_relay.edge.producers`).
* ``/subscribe[?channel=C[&deltas=1]]``: a subscriber (chat frontend) receives
  completed messages and, if asked, live deltas (:mod:`token_relay.edge.subscribers`).
* ``GET /healthz``, ``/readyz``, ``/metrics``, and with ``--web-root`` the demo
  page; see :mod:`token_relay.edge.http` for admission (tokens, origins, limits).

Events
------
Producers' events go to the broker (:mod:`token_relay.brokers`), and the broker
hands every event of a channel this process listens to back to the relay, its
own included, so every subscriber sees one order. The relay is the broker's
listener and passes each event to the subscriber endpoint, whose router
(:mod:`token_relay.core.router`) decides who gets it. Every frame leaves through
one :class:`~token_relay.edge.writer.Writer`.

Shutdown
--------
:meth:`Relay.stop` stops accepting, aborts every message in progress with reason
``shutdown`` (subscribers get the ``aborted`` frame first), lets slow
subscribers' backlogs drain, then closes every connection with 1001, all
within ``--shutdown-timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from websockets import CloseCode, State
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.typing import Origin

from ..brokers import Broker, open_broker
from ..core.errors import BrokerUnavailable
from ..core.events import Delta, FrameKind, Payload
from ..core.hub import ChannelHub
from ..core.protocol import AbortReason, Subscribe
from ..core.sessions import SessionTable
from ..core.settings import Settings
from .http import PRODUCE_PATH, SUBSCRIBE_PATH, Gate, RelayConnection, client_of, query_of
from .metrics import Metrics
from .producers import ProducerEndpoint
from .subscribers import SubscriberEndpoint
from .writer import Writer

__all__ = ["PRODUCE_PATH", "SUBSCRIBE_PATH", "Relay"]

log = logging.getLogger("token_relay")

try:
    import websockets.speedups  # noqa: F401

    SPEEDUPS = True
except ImportError:  # pragma: no cover - depends on the installed wheel
    SPEEDUPS = False

SHUTDOWN_REASON = "relay shutting down"
NO_GRANT_REASON = "connection was not admitted"
_TRUE = frozenset({"1", "true", "yes", "on"})


class Relay:
    """One relay process: local connections and subscriptions, joined by a broker."""

    def __init__(self, settings: Settings | None = None, broker: Broker | None = None) -> None:
        self.settings = settings or Settings()
        self.broker = broker or open_broker(self.settings, secrets.token_hex(4))
        self.metrics = Metrics()
        self.gate = Gate(self.settings, self.metrics, lambda: self.broker.healthy)
        self._background: set[asyncio.Task[Any]] = set()
        self.writer = Writer(self.settings, self.metrics, self._forget)
        self.subscribers = SubscriberEndpoint(
            self.settings, self.broker, self.metrics, self.writer, self._spawn
        )
        self.producers = ProducerEndpoint(
            self.settings,
            self.broker,
            self.metrics,
            self.writer,
            stopping=lambda: self._stopping,
            spawn=self._spawn,
        )
        self.server: Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._stopping = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Server:
        """Connect the broker and start listening."""
        if not SPEEDUPS:
            log.warning("websockets' C speedups are missing: frames are masked in pure Python")
        await self.broker.start(self)
        origins = self.settings.allowed_origins
        self.server = await serve(
            self._handle,
            self.settings.host,
            self.settings.port,
            create_connection=RelayConnection,
            process_request=self.gate.check,
            origins=[*(Origin(origin) for origin in origins), None] if origins else None,
            max_size=self.settings.max_frame_bytes,
            open_timeout=self.settings.handshake_timeout,
            # Frames are small and mostly unique; deflate would cost CPU and ~50 KiB per
            # connection for little gain, so it is off for every endpoint.
            compression=None,
            reuse_port=self.settings.workers > 1 or None,
        )
        self._sweeper = asyncio.create_task(self._expire_idle())
        return self.server

    async def stop(self) -> None:
        """Shut down gracefully within ``--shutdown-timeout``; see the module docstring."""
        if self._stopping:
            return
        self._stopping = True
        deadline = time.monotonic() + self.settings.shutdown_timeout
        server = self.server
        if server is not None:
            server.close(close_connections=False)
        handing_off = self.broker.shares_sessions and self.broker.healthy
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                if handing_off:
                    # A rolling restart: producers resume on another process, and
                    # subscribers resume by offset there; nothing is aborted.
                    await self.producers.hand_off()
                else:
                    await self.producers.abort_everything(AbortReason.SHUTDOWN)
                with contextlib.suppress(BrokerUnavailable):
                    await self.broker.flush()
                while self.writer.backlogs:  # noqa: ASYNC110 - drained by the writer's tasks
                    await asyncio.sleep(0.01)
        if server is not None:
            # A peer that never answers the close handshake must not hold the process:
            # whatever is still open at the deadline is cut.
            connections = list(server.connections)
            code = CloseCode.SERVICE_RESTART if handing_off else CloseCode.GOING_AWAY
            closing = [
                asyncio.ensure_future(connection.close(code, SHUTDOWN_REASON))
                for connection in connections
            ]
            if closing:
                await asyncio.wait(closing, timeout=max(0.1, deadline - time.monotonic()))
            for connection in connections:
                if connection.state is not State.CLOSED and connection.transport is not None:
                    connection.transport.abort()
            for task in closing:
                task.cancel()
            await asyncio.gather(*closing, return_exceptions=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 1)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self.writer.stop()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.broker.close()

    async def __aenter__(self) -> Relay:
        if self.server is None:
            await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ connections

    async def _handle(self, connection: ServerConnection) -> None:
        request = connection.request
        assert request is not None  # the handshake is done
        grant = connection.grant if isinstance(connection, RelayConnection) else None
        if grant is None:
            # Fail closed: only a handshake the gate admitted carries a grant.
            await connection.close(CloseCode.POLICY_VIOLATION, NO_GRANT_REASON)
            return
        path = urlsplit(request.path).path
        role = "producer" if path == PRODUCE_PATH else "subscriber"
        self.gate.admit(connection)
        gauge = self.metrics.connections.labels(role)
        gauge.inc()
        opened = time.monotonic()
        peer = client_of(connection)
        log.info(
            "%s connected from %s (%s)",
            role,
            peer,
            connection.id,
            extra={
                "event": "open",
                "role": role,
                "peer": peer,
                "connection": str(connection.id),
                "path": path,
            },
        )
        query = query_of(request.path)
        try:
            # A peer that vanishes without a close frame ends its handler; that is the
            # world's doing (trio would say Broken), not an error of ours to log.
            with contextlib.suppress(ConnectionClosed):
                if role == "producer":
                    channels = query.get("channel")
                    resume = query.get("session", [""])[-1] or None
                    await self.producers.serve(
                        connection, channels[0] if channels else None, grant, resume
                    )
                else:
                    deltas = query.get("deltas", ["0"])[-1].lower() in _TRUE
                    initial = [
                        Subscribe(type="subscribe", channel=c, deltas=deltas)
                        for c in query.get("channel", [])
                    ]
                    await self.subscribers.serve(connection, initial, grant)
        finally:
            gauge.dec()
            self.gate.release(connection)
            code = connection.close_code
            log.info(
                "%s %s closed (%s)",
                role,
                connection.id,
                code,
                extra={
                    "event": "close",
                    "role": role,
                    "peer": peer,
                    "connection": str(connection.id),
                    "code": code,
                    "seconds": round(time.monotonic() - opened, 3),
                },
            )

    @property
    def hub(self) -> ChannelHub[ServerConnection]:
        """Which local subscribers hold which channels (read-only use)."""
        return self.subscribers.router.hub

    @property
    def sessions(self) -> SessionTable[ServerConnection]:
        """Every producer session of this process, parked ones included (read-only use)."""
        return self.producers.sessions

    def _forget(self, connection: ServerConnection) -> None:
        self.subscribers.forget(connection)

    # ---------------------------------------------------------------- broker listener

    def on_frame(self, channel: str, kind: FrameKind, seq: int, payload: Payload) -> None:
        """Deliver a terminal or snapshot frame to this process's subscribers of ``channel``."""
        self.subscribers.deliver(channel, kind, seq, payload)

    def on_delta(self, channel: str, seq: int, delta: Delta) -> None:
        """Deliver a delta to this process's deltas subscribers of ``channel``."""
        self.subscribers.deliver(channel, FrameKind.DELTA, seq, delta)

    def wants_deltas(self, channel: str) -> bool:
        """Whether a local subscriber of ``channel`` asked for deltas."""
        return self.subscribers.wants_deltas(channel)

    def on_cancel(self, owner: str, payload: Payload) -> None:
        """Pass a ``cancel`` frame to the local producer that owns the message."""
        self.producers.cancel(owner, payload)

    def partial(self, owner: str, message_id: str) -> str | None:
        """The text so far of a local producer's message."""
        return self.producers.partial(owner, message_id)

    def owned_messages(self) -> list[tuple[str, str, str]]:
        """Every message in progress on this process's producers."""
        return self.producers.owned_messages()

    def on_session_moved(self, owner: str) -> None:
        """Another process took over a local producer session: let go of it."""
        self.producers.session_moved(owner)

    def on_claim_refused(self, channel: str, owner: str, message_id: str) -> None:
        """Another producer held the id in the channel: void the local producer's message."""
        self.producers.claim_refused(channel, owner, message_id)

    def on_restored(self) -> None:
        """Events may have been missed during a broker outage: have subscribers resume."""
        closed = self.subscribers.resume_everyone()
        if closed:
            log.warning("broker restored: closing %d subscribers so they resume", closed)

    # ---------------------------------------------------------------- background

    async def _expire_idle(self) -> None:
        """Abort messages with no event for ``idle_timeout`` seconds."""
        timeout = self.settings.idle_timeout
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(timeout / 4, 1.0))
            await self.producers.expire_idle(loop.time() - timeout)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
