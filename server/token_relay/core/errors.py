"""Every exception token-relay raises, the client library's included, and the error codes.

The tree::

    RelayError                      root; ``blame`` says whose fault it is
    ├── ConfigError                 LOCAL: a setting or limit is invalid; the relay won't
    │                               start (also a ValueError)
    ├── UsageError                  LOCAL: our caller passed a value of the wrong type
    │                               (also a TypeError)
    ├── InvalidResponse             LOCAL: the relay built an HTTP response HTTP/1.1 rules
    │                               out; the client gets a bare refusal instead
    ├── PeerError                   PEER: the other side broke the rules
    │   ├── BadRequest              a request broke HTTP/1.1 (or its head is too big);
    │   │                           ``status`` is the HTTP status that answers it
    │   ├── FrameRejected           a peer's frame or event was refused; the relay
    │   │                           answers it with an ``error`` frame and keeps serving
    │   ├── PartRejected            a chunk for a message's parts was refused (``code``
    │   │                           a str: ``invalid_chunk``, ``unknown_part``...)
    │   ├── StreamRefused           a Durable Streams request was refused and changed
    │   │   │                       nothing (``status`` its HTTP status, ``code`` a str)
    │   │   └── SubscriptionError   one of its subscription APIs' (``/v1/stream/__ds/``),
    │   │                           answered ``{"error": {"code": …}}``
    │   ├── InvalidToken            a connection token is missing, malformed, badly
    │   │                           signed or expired; the handshake gets 401
    │   ├── RelayProtocolError      (client) the relay sent what the protocol rules out
    │   └── HandshakeRefused        (client) the relay refused the connection for good
    │                               (HTTP 401, 403 or 404): retrying would not help
    ├── MessageFailed               PEER: (client) the relay gave a message up for good
    │                               (aborted, refused); ``code`` is the error code
    └── BrokerUnavailable           WORLD: the shared broker can't be reached; what was
                                    asked did not happen, and asking again later may work

Blame follows h11's split of local and remote protocol errors, with trio's third
party added: :attr:`Blame.LOCAL` is our own side (our operator's settings, our
caller), :attr:`Blame.PEER` is the other end of a connection, and
:attr:`Blame.WORLD` is neither: the network or a broker that is down.

Refusals: values or exceptions
------------------------------
One rule decides. A refusal that changes **no** state is raised, as a
:class:`FrameRejected`: the caller unwinds, answers an ``error`` frame and goes
on with the next frame. An outcome that **did** change state is returned as a
value, even when it also carries an error for the peer (a delta that takes its
message past the size limit aborts the message: that is a returned
:class:`~token_relay.core.streams.Overflow`). At the HTTP edge, a refused
handshake is a value too: the response that refuses it.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "BadRequest",
    "Blame",
    "BrokerUnavailable",
    "ConfigError",
    "ErrorCode",
    "FrameRejected",
    "HandshakeRefused",
    "InvalidResponse",
    "InvalidToken",
    "MessageFailed",
    "PartRejected",
    "PeerError",
    "RelayError",
    "RelayProtocolError",
    "StreamRefused",
    "SubscriptionError",
    "UsageError",
    "binary_rejected",
    "broker_rejected",
    "id_in_use",
]


class ErrorCode(StrEnum):
    """Stable, machine-readable codes carried by ``error`` frames."""

    INVALID_JSON = "invalid_json"
    INVALID_EVENT = "invalid_event"
    INVALID_FRAME = "invalid_frame"
    UNKNOWN_FRAME = "unknown_frame"
    BINARY_NOT_SUPPORTED = "binary_not_supported"
    CHANNEL_REQUIRED = "channel_required"
    CHANNEL_MISMATCH = "channel_mismatch"
    TOO_MANY_MESSAGES = "too_many_messages"
    TOO_MANY_CHANNELS = "too_many_channels"
    MESSAGE_ABORTED = "message_aborted"
    UNKNOWN_MESSAGE = "unknown_message"
    NOT_SUBSCRIBED = "not_subscribed"
    BROKER_UNAVAILABLE = "broker_unavailable"
    FORBIDDEN = "forbidden"
    RATE_LIMITED = "rate_limited"
    MESSAGE_TOO_LARGE = "message_too_large"
    SEQ_GAP = "seq_gap"
    ID_IN_USE = "id_in_use"
    OVERLOADED = "overloaded"
    LINE_TOO_LONG = "line_too_long"
    BODY_TOO_LARGE = "body_too_large"
    TOO_MANY_PRODUCERS = "too_many_producers"
    PRODUCER_BUSY = "producer_busy"
    PRODUCER_MOVED = "producer_moved"
    RELAY_STOPPING = "relay_stopping"
    INVALID_CHUNK = "invalid_chunk"
    UNKNOWN_PART = "unknown_part"
    PART_ENDED = "part_ended"
    PART_EXISTS = "part_exists"
    TOO_MANY_PARTS = "too_many_parts"
    PART_TOO_LARGE = "part_too_large"
    INVALID_SSE = "invalid_sse"
    NO_PRODUCER = "no_producer"
    NO_REPLY = "no_reply"
    TOO_MANY_REQUESTS = "too_many_requests"
    REQUEST_IN_PROGRESS = "request_in_progress"
    UNKNOWN_SEQUENCE = "unknown_sequence"


class Blame(StrEnum):
    """Whose fault an error is."""

    LOCAL = "local"
    """Ours: our operator's settings or our own caller."""
    PEER = "peer"
    """The other end of the connection."""
    WORLD = "world"
    """Neither: the network, or a broker that is down. Trying again later may work."""


