"""One relay process: its lifecycle, and the wiring of its parts.

Endpoints
---------
* ``/produce[?channel=C]``: a producer (model gateway) pushes delta events
  (:mod:`token_relay.edge.producers`).
* ``/subscribe[?channel=C[&deltas=1]]``: a subscriber (chat frontend) receives
  completed messages and, if asked, live deltas (:mod:`token_relay.edge.subscribers`).
* ``/ai-sdk/ws``: the AI SDK's ``WebSocketChatTransport`` (:mod:`token_relay.edge.aisdkws`).
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
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any

from websockets import CloseCode

from ..brokers import Broker, open_broker
from ..core.errors import BrokerUnavailable, ErrorCode, FrameRejected, StreamRefused
from ..core.events import Delta, FrameKind, Payload
from ..core.grants import Grant
from ..core.hub import ChannelHub
from ..core.protocol import AbortReason, Since, Subscribe, error_frame
from ..core.sessions import SessionTable
from ..core.settings import Settings
from . import routes
from .aisdk import AiSdkStream, ui_message
from .aisdkws import AiSdkSocket, ChatEndpoint
from .durable import DurableStreams, refusal
from .durablechannels import ChannelStreams, channel_of_route
from .durablesse import DurableSse
from .http import PRODUCE_PATH, SUBSCRIBE_PATH, Admit, Gate, ReadBody, Reply
from .httpproducer import NDJSON, HttpProducer
from .metrics import PUBLISH_SECONDS, Metrics
from .oneshot import Answer, apply_once
from .peer import Peer, ProducerPeer, Streamed
from .producers import ProducerEndpoint
from .server import HttpServer
from .sse import SseStream
from .statuses import produce_status
from .subscribers import SubscriberEndpoint
from .webhooks import WebhookDispatcher
from .websocket import WebSocket
from .writer import Writer

__all__ = ["PRODUCE_PATH", "SUBSCRIBE_PATH", "Relay"]

log = logging.getLogger("token_relay")

try:
    import websockets.speedups  # noqa: F401

    SPEEDUPS = True
except ImportError:  # pragma: no cover - depends on the installed wheel
    SPEEDUPS = False

SHUTDOWN_REASON = "relay shutting down"


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
            spawn=self._spawn,
        )
        self.chat = ChatEndpoint(
            self.settings, self.metrics, self.writer, self.subscribers, self.producers
        )
        self.durable = DurableStreams(
            self.settings, lambda: self.producers.memory_used, spawn=self._spawn
        )
        # Both count against --max-memory-bytes: each takes what the other leaves.
        self.producers.held_elsewhere = lambda: self.durable.store.total_bytes
        self.channels = ChannelStreams(
            self.settings, self.broker, self.subscribers.update_interest, self._spawn
        )
        self.subscribers.also_listening = self.channels.listening
        self._delta_channels = self.subscribers.router.hub.delta_channels
        self.producers.delta_channels = self._delta_channels
        self.server: HttpServer | None = None
        metrics = self.metrics
        self._http_producers = 0
        """Producer requests in progress: counted without the gauge's lock, read when
        ``/metrics`` is."""
        metrics.connections.labels("http_producer").set_function(lambda: self._http_producers)
        metrics.memory.set_function(
            lambda: self.producers.memory_in_use() + self.durable.store.total_bytes
        )
        metrics.durable_streams.set_function(lambda: len(self.durable.store))
        self._sse_reads = 0
        """Durable Streams SSE responses in progress (user streams and channels')."""
        live_reads = metrics.durable_live_reads
        live_reads.labels("long_poll").set_function(
            lambda: self.durable.polls + self.channels.polls
        )
        live_reads.labels("sse").set_function(lambda: self._sse_reads)
        metrics.durable_bytes.set_function(lambda: self.durable.store.total_bytes)
        metrics.memory_limit.set(self.settings.max_memory_bytes)
        metrics.parked.set_function(lambda: len(self.producers.sessions.parked))
        metrics.broker_healthy.set_function(lambda: float(self.broker.healthy))
        self._sweeper: asyncio.Task[None] | None = None
        self._stopping = False
        store = self.broker.webhooks
        self.webhooks = WebhookDispatcher(self.settings, store, metrics) if store else None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> HttpServer:
        """Connect the broker and start listening.

        Frames are small and mostly unique: deflate would cost CPU and ~50 KiB per
        connection for little gain, so no compression is offered on any endpoint.
        """
        if not SPEEDUPS:
            log.warning("websockets' C speedups are missing: frames are unmasked in pure Python")
        await self.broker.start(self)
        if self.webhooks is not None:
            await self.webhooks.start()
        self.server = HttpServer(
            self.settings,
            self.gate,
            self.metrics,
            self._handle,
            self._read_body,
            self._produce,
            once=self._produce_once,
            takes_once=self._takes_once,
            read_now=self._read_now,
        )
        await self.server.start()
        self._sweeper = asyncio.create_task(self._expire_idle())
        if self.metrics.shared is not None:
            self._spawn(self._publish_metrics())
        return self.server

    async def stop(self) -> None:
        """Shut down gracefully within ``--shutdown-timeout``; see the module docstring."""
        if self._stopping:
            return
        self._stopping = self.producers.stopping = True
        deadline = time.monotonic() + self.settings.shutdown_timeout
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.shutdown_timeout):
                await self.channels.stop()
                await self.durable.stop()  # long-polls answered before their sockets close
        server = self.server
        if server is not None:
            server.close()
        handing_off = self._shutdown_code() == CloseCode.SERVICE_RESTART
        if handing_off:
            log.info(
                "token-relay stopping: handing producers off (their sessions wait in the broker "
                "for --session-grace, to resume on another process), closing connections "
                "with 1012"
            )
        else:
            log.info(
                "token-relay stopping: aborting messages in progress (reason shutdown%s), "
                "closing connections with 1001",
                "; the broker is unreachable, so nothing can be handed off"
                if self.broker.shares_sessions
                else "",
            )
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
            for connection in connections:
                connection.start_close(code, SHUTDOWN_REASON)
            closing = [asyncio.ensure_future(c.wait_closed()) for c in connections]
            if closing:
                await asyncio.wait(closing, timeout=max(0.1, deadline - time.monotonic()))
            for connection in connections:
                connection.abort()
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
        if self.webhooks is not None:
            # What completed (and what the shutdown aborted) is delivered in what time is left.
            await self.webhooks.stop(deadline)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.broker.close()

    def _shutdown_code(self) -> CloseCode:
        """What a shutdown closes connections with: 1012 when producers are handed off (a
        broker that shares sessions, and is reachable), else 1001."""
        if self.broker.shares_sessions and self.broker.healthy:
            return CloseCode.SERVICE_RESTART
        return CloseCode.GOING_AWAY

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

    async def _handle(self, connection: Streamed, admit: Admit) -> None:
        """Serve a WebSocket or a stream, as the route its request was admitted on says."""
        grant, route = connection.grant, admit.route
        producing = isinstance(route, routes.Produce)
        role = "producer" if producing else "subscriber"
        gauge = self.metrics.connections.labels(role)
        gauge.inc()
        opened = time.monotonic()
        peer = connection.client
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
                "path": admit.request.path,
            },
        )
        try:
            # A peer that vanishes without a close frame just ends its iteration: that
            # is the world's doing, not an error of ours to log.
            if isinstance(route, routes.StreamRequest) and isinstance(connection, DurableSse):
                self._sse_reads += 1
                try:
                    if _is_channel_stream(route):
                        await self.channels.serve_sse(connection, route)
                    else:
                        await self.durable.serve_sse(connection, route)
                finally:
                    self._sse_reads -= 1
            elif isinstance(route, routes.Produce) and isinstance(connection, WebSocket):
                await self.producers.serve(connection, route.channel, grant, route.session)
            elif isinstance(route, routes.AiSdkSocket) and isinstance(connection, AiSdkSocket):
                await self.chat.serve(connection, grant)
            elif isinstance(route, routes.AiSdkStream) and isinstance(connection, AiSdkStream):
                # The chat id is the channel; the stream follows its deltas. History holds a
                # reply that completed before the stream was asked for: the one ?id= names,
                # else the newest, if it is recent enough (and the reader is not waiting for
                # a new one, with ?wait=).
                rewind = route.rewind
                if route.wanted is not None:
                    rewind = self.settings.history_size
                elif not route.wait:
                    rewind, connection.replay_window = 1, self.settings.ai_sdk_replay_window
                initial = [_subscribe(route.channel, True, None, rewind)]
                await self.subscribers.serve(connection, initial, grant)
            elif isinstance(route, routes.Subscribe | routes.Sse):
                positions = connection.positions if isinstance(connection, SseStream) else {}
                initial = [
                    _subscribe(channel, route.deltas, positions.get(channel), route.rewind)
                    for channel in route.channels
                ]
                await self.subscribers.serve(connection, initial, grant)
        except Exception:
            log.exception("%s %s failed", role, connection.id)
            connection.start_close(CloseCode.INTERNAL_ERROR, "internal error")
            raise
        finally:
            if connection.open:
                # The endpoint is done with it: the session moved (1000), or the relay is
                # stopping (its shutdown's code, as for every connection: a producer told
                # 1012 resumes elsewhere). Close and wait, so the code logged is the real one.
                if self._stopping:
                    await connection.close(self._shutdown_code(), SHUTDOWN_REASON)
                else:
                    await connection.close(CloseCode.NORMAL_CLOSURE)
            gauge.dec()
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

    def _read_now(self, request: ReadBody, body: bytes) -> Reply | None:
        """A request whose route takes a body, answered within the call if it can be (a
        Durable Streams append to a stream in this process's memory); None otherwise, and
        :meth:`_read_body` answers it."""
        route = request.route
        if not isinstance(route, routes.StreamRequest) or _is_channel_stream(route):
            return None
        return self.durable.append_now(request, body)

    async def _read_body(self, request: ReadBody, body: bytes) -> Reply:
        r"""A request whose route takes a body: ``POST /cancel``, Stop of the AI SDK, the
        replies as ``UIMessage``\ s, or the dead letters."""
        route = request.route
        if isinstance(route, routes.StreamRequest):
            if _is_channel_stream(route):
                try:
                    return await self.channels.serve(route, request.request, request.gone)
                except StreamRefused as exc:
                    return refusal(exc)
            return await self.durable.serve(request, body)
        if isinstance(route, routes.DeadLetters):
            return await self._dead_letters(request)
        if isinstance(route, routes.AiSdkMessages):
            try:
                cut = await self.broker.catch_up(route.channel, None, False, route.limit)
            except BrokerUnavailable:
                return Reply.text(503, "broker unreachable")
            replies = [ui_message(json.loads(frame)) for frame in cut.frames]
            return Reply(200, json.dumps(replies, ensure_ascii=False).encode(), "application/json")
        if isinstance(route, routes.AiSdkStop):
            status, error = await self.subscribers.stop_over_http(route.channel, route.wanted)
        else:
            status, error = await self.subscribers.cancel_over_http(request.grant, body)
        if status == 204:
            return Reply(204, b"")
        return Reply(status, error.encode(), "application/json")

    async def _dead_letters(self, request: ReadBody) -> Reply:
        """``GET /webhooks/dead`` lists the dead letters; ``POST`` queues them all again."""
        if self.webhooks is None:
            return Reply.text(404, "no --webhook is set")
        store = self.webhooks.store
        try:
            if request.request.method == "POST":
                revived = await store.revive()
                log.info("%d dead letters queued again", revived)
                body = json.dumps({"revived": revived})
            else:
                letters = [letter.model_dump(mode="json") for letter in await store.dead()]
                body = json.dumps({"dead": letters}, ensure_ascii=False)
        except BrokerUnavailable:
            return Reply.text(503, "broker unreachable")
        return Reply(200, body.encode(), "application/json")

    def _takes_once(self, request: ReadBody) -> bool:
        """Whether a producer request may be a one-shot message (:mod:`.oneshot`): an
        unnamed ``POST /produce?channel=`` with a JSON body, on a broker in this process."""
        route = request.route
        return (
            self.producers.one_shot
            and isinstance(route, routes.HttpProduce)
            and not route.named
            and route.channel is not None
            and request.request.media_type != NDJSON
        )

    def _produce_once(
        self, request: ReadBody, body: bytes
    ) -> Reply | Coroutine[Any, Any, Reply] | None:
        """``POST /produce`` of one whole message, answered at once (or once the broker
        has replied); None for any other body (the request is then served by
        :meth:`_produce`)."""
        route = request.route
        assert isinstance(route, routes.HttpProduce) and route.channel is not None
        server = self.server
        assert server is not None
        answered = apply_once(self.producers, route.channel, request.grant, body, server.loop)
        if answered is None or isinstance(answered, tuple):
            return None if answered is None else _once_reply(answered)
        return _once_replied(answered)

    async def _produce(self, request: ReadBody, producer: HttpProducer) -> Reply:
        """``POST /produce`` (or the AI SDK's): one request's events, and every frame it
        earned (or, the AI SDK's, what became of its reply), as JSON."""
        route = request.route
        name = route.producer if isinstance(route, routes.HttpProduce) else ""
        channel = (
            route.channel if isinstance(route, routes.HttpProduce | routes.AiSdkProduce) else None
        )
        resume = named_session(request.grant, name) if name else None
        self._http_producers += 1
        try:
            await self.producers.serve(producer, channel, request.grant, resume)
        finally:
            self._http_producers -= 1
        if producer.unapplied is not None and isinstance(route, routes.HttpProduce):
            # The relay began to stop (a rolling restart) before this body was applied
            # whole: its session is handed off (named) or ended (unnamed), and the answer
            # says from where to send again, with a status a gateway retries.
            producer.collect(error_frame(_stopped(name, producer.unapplied)).encode())
        elif producer.displaced and producer.named:
            # Another request of this producer took its session on another process: what
            # is left of this body was not applied, and the answer says from where.
            producer.collect(error_frame(_moved(name, producer.taken)).encode())
        codes = producer.codes
        if codes and producer.ndjson:
            codes = codes - {ErrorCode.INVALID_JSON}  # a bad line is one refused event
        return Reply(produce_status(codes), producer.answer(), "application/json")

    @property
    def hub(self) -> ChannelHub[Peer]:
        """Which local subscribers hold which channels (read-only use)."""
        return self.subscribers.router.hub

    @property
    def sessions(self) -> SessionTable[ProducerPeer]:
        """Every producer session of this process, parked ones included (read-only use)."""
        return self.producers.sessions

    def _forget(self, connection: Peer) -> None:
        self.subscribers.forget(connection)

    # ---------------------------------------------------------------- broker listener

    def on_frame(self, channel: str, kind: FrameKind, seq: int, payload: Payload) -> None:
        """Deliver a terminal or snapshot frame to this process's subscribers of ``channel``."""
        self.subscribers.deliver(channel, kind, seq, payload)
        if kind is FrameKind.TERMINAL:
            self.channels.on_frame(channel)

    def on_delta(self, channel: str, seq: int, delta: Delta) -> None:
        """Deliver a delta to this process's deltas subscribers of ``channel``."""
        self.subscribers.deliver(channel, FrameKind.DELTA, seq, delta)

    def wants_deltas(self, channel: str) -> bool:
        """Whether a local subscriber of ``channel`` asked for deltas."""
        return channel in self._delta_channels

    def on_cancel(self, owner: str, payload: Payload) -> None:
        """Pass a ``cancel`` frame to the local producer that owns the message."""
        self.producers.cancel(owner, payload)

    def partial(self, owner: str, message_id: str) -> str | None:
        """The text so far of a local producer's message."""
        return self.producers.partial(owner, message_id)

    def live_parts(self, owner: str, message_id: str) -> tuple[str, list[dict[str, Any]]] | None:
        """The text so far and catch-up chunks of a local producer's structured message."""
        return self.producers.live_parts(owner, message_id)

    def owned_messages(self) -> list[tuple[str, str, str]]:
        """Every message in progress on this process's producers."""
        return self.producers.owned_messages()

    def on_request(self, owner: str, channel: str, payload: Payload) -> ErrorCode | None:
        """Hand a chat request to the local producer ``owner``."""
        return self.producers.on_request(owner, channel, payload)

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
        """Abort messages with no event for ``idle_timeout`` seconds, and drop expired
        durable streams."""
        timeout = self.settings.idle_timeout
        loop = asyncio.get_running_loop()
        # Until the relay stops, not only until cancelled: a cancel that lands while a
        # Redis client's own timeout fires can be swallowed by it (as the broker's tasks
        # know), and stop() would wait for this loop forever.
        while not self._stopping:
            await asyncio.sleep(min(timeout / 4, 1.0))
            await self.producers.expire_idle(loop.time() - timeout)
            await self.durable.sweep()

    async def _publish_metrics(self) -> None:
        """With ``--workers N``: write this worker's metrics for the others, every second."""
        while True:
            self.metrics.publish()
            await asyncio.sleep(PUBLISH_SECONDS)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def named_session(grant: Grant, name: str) -> str:
    """The session token of a named HTTP producer: its name, bound to the token's identity
    (role and channels), so another token can't continue its messages."""
    identity = json.dumps([grant.role.value, sorted(grant.channels), name])
    return "n-" + hashlib.sha256(identity.encode()).hexdigest()[:40]


