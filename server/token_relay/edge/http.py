"""What each HTTP request gets: a plain response, a refusal, or an admitted WebSocket handshake.

Before a handshake completes the relay decides, in this order:

1. ``/healthz``, ``/readyz`` and ``/metrics`` are answered as plain HTTP.
2. Any path other than ``/produce`` and ``/subscribe`` is a static file of
   ``--web-root``, or 404.
3. More than ``--max-connections-per-ip`` open connections from the client's
   address: 429.
4. A malformed ``?channel=``: 400.
5. With ``--secret``: no token, a bad one or an expired one is 401; a token for
   the other role, or one that doesn't grant the URL's ``?channel=``, is 403.

Plain HTTP on ``/produce`` and ``/subscribe`` gets 426 with ``Upgrade:
websocket``, and any method but ``GET`` (or ``HEAD`` on the plain endpoints)
gets 405 with ``Allow``. The ``Origin`` check (``--allowed-origin``) is
websockets' own and answers 403. A refused handshake never opens a socket.
Query strings, which may carry a token, are never logged.

The grant an admitted handshake earns is handed to its
:class:`~token_relay.edge.websocket.WebSocket`, never kept in a table: a
handshake refused after this check (by the ``Origin`` check, or for a missing
``Sec-WebSocket-Key``) leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..core.durablechannels import channel_of
from ..core.errors import FrameRejected, InvalidToken, StreamRefused
from ..core.forwarded import Network, client_address, scheme
from ..core.grants import OPEN, Grant, Role
from ..core.resume import decode_positions
from ..core.settings import Settings
from ..tokens import verify
from . import routes
from .logs import RefusalLog
from .metrics import Metrics
from .peer import Peer
from .routes import PRODUCE_PATH, SSE_PATH, SUBSCRIBE_PATH, Refusal
from .web import StaticFiles

__all__ = [
    "PRODUCE_PATH",
    "SSE_PATH",
    "SUBSCRIBE_PATH",
    "Admit",
    "Gate",
    "HttpRequest",
    "ReadBody",
    "Reply",
]

PLAIN_METHODS = frozenset({"GET", "HEAD"})
STREAM_METHODS = frozenset({"GET", "HEAD", "PUT", "POST", "DELETE"})
"""The methods of a Durable Streams stream (and ``OPTIONS``, its preflight)."""
STREAM_SECURITY_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("Cross-Origin-Resource-Policy", "cross-origin"),
    (
        "Access-Control-Expose-Headers",
        "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, ETag, "
        "Location, Content-Type, Stream-TTL, Stream-Expires-At, Stream-SSE-Data-Encoding, "
        "Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq",
    ),
)
"""What every Durable Streams response carries: no MIME sniffing, readable from any
origin, and the protocol's headers readable by a browser's script."""
STREAM_PREFLIGHT_HEADERS = (
    ("Access-Control-Allow-Methods", "GET, HEAD, PUT, POST, DELETE, OPTIONS"),
    (
        "Access-Control-Allow-Headers",
        "authorization, content-type, if-none-match, last-event-id, stream-ttl, "
        "stream-expires-at, stream-seq, stream-closed, stream-forked-from, stream-fork-offset, "
        "stream-fork-sub-offset, producer-id, producer-epoch, producer-seq",
    ),
    ("Access-Control-Max-Age", "600"),
)
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"

log = logging.getLogger("token_relay")


# Route classes as tuples: ``isinstance`` against ``A | B`` builds the union at every call.
_STREAMED = (routes.Sse, routes.AiSdkStream, routes.StreamRequest)
_BODY_STREAMS = (routes.HttpProduce, routes.AiSdkProduce)
_PAGES = (routes.Health, routes.Ready, routes.MetricsPage, routes.Static)
_PRODUCERS = (routes.Produce, routes.HttpProduce, routes.AiSdkProduce)
_AI_SDK_CHANNELS = (routes.AiSdkStream, routes.AiSdkStop, routes.AiSdkMessages)
_READ_BODIES = (
    routes.HttpProduce,
    routes.AiSdkProduce,
    routes.AiSdkStop,
    routes.AiSdkMessages,
    routes.Cancel,
)


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """What the gate reads of a request: never its body."""

    method: str
    target: str
    """The path with its query string."""
    path: str
    headers: tuple[tuple[str, str], ...]
    """Names lower-cased."""
    client: str
    """The peer's address, or the one a trusted proxy forwarded for."""
    query: str = ""
    """The query string, after ``?``: parsed once, into the route."""
    scheme: str = "http"
    """``https`` when a trusted proxy says the client used it (see
    :func:`~token_relay.core.forwarded.scheme`): for the URLs the relay builds."""

    @classmethod
    def of(
        cls,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]],
        peer: str,
        trusted: Sequence[Network],
        *,
        lowered: bool = False,
    ) -> HttpRequest:
        """A request from ``peer``; the client is worked out from ``--trusted-proxy``.
        ``lowered``: the header names are lower-cased already (as a parsed head's are)."""
        names = tuple(headers) if lowered else tuple((k.lower(), v) for k, v in headers)
        if target[:1] == "/" and target[1:2] != "/" and "#" not in target:
            # The common origin form, split as urlsplit splits it, without its cost.
            path, _, query = target.partition("?")
        else:
            parts = urlsplit(target)
            path, query = parts.path, parts.query
        client = client_address(peer, names, trusted) if trusted else peer
        used = scheme(peer, names, trusted) if trusted else "http"
        return cls(method, target, path, names, client, query, used)

    def header(self, name: str) -> str:
        """The last value of a header, or ''."""
        found = ""
        for key, value in self.headers:
            if key == name:
                found = value
        return found

    @property
    def media_type(self) -> str:
        """The body's media type (``Content-Type`` without its parameters), lowercase."""
        return self.header("content-type").split(";")[0].strip().lower()

    @property
    def upgrade(self) -> bool:
        """Whether it asks for a WebSocket."""
        return "websocket" in self.header("upgrade").lower()


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete plain HTTP response."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def text(cls, status: int, text: str, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
        """A short plain-text response."""
        return cls(status, (text.rstrip("\n") + "\n").encode(), headers=headers)


