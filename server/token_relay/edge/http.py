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

import dataclasses
import ipaddress
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from ..core.errors import FrameRejected, InvalidToken
from ..core.forwarded import Network, client_address
from ..core.grants import OPEN, Grant, Role
from ..core.protocol import MAX_NAME_LENGTH
from ..core.resume import decode_positions
from ..core.settings import Settings
from ..tokens import verify
from .aisdk import MAX_WAIT_SECONDS
from .logs import RefusalLog
from .metrics import Metrics
from .peer import Peer
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
    "query_of",
]

PRODUCE_PATH = "/produce"
SUBSCRIBE_PATH = "/subscribe"
SSE_PATH = "/sse"
CANCEL_PATH = "/cancel"
DEAD_LETTERS_PATH = "/webhooks/dead"
AI_SDK_PREFIX = "/ai-sdk/"
ROLES = {PRODUCE_PATH: Role.PRODUCE, SUBSCRIBE_PATH: Role.SUBSCRIBE}
PLAIN_METHODS = frozenset({"GET", "HEAD"})
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"

log = logging.getLogger("token_relay")

MAX_QUERY_DIGITS = 9
"""Digits a numeric query argument may have (``?rewind=``, ``?wait=``): more get 400."""
MAX_QUERY_NUMBER = 10**MAX_QUERY_DIGITS - 1


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

    @classmethod
    def of(
        cls,
        method: str,
        target: str,
        headers: Sequence[tuple[str, str]],
        peer: str,
        trusted: Sequence[Network],
    ) -> HttpRequest:
        """A request from ``peer``; the client is worked out from ``--trusted-proxy``."""
        lowered = tuple((name.lower(), value) for name, value in headers)
        return cls(
            method, target, urlsplit(target).path, lowered, client_address(peer, lowered, trusted)
        )

    def header(self, name: str) -> str:
        """The last value of a header, or ''."""
        found = ""
        for key, value in self.headers:
            if key == name:
                found = value
        return found

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


@dataclass(frozen=True, slots=True)
class Admit:
    """An admitted WebSocket handshake or SSE stream, and the grant it earned."""

    request: HttpRequest
    role: Role
    grant: Grant
    positions: dict[str, tuple[int, str]] | None = None
    """For an SSE stream: where to resume each channel (``Last-Event-ID`` or ``?since=``);
    None for a WebSocket."""
    stream: str = ""
    """``sse`` or ``ai-sdk`` for a streamed response."""
    channel: str = ""
    """The channel named in the path (``/ai-sdk/{channel}/…``)."""
    headers: tuple[tuple[str, str], ...] = ()
    """Headers the response carries (CORS)."""


@dataclass(frozen=True, slots=True)
class ReadBody:
    """An admitted request whose route takes a body (``POST /cancel``, Stop)."""

    request: HttpRequest
    grant: Grant
    channel: str = ""
    """The channel named in the path, if any."""
    stream: bool = False
    """The body is applied as it arrives (``POST /produce``), not read whole first."""
    headers: tuple[tuple[str, str], ...] = ()
    """Headers the response carries (CORS)."""
    operator: bool = False
    """An operator's request (``/webhooks/dead``), admitted as such."""


def query_of(path: str) -> dict[str, list[str]]:
    """The query string of a request path, as lists of values."""
    return parse_qs(urlsplit(path).query, keep_blank_values=True)


