"""The HTTP side of the port: admission of WebSocket handshakes, and plain GET endpoints.

Before a handshake completes the relay decides, in this order:

1. ``/healthz``, ``/readyz`` and ``/metrics`` are answered as plain HTTP.
2. Any path other than ``/produce`` and ``/subscribe`` is a static file of
   ``--web-root``, or 404.
3. More than ``--max-connections-per-ip`` open connections from the client's
   address: 429.
4. A malformed ``?channel=``: 400.
5. With ``--secret``: no token, a bad one or an expired one is 401; a token for
   the other role, or one that doesn't grant the URL's ``?channel=``, is 403.

The ``Origin`` check (``--allowed-origin``) is websockets' own and answers 403.
A refused handshake never opens a socket. Query strings, which may carry a
token, are never logged.

The grant an admitted handshake earns is kept on its connection
(:class:`RelayConnection`), never in a table: a handshake refused after this check
(by the ``Origin`` check, or for a missing ``Sec-WebSocket-Key``) leaves nothing
behind. A connection without a grant is refused, never taken as allowed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from ..core.errors import InvalidToken
from ..core.forwarded import client_address, parse_networks
from ..core.grants import OPEN, Grant, Role
from ..core.protocol import MAX_NAME_LENGTH
from ..core.settings import Settings
from .metrics import Metrics
from .tokens import verify
from .web import StaticFiles, with_body

__all__ = ["PRODUCE_PATH", "SUBSCRIBE_PATH", "Gate", "RelayConnection", "client_of", "query_of"]

PRODUCE_PATH = "/produce"
SUBSCRIBE_PATH = "/subscribe"
ROLES = {PRODUCE_PATH: Role.PRODUCE, SUBSCRIBE_PATH: Role.SUBSCRIBE}

log = logging.getLogger("token_relay")


class RelayConnection(ServerConnection):
    """A WebSocket connection that carries the grant its handshake earned."""

    grant: Grant | None = None
    """Set by :meth:`Gate.check` when it admits the handshake; None means refused."""
    client: str | None = None
    """The client's address: the peer's, or the one a trusted proxy forwarded for."""
    max_unsent: int = 0
    """Unsent bytes past which the peer is cut, whatever it sends (0: no limit)."""

    def data_received(self, data: bytes) -> None:
        """Feed the protocol, then cut a peer that sends faster than it reads.

        Pings are answered with pongs whether or not the peer reads them, so a peer that
        never reads can grow its outgoing buffer with any frame at all; past
        ``max_unsent`` it is cut at once (a close frame could not reach it anyway).
        """
        super().data_received(data)
        transport = self.transport
        if self.max_unsent and transport.get_write_buffer_size() > self.max_unsent:
            self.logger.warning("cutting %s: %d bytes unsent", self.client, self.max_unsent)
            transport.abort()


def query_of(path: str) -> dict[str, list[str]]:
    """The query string of a request path, as lists of values."""
    return parse_qs(urlsplit(path).query, keep_blank_values=True)


class Gate:
    """Decides each handshake, and counts the open connections of each client address."""

    def __init__(self, settings: Settings, metrics: Metrics, ready: Callable[[], bool]) -> None:
        self.settings = settings
        self.metrics = metrics
        self.ready = ready
        self.web = StaticFiles(Path(settings.web_root)) if settings.web_root else None
        self.per_address: dict[str, int] = {}
        self.trusted = parse_networks(settings.trusted_proxies)

    def check(self, connection: ServerConnection, request: Request) -> Response | None:
        """websockets' ``process_request``: a response refuses the handshake.

        An admitted handshake gets its grant set on the connection.
        """
        path = urlsplit(request.path).path
        if path == "/healthz":
            return connection.respond(HTTPStatus.OK, "ok\n")
        if path == "/readyz":
            if self.ready():
                return connection.respond(HTTPStatus.OK, "ready\n")
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "broker unreachable\n")
        if path == "/metrics":
            return with_body(
                connection.respond(HTTPStatus.OK, ""),
                self.metrics.render(),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        role = ROLES.get(path)
        if role is None:
            page = self.web.respond(connection, path) if self.web else None
            return page or connection.respond(
                HTTPStatus.NOT_FOUND, f"no endpoint at {path}; use /produce or /subscribe\n"
            )
        client = client_address(_peer(connection), list(request.headers.raw_items()), self.trusted)
        if isinstance(connection, RelayConnection):
            connection.client = client
            connection.max_unsent = self.settings.max_subscriber_buffer_bytes
        decision = self._decide(role, request, client)
        if isinstance(decision, Grant):
            return self._grant(connection, decision)
        status, reason = decision
        # A refusal names the peer, the path and the reason; never the query (a token).
        log.info(
            "refused %s from %s: %d %s",
            path,
            client,
            status,
            reason,
            extra={
                "event": "refused",
                "peer": client,
                "path": path,
                "status": int(status),
                "reason": reason,
            },
        )
        return connection.respond(status, reason + "\n")

    def _decide(self, role: Role, request: Request, client: str) -> Grant | tuple[HTTPStatus, str]:
        """The grant of an admitted handshake, or the status and reason of its refusal."""
        if self.per_address.get(client, 0) >= self.settings.max_connections_per_ip:
            return HTTPStatus.TOO_MANY_REQUESTS, "too many connections from this address"
        query = query_of(request.path)
        channels = query.get("channel", [])
        if role is Role.PRODUCE and len(channels) > 1:
            return HTTPStatus.BAD_REQUEST, "give at most one ?channel="
        for channel in channels:
            if not 1 <= len(channel) <= MAX_NAME_LENGTH:
                return (
                    HTTPStatus.BAD_REQUEST,
                    f"?channel= must be 1 to {MAX_NAME_LENGTH} characters",
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

    def _grant(self, connection: ServerConnection, grant: Grant) -> Response | None:
        if not isinstance(connection, RelayConnection):
            return connection.respond(HTTPStatus.INTERNAL_SERVER_ERROR, "no place for a grant\n")
        connection.grant = grant
        return None

    def admit(self, connection: ServerConnection) -> None:
        """Count an admitted connection against its client address."""
        address = client_of(connection)
        self.per_address[address] = self.per_address.get(address, 0) + 1

    def release(self, connection: ServerConnection) -> None:
        """Uncount a connection that closed."""
        address = client_of(connection)
        left = self.per_address.get(address, 1) - 1
        if left > 0:
            self.per_address[address] = left
        else:
            self.per_address.pop(address, None)


def _peer(connection: ServerConnection) -> str:
    remote = connection.remote_address
    return str(remote[0]) if remote else "unknown"


def client_of(connection: ServerConnection) -> str:
    """The address a connection counts and logs as (see ``--trusted-proxy``)."""
    client = connection.client if isinstance(connection, RelayConnection) else None
    return client or _peer(connection)


def _bearer(request: Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""