class RelayError(Exception):
    """Root of every exception token-relay raises on purpose."""

    blame: Blame = Blame.LOCAL


class ConfigError(RelayError, ValueError):
    """A setting or a limit is invalid, so the relay (or that part of it) refuses to start."""

    blame = Blame.LOCAL


class UsageError(RelayError, TypeError):
    """Our caller passed a value of the wrong type (the core assumes well-formed input), or
    used a client in a way it can't serve (an event too large for the relay's frames)."""

    blame = Blame.LOCAL


class PeerError(RelayError):
    """The other end of a connection broke the protocol's rules."""

    blame = Blame.PEER


class InvalidResponse(RelayError):
    """The relay built an HTTP response that HTTP/1.1 rules out (a body for ``HEAD``, a
    header value with bad characters, a second response to one request)."""

    blame = Blame.LOCAL


class BadRequest(PeerError):
    """A request broke HTTP/1.1, or its head passed the size limit. ``status`` is the
    HTTP status that answers it (400, 431, 501)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class FrameRejected(PeerError):
    """A peer's frame broke the protocol; it is answered with an error frame."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        message_id: str | None = None,
        index: int | None = None,
        *,
        expected: int | None = None,
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.message_id = message_id
        self.index = index
        """The event's position in a batch frame, if it came in one."""
        self.expected = expected
        """For ``seq_gap``: the seq the relay expects next for that message."""
        self.line = line
        """For an NDJSON request body: the refused line's number, from 1."""


class PartRejected(PeerError):
    """A chunk for a message's parts was refused, and changed nothing.

    ``code`` says why, as a plain string (see :data:`token_relay.core.parts.CODES`);
    the edge maps it to an ``error`` frame.
    """

    def __init__(self, code: str, message: str, part_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.part_id = part_id
        """The chunk id or tool call id the chunk named, if any."""


class StreamRefused(PeerError):
    """A Durable Streams request (``/v1/stream/...``) was refused, and changed nothing.

    ``status`` is its HTTP status, ``code`` a machine-readable code (see the errors
    reference), and ``headers`` the protocol's headers the refusal carries
    (``Stream-Closed``, ``Producer-Epoch``, ``Producer-Expected-Seq``...).
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


class SubscriptionError(StreamRefused):
    """A refused Durable Streams subscription request: its body is ``{"error": {"code":
    CODE, ...}}``, the protocol's shape for these APIs (``details`` are more fields of
    ``error``: ``current_holder``, ``generation``)."""

    def __init__(self, status: int, code: str, message: str, **details: object) -> None:
        super().__init__(status, code, message)
        self.details = details


class InvalidToken(PeerError):
    """The token is missing, malformed, badly signed, expired, or lacks a claim."""


class RelayProtocolError(PeerError):
    """(Client side) the relay sent a frame the protocol does not allow there."""


class HandshakeRefused(PeerError):
    """(Client side) the relay refused the connection with a status retrying won't change."""

    def __init__(self, status: int, url: str) -> None:
        super().__init__(f"the relay refused the connection to {url} with HTTP {status}")
        self.status = status


class MessageFailed(RelayError):
    """(Client side) the relay gave a message up for good; ``code`` says why."""

    blame = Blame.PEER

    def __init__(self, message_id: str, code: str, reason: str) -> None:
        super().__init__(f"message '{message_id}' failed: {code}: {reason}")
        self.message_id = message_id
        self.code = code


class BrokerUnavailable(RelayError):
    """The broker could not be reached; what was asked of it did not happen."""

    blame = Blame.WORLD


def binary_rejected() -> FrameRejected:
    """A binary frame: the protocol is JSON text."""
    return FrameRejected(
        ErrorCode.BINARY_NOT_SUPPORTED, "binary frames are not supported; send JSON text frames"
    )


def id_in_use(channel: str, message_id: str) -> FrameRejected:
    """Another producer holds this id in this channel: its message is in progress, or
    completed within ``--id-hold`` (and this is not that very message again)."""
    return FrameRejected(
        ErrorCode.ID_IN_USE,
        f"message '{message_id}' on channel '{channel}' is another producer's (in progress, "
        "or completed within --id-hold); use another id",
        message_id,
    )


def broker_rejected(message_id: str | None) -> FrameRejected:
    """What could not be done because the broker is unreachable.

    The peer did nothing wrong, but the answer is still an ``error`` frame for the
    peer's request, so it travels as a :class:`FrameRejected`.
    """
    return FrameRejected(
        ErrorCode.BROKER_UNAVAILABLE,
        "the relay's broker is unreachable or did not answer in time; send it again shortly"
        " (a final that was published after all is acked, and not published twice)",
        message_id,
    )