def whole_number(text: str) -> int | None:
    """A query argument as a whole number of at most :data:`MAX_QUERY_DIGITS` ASCII digits,
    or None. ``str.isdigit`` alone would let through ``²`` (which ``int`` refuses) and
    thousands of digits (which ``int`` refuses past its own limit, after quadratic work)."""
    if not 1 <= len(text) <= MAX_QUERY_DIGITS or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def seconds_of(text: str, most: float) -> float | None:
    """A query argument as seconds, ``0`` to ``most`` (ASCII digits, at most one ``.``), or
    None: never ``nan``, ``inf``, an exponent or digits of another script."""
    whole, _, fraction = text.partition(".")
    if (
        not text
        or len(text) > MAX_QUERY_DIGITS
        or not (whole + fraction).isascii()
        or not (whole + fraction).isdigit()
    ):
        return None
    value = float(text)
    return value if value <= most else None


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

    def route(self, request: HttpRequest) -> Reply | Admit | ReadBody:
        """The response to a request, the admission of its WebSocket handshake or SSE
        stream, or of its body.

        The HTTP surfaces a browser may call from another origin (``/sse``, ``/ai-sdk/…``,
        ``/cancel``, ``POST /produce``) answer CORS: a preflight ``OPTIONS`` gets 204, and
        every response names the request's ``Origin`` as allowed, if ``--allowed-origin``
        allows it (any, when none is given); another origin gets 403.
        """
        if _cross_origin(request):
            return self._cors(request)
        return self._route(request)

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
        if isinstance(decision, Reply):
            return dataclasses.replace(decision, headers=decision.headers + headers)
        return dataclasses.replace(decision, headers=headers)

    def _route(self, request: HttpRequest) -> Reply | Admit | ReadBody:
        path, method = request.path, request.method
        if path == SSE_PATH:
            return self._sse(request)
        if path.startswith(AI_SDK_PREFIX):
            return self._ai_sdk(request)
        if path == CANCEL_PATH:
            if method != "POST":
                return self.refuse(request, 405, f"{path} takes POST", (("Allow", "POST"),))
            decision = self._decide(Role.SUBSCRIBE, request)
            if isinstance(decision, Grant):
                return ReadBody(request, decision)
            status, reason = decision
            return self.refuse(request, status, reason)
        if path == DEAD_LETTERS_PATH:
            return self._operator(request)
        role = ROLES.get(path)
        if role is Role.PRODUCE and method == "POST":
            decision = self._decide(role, request)
            if isinstance(decision, Grant):
                return ReadBody(request, decision, stream=True)
            status, reason = decision
            return self.refuse(request, status, reason)
        if role is not None:
            if method != "GET":
                return self.refuse(request, 405, f"{path} takes GET", (("Allow", "GET"),))
            if not request.upgrade:
                return self.refuse(
                    request,
                    426,
                    f"{path} is a WebSocket endpoint: send Upgrade: websocket",
                    (("Upgrade", "websocket"), ("Connection", "Upgrade")),
                )
            decision = self._decide(role, request)
            if isinstance(decision, Grant):
                return Admit(request, role, decision)
            status, reason = decision
            return self.refuse(request, status, reason)
        reply = self._plain(path)
        if reply is None:
            return self.refuse(
                request, 404, f"no endpoint at {path}; use {PRODUCE_PATH} or {SUBSCRIBE_PATH}"
            )
        if method not in PLAIN_METHODS:
            return self.refuse(request, 405, f"{path} takes GET", (("Allow", "GET, HEAD"),))
        return reply

    def _ai_sdk(self, request: HttpRequest) -> Reply | Admit | ReadBody:
        """``GET /ai-sdk/{channel}/stream`` and ``POST /ai-sdk/{channel}/stop``."""
        name, _, action = request.path.removeprefix(AI_SDK_PREFIX).partition("/")
        channel = unquote(name)
        if action not in ("stream", "stop") or not channel:
            return self.refuse(request, 404, f"use {AI_SDK_PREFIX}CHANNEL/stream or /stop")
        method = "GET" if action == "stream" else "POST"
        if request.method != method:
            return self.refuse(request, 405, f"{request.path} takes {method}", (("Allow", method),))
        if len(channel) > MAX_NAME_LENGTH:
            return self.refuse(request, 400, f"a channel is 1 to {MAX_NAME_LENGTH} characters")
        wait = query_of(request.target).get("wait", [""])[-1] or "0"
        if action == "stream" and seconds_of(wait, MAX_WAIT_SECONDS) is None:
            return self.refuse(request, 400, f"?wait= must be seconds, 0 to {MAX_WAIT_SECONDS:g}")
        decision = self._decide(Role.SUBSCRIBE, request)
        if not isinstance(decision, Grant):
            status, reason = decision
            return self.refuse(request, status, reason)
        if not decision.allows(channel):
            return self.refuse(request, 403, "this token does not grant the channel")
        if action == "stop":
            return ReadBody(request, decision, channel)
        return Admit(request, Role.SUBSCRIBE, decision, {}, "ai-sdk", channel)

    def _sse(self, request: HttpRequest) -> Reply | Admit:
        """``GET /sse``: a stream of every channel named, resumed where its token says."""
        if request.method != "GET":
            return self.refuse(request, 405, f"{SSE_PATH} takes GET", (("Allow", "GET"),))
        query = query_of(request.target)
        if not query.get("channel"):
            return self.refuse(request, 400, "give at least one ?channel=")
        decision = self._decide(Role.SUBSCRIBE, request)
        if not isinstance(decision, Grant):
            status, reason = decision
            return self.refuse(request, status, reason)
        token = request.header("last-event-id") or query.get("since", [""])[-1]
        try:
            positions = decode_positions(token, set(query["channel"])) if token else {}
        except FrameRejected as exc:
            return self.refuse(request, 400, exc.message)
        return Admit(request, Role.SUBSCRIBE, decision, positions, "sse")

    def _plain(self, path: str) -> Reply | None:
        if path == "/healthz":
            return Reply.text(200, "ok")
        if path == "/readyz":
            if self.ready():
                return Reply.text(200, "ready")
            return Reply.text(503, "broker unreachable")
        if path == "/metrics":
            return Reply(200, self.metrics.render(), METRICS_TYPE)
        found = self.web.files.get(path) if self.web else None
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

    def _operator(self, request: HttpRequest) -> Reply | ReadBody:
        """``GET`` (list) or ``POST`` (replay) the dead letters: with a secret, an ``admin``
        token; without one, from a loopback address only."""
        if request.method not in ("GET", "POST"):
            return self.refuse(
                request, 405, f"{request.path} takes GET or POST", (("Allow", "GET, POST"),)
            )
        if self.settings.open_access:
            if not _loopback(request.client):
                return self.refuse(
                    request, 403, "without --secret the dead letters are for loopback only"
                )
            return ReadBody(request, OPEN, operator=True)
        token = query_of(request.target).get("token", [""])[-1] or _bearer(request)
        if not token:
            return self.refuse(request, 401, "an admin token is required")
        try:
            grant = verify(token, self.settings.secret)
        except InvalidToken as exc:
            return self.refuse(request, 401, f"invalid token: {exc}")
        if grant.role is not Role.ADMIN:
            return self.refuse(request, 403, f"this token's role is '{grant.role}', not 'admin'")
        return ReadBody(request, grant, operator=True)

    def _decide(self, role: Role, request: HttpRequest) -> Grant | tuple[HTTPStatus, str]:
        """The grant of an admitted handshake, or the status and reason of its refusal."""
        if self.per_address.get(request.client, 0) >= self.settings.max_connections_per_ip:
            return HTTPStatus.TOO_MANY_REQUESTS, "too many connections from this address"
        query = query_of(request.target)
        channels = query.get("channel", [])
        if role is Role.PRODUCE and len(channels) > 1:
            return HTTPStatus.BAD_REQUEST, "give at most one ?channel="
        for channel in channels:
            if not 1 <= len(channel) <= MAX_NAME_LENGTH:
                return (
                    HTTPStatus.BAD_REQUEST,
                    f"?channel= must be 1 to {MAX_NAME_LENGTH} characters",
                )
        rewind = query.get("rewind", ["1"])[-1]
        if whole_number(rewind) is None or int(rewind) < 1:
            return (
                HTTPStatus.BAD_REQUEST,
                f"?rewind= must be a whole number of messages, 1 to {MAX_QUERY_NUMBER}",
            )
        if self.settings.open_access:
            return OPEN
        token = query.get("token", [""])[-1] or _bearer(request)
        if not token:
            return HTTPStatus.UNAUTHORIZED, "a token is required: ?token= or Authorization: Bearer"
        try:
            grant = verify(token, self.settings.secret)
        except InvalidToken as exc:
            return HTTPStatus.UNAUTHORIZED, f"invalid token: {exc}"
        if grant.role is not role:
            return HTTPStatus.FORBIDDEN, f"this token's role is '{grant.role}', not '{role}'"
        if role is Role.PRODUCE and channels and not grant.allows(channels[0]):
            return HTTPStatus.FORBIDDEN, "this token does not grant the URL's channel"
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


def _cross_origin(request: HttpRequest) -> bool:
    """Whether the request is for a surface a browser may call from another origin."""
    path = request.path
    return (
        path in (SSE_PATH, CANCEL_PATH)
        or path.startswith(AI_SDK_PREFIX)
        or (path == PRODUCE_PATH and request.method in ("POST", "OPTIONS"))
    )


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _bearer(request: HttpRequest) -> str:
    scheme, _, value = request.header("authorization").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""