Streams = (
    routes.Produce
    | routes.Subscribe
    | routes.Sse
    | routes.AiSdkStream
    | routes.AiSdkSocket
    | routes.StreamRequest
)
"""The routes an :class:`Admit` admits: a WebSocket, or a streamed response."""
Bodies = (
    routes.HttpProduce
    | routes.AiSdkProduce
    | routes.AiSdkStop
    | routes.AiSdkMessages
    | routes.Cancel
    | routes.DeadLetters
    | routes.StreamRequest
)
"""The routes a :class:`ReadBody` admits: each takes a body (the replies' list an empty one)."""


@dataclass(frozen=True, slots=True)
class Admit:
    """An admitted WebSocket handshake or streamed response, and the grant it earned."""

    request: HttpRequest
    route: Streams
    grant: Grant
    positions: dict[str, tuple[int, str]] = field(default_factory=dict)
    """For an SSE stream: where to resume each channel (``Last-Event-ID`` or ``?since=``)."""
    headers: tuple[tuple[str, str], ...] = ()
    """Headers the response carries (CORS)."""

    @property
    def streamed(self) -> bool:
        """A streamed response (SSE, AI SDK), not a WebSocket."""
        return isinstance(self.route, _STREAMED)


@dataclass(frozen=True, slots=True)
class ReadBody:
    """An admitted request whose route takes a body (``POST /produce``, the AI SDK's
    producer, ``/cancel``, Stop, the dead letters)."""

    request: HttpRequest
    route: Bodies
    grant: Grant
    headers: tuple[tuple[str, str], ...] = ()
    """Headers the response carries (CORS)."""
    gone: asyncio.Future[None] | None = None
    """For a long-poll: done once the client's socket closes, so that the poll stops
    waiting then (no one is left to answer), not at ``--long-poll-timeout``."""

    @property
    def stream(self) -> bool:
        """The body is applied as it arrives (``POST /produce``, the AI SDK's producer), not
        read whole first."""
        return isinstance(self.route, _BODY_STREAMS)