def _subscribe(
    channel: str, deltas: bool, since: tuple[int, str] | None, rewind: int = 0
) -> Subscribe:
    if since is None:
        if rewind:
            return Subscribe(type="subscribe", channel=channel, deltas=deltas, rewind=rewind)
        return Subscribe(type="subscribe", channel=channel, deltas=deltas)
    offset, epoch = since
    return Subscribe(
        type="subscribe", channel=channel, deltas=deltas, since=Since(offset=offset, epoch=epoch)
    )


def _moved(name: str, taken: int) -> FrameRejected:
    return FrameRejected(
        ErrorCode.PRODUCER_MOVED,
        f"producer '{name}' was taken over by a request on another relay process: this "
        f"body's events from number {taken} on (counted from 0) were not applied, and those "
        "since the takeover may not have been either: send again what came after your last "
        "ack (with seq, nothing is applied twice)",
        index=taken,
    )


def _stopped(name: str, unapplied: int) -> FrameRejected:
    """A request whose events from ``unapplied`` on were not applied: the relay process
    began to stop. A named producer's session was handed off, as if taken over
    (``producer_moved``, 409); an unnamed request is posted again elsewhere
    (``relay_stopping``, 503)."""
    if name:
        return FrameRejected(
            ErrorCode.PRODUCER_MOVED,
            f"this relay process is restarting and handed producer '{name}' off: this "
            f"body's events from number {unapplied} on (counted from 0) were not applied; "
            "send again what came after your last ack (with seq, nothing is applied twice)",
            index=unapplied,
        )
    return FrameRejected(
        ErrorCode.RELAY_STOPPING,
        f"this relay process is stopping: this body's events from number {unapplied} on "
        "(counted from 0) were not applied; post them again (to another process)",
        index=unapplied,
    )


def _is_channel_stream(route: routes.StreamRequest) -> bool:
    """A channel read as a Durable Stream (a name there that is no channel: its stream,
    to be refused there)."""
    try:
        return channel_of_route(route) is not None
    except StreamRefused:
        return True


def _once_reply(answer: Answer) -> Reply:
    """A one-shot message's reply: its answer, with the general path's status."""
    body, codes = answer
    return Reply(produce_status(codes), body, "application/json")


async def _once_replied(answering: Coroutine[Any, Any, Answer]) -> Reply:
    """A one-shot message's reply, once its broker has replied."""
    return _once_reply(await answering)