REMEMBERED_ROUTES = 512
"""Routes the gate keeps at most: those of recent targets (:meth:`Gate.parse`)."""
REMEMBERED_TARGET_CHARS = 512
"""The longest target (path, query and ``Last-Event-ID`` together) whose route is kept."""


class Gate:
    """Decides each request, and counts the open connections of each client address."""

    def __init__(self, settings: Settings, metrics: Metrics, ready: Callable[[], bool]) -> None:
        self.settings = settings
        self.metrics = metrics
        self.ready = ready
        self.web = StaticFiles(Path(settings.web_root)) if settings.web_root else None
        self.per_address: dict[str, int] = {}
        self.refusal_log = RefusalLog()
        """The budget of refusal lines, per client address (the socket refusals' too)."""
        self._routes: dict[tuple[str, str, str, bool, str], routes.Route | Refusal] = {}
        """The routes of recent targets (see :meth:`parse`)."""

    def parse(
        self, method: str, path: str, query: str, *, upgrade: bool = False, last_event_id: str = ""
    ) -> routes.Route | Refusal:
        """:func:`~token_relay.edge.routes.parse_route`, parsed once per target: a route is
        frozen and depends on these arguments alone, so the routes of recent targets are
        kept (:data:`REMEMBERED_ROUTES` of them, each target of at most
        :data:`REMEMBERED_TARGET_CHARS`; past that count, all are forgotten at once) and a
        client that posts to one URL again and again has it parsed once."""
        key = (method, path, query, upgrade, last_event_id)
        route = self._routes.get(key)
        if route is None:
            route = routes.parse_route(
                method, path, query, upgrade=upgrade, last_event_id=last_event_id
            )
            if len(path) + len(query) + len(last_event_id) <= REMEMBERED_TARGET_CHARS:
                if len(self._routes) >= REMEMBERED_ROUTES:
                    self._routes.clear()
                self._routes[key] = route
        return route

    def route(self, request: HttpRequest) -> Reply | Admit | ReadBody:
        """The response to a request, the admission of its WebSocket handshake or SSE
        stream, or of its body.

        The HTTP surfaces a browser may call from another origin (``/sse``, ``/ai-sdk/…``,
        ``/cancel``, ``POST /produce``) answer CORS: a preflight ``OPTIONS`` gets 204, and
        every response names the request's ``Origin`` as allowed, if ``--allowed-origin``
        allows it (any, when none is given); another origin gets 403.
        """
        if request.path.startswith(routes.STREAM_PREFIX):
            return self._durable(request)
        if routes.cross_origin(request.method, request.path):
            return self._cors(request)
        return self._route(request)

    def _durable(self, request: HttpRequest) -> Reply | Admit | ReadBody:
        """A Durable Streams request (``/v1/stream/...``): every response carries the
        browser security headers and CORS (any origin, unless ``--allowed-origin`` names
        them); a preflight gets 204. With ``--secret``, reads (``GET``, ``HEAD``) need a
        subscriber's token and writes a producer's, granting the stream's name (its path
        after ``/v1/stream/``)."""
        origin = request.header("origin")
        allowed = self.settings.allowed_origins
        if origin and allowed and origin not in allowed:
            return _stream_error(403, "origin_not_allowed", f"origin {origin!r} is not allowed")
        headers = STREAM_SECURITY_HEADERS + (
            (("Access-Control-Allow-Origin", origin), ("Vary", "Origin"))
            if origin
            else (("Access-Control-Allow-Origin", "*"),)
        )
        if request.method == "OPTIONS":
            return Reply(204, b"", headers=headers + STREAM_PREFLIGHT_HEADERS)
        route = self.parse(request.method, request.path, request.query)
        if isinstance(route, Refusal):
            return _stream_error(route.status, route.code, route.reason, headers)
        assert isinstance(route, routes.StreamRequest)
        if request.method not in STREAM_METHODS:
            allow = (("Allow", ", ".join(sorted(STREAM_METHODS))),)
            return _stream_error(
                405, "method_not_allowed", f"a stream takes {allow[0][1]}", headers + allow
            )
        if route.self_authorized:
            # A wake's token is checked by the subscription; the signing keys are public.
            if self.per_address.get(request.client, 0) >= self.settings.max_connections_per_ip:
                return _stream_error(
                    429, "too_many_connections", "too many connections from this address", headers
                )
            return ReadBody(request, route, OPEN, headers=headers)
        role = Role.SUBSCRIBE if request.method in PLAIN_METHODS else Role.PRODUCE
        decision = self._decide(role, request, route)
        if isinstance(decision, Refusal):
            return _stream_error(decision.status, decision.code, decision.reason, headers)
        try:
            # A channel's stream is granted as its channel is.
            name = channel_of(route.stream.removeprefix(routes.STREAM_PREFIX))
        except StreamRefused as exc:
            return _stream_error(exc.status, exc.code, exc.message, headers)
        if name is None:
            name = request.path.removeprefix(routes.STREAM_PREFIX)
        if not decision.allows(name):
            return _stream_error(403, "forbidden", "this token does not grant the stream", headers)
        if route.sse:
            return Admit(request, route, decision, headers=headers)
        return ReadBody(request, route, decision, headers=headers)

    def _cors(self, request: HttpRequest) -> Reply | Admit | ReadBody:
        origin = request.header("origin")
        allowed = self.settings.allowed_origins
        if origin and allowed and origin not in allowed:
            return self.refuse(request, 403, f"origin {origin!r} is not allowed")
        headers = (("Access-Control-Allow-Origin", origin), ("Vary", "Origin")) if origin else ()
        if request.method == "OPTIONS":
            preflight = (
                ("Access-Control-Allow-Methods", "GET, POST"),
                ("Access-Control-Allow-Headers", "authorization, content-type, last-event-id"),
                ("Access-Control-Max-Age", "600"),
            )
            return Reply(204, b"", headers=headers + preflight)
        decision = self._route(request)
        if not headers:
            return decision  # no Origin: nothing to add (_route's decisions carry none)
        # Built directly: dataclasses.replace costs three times as much.
        if isinstance(decision, Reply):
            both = decision.headers + headers
            return Reply(decision.status, decision.body, decision.content_type, both)
        if isinstance(decision, ReadBody):
            body = decision
            return ReadBody(body.request, body.route, body.grant, headers, body.gone)
        admit = decision
        return Admit(admit.request, admit.route, admit.grant, admit.positions, headers)

    def _route(self, request: HttpRequest) -> Reply | Admit | ReadBody:
        """Parse the request's route (once), then decide what the relay's state says of it."""
        route = self.parse(
            request.method,
            request.path,
            request.query,
            upgrade=request.upgrade,
            last_event_id=request.header("last-event-id"),
        )
        if isinstance(route, Refusal):
            return self._refused(request, route)
        if isinstance(route, _PAGES):
            reply = self._page(route)
            if reply is None:
                return self.refuse(
                    request,
                    404,
                    f"no endpoint at {request.path}; use {PRODUCE_PATH} or {SUBSCRIBE_PATH}",
                )
            if request.method not in PLAIN_METHODS:
                return self.refuse(
                    request, 405, f"{request.path} takes GET", (("Allow", "GET, HEAD"),)
                )
            return reply
        if isinstance(route, routes.DeadLetters):
            return self._operator(request, route)
        produce = isinstance(route, _PRODUCERS)
        decision = self._decide(Role.PRODUCE if produce else Role.SUBSCRIBE, request, route)
        if isinstance(decision, Refusal):
            return self._refused(request, decision)
        if isinstance(route, _AI_SDK_CHANNELS) and not decision.allows(route.channel):
            return self.refuse(request, 403, "this token does not grant the channel")
        if isinstance(route, _READ_BODIES):
            return ReadBody(request, route, decision)
        if isinstance(route, routes.Sse) and route.resume:
            try:
                positions = decode_positions(route.resume, set(route.channels))
            except FrameRejected as exc:
                return self.refuse(request, 400, exc.message)
            return Admit(request, route, decision, positions)
        return Admit(request, route, decision)

    def _page(
        self, route: routes.Health | routes.Ready | routes.MetricsPage | routes.Static
    ) -> Reply | None:
        if isinstance(route, routes.Health):
            return Reply.text(200, "ok")
        if isinstance(route, routes.Ready):
            if self.ready():
                return Reply.text(200, "ready")
            return Reply.text(503, "broker unreachable")
        if isinstance(route, routes.MetricsPage):
            return Reply(200, self.metrics.render(), METRICS_TYPE)
        found = self.web.files.get(route.path) if self.web else None
        if found is None:
            return None
        content_type, body = found
        return Reply(200, body, content_type, (("Cache-Control", "no-cache"),))

    def refuse(
        self,
        request: HttpRequest,
        status: int,
        reason: str,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> Reply:
        """Log a refusal (the client, the path and the reason; never the query, which may
        hold a token), within the client's budget of lines (:class:`RefusalLog`), and build
        its response."""
        self.refusal_log.log(
            request.client,
            "refused %s %s from %s: %d %s",
            request.method,
            request.path,
            request.client,
            status,
            reason,
            method=request.method,
            path=request.path,
            status=status,
            reason=reason,
        )
        self.metrics.refusals.labels(str(status)).inc()
        return Reply.text(status, reason, headers)

    def _refused(self, request: HttpRequest, refusal: Refusal) -> Reply:
        return self.refuse(request, refusal.status, refusal.reason, refusal.headers)

    def _operator(self, request: HttpRequest, route: routes.DeadLetters) -> Reply | ReadBody:
        """``GET`` (list) or ``POST`` (replay) the dead letters: with a secret, an ``admin``
        token; without one, from a loopback address only."""
        if self.settings.open_access:
            if not _loopback(request.client):
                return self.refuse(
                    request, 403, "without --secret the dead letters are for loopback only"
                )
            return ReadBody(request, route, OPEN)
        token = route.token or _bearer(request)
        if not token:
            return self.refuse(request, 401, "an admin token is required")
        try:
            grant = verify(token, self.settings.secret)
        except InvalidToken as exc:
            return self.refuse(request, 401, f"invalid token: {exc}")
        if grant.role is not Role.ADMIN:
            return self.refuse(request, 403, f"this token's role is '{grant.role}', not 'admin'")
        return ReadBody(request, route, grant)

    def _decide(self, role: Role, request: HttpRequest, route: routes.Admitted) -> Grant | Refusal:
        """The grant of an admitted request, or its refusal."""
        if self.per_address.get(request.client, 0) >= self.settings.max_connections_per_ip:
            return Refusal(429, "too_many_connections", "too many connections from this address")
        if route.fault is not None:
            return route.fault
        if self.settings.open_access:
            return OPEN
        token = route.token or _bearer(request)
        if not token:
            return Refusal(
                401, "token_required", "a token is required: ?token= or Authorization: Bearer"
            )
        try:
            grant = verify(token, self.settings.secret)
        except InvalidToken as exc:
            return Refusal(401, "invalid_token", f"invalid token: {exc}")
        if grant.role is not role:
            return Refusal(403, "wrong_role", f"this token's role is '{grant.role}', not '{role}'")
        channel = route.channel if isinstance(route, _PRODUCERS) else None
        if channel is not None and not grant.allows(channel):
            return Refusal(403, "forbidden", "this token does not grant the URL's channel")
        return grant

    def admit(self, connection: Peer) -> None:
        """Count an open connection against its client address."""
        self.count(connection.client)

    def release(self, connection: Peer) -> None:
        """Uncount a connection that closed."""
        self.uncount(connection.client)

    def count(self, address: str) -> None:
        """Count a connection of ``address``: a WebSocket, a stream, or a request whose body
        is read (an HTTP producer's, as long as it streams)."""
        self.per_address[address] = self.per_address.get(address, 0) + 1

    def uncount(self, address: str) -> None:
        """Uncount what :meth:`count` counted."""
        left = self.per_address.get(address, 1) - 1
        if left > 0:
            self.per_address[address] = left
        else:
            self.per_address.pop(address, None)


def _stream_error(
    status: int, code: str, message: str, headers: tuple[tuple[str, str], ...] = ()
) -> Reply:
    """A refused Durable Streams request: an ``error`` frame, as JSON."""
    body = json.dumps({"type": "error", "code": code, "message": message})
    return Reply(status, body.encode(), "application/json", headers)


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _bearer(request: HttpRequest) -> str:
    scheme, _, value = request.header("authorization").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""
