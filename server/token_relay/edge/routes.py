"""A request's route: its method and target, parsed once into what it asks for.

:func:`parse_route` turns the method, the path and the query string of a request (and
the two header facts routing needs: whether it asks for a WebSocket, and its
``Last-Event-ID``) into one frozen value per kind of route, or into the
:class:`Refusal` of a request that no route takes. It does no I/O and holds no state:
whatever depends on the relay (the token's grant, the connections an address holds, the
files of ``--web-root``) is the :class:`~token_relay.edge.http.Gate`'s to decide, and
whatever the route says is what the relay dispatches on. The query string is parsed
here and nowhere else.

Routes
------
=========================================  ==============================
``GET /produce`` (WebSocket)               :class:`Produce`
``POST /produce``                          :class:`HttpProduce`
``GET /subscribe`` (WebSocket)             :class:`Subscribe`
``GET /sse``                               :class:`Sse`
``GET /ai-sdk/{channel}/stream``           :class:`AiSdkStream`
``POST /ai-sdk/{channel}/stop``            :class:`AiSdkStop`
``GET /ai-sdk/{channel}/messages``         :class:`AiSdkMessages`
``POST /ai-sdk/{channel}/produce``         :class:`AiSdkProduce`
``GET /ai-sdk/ws`` (WebSocket)             :class:`AiSdkSocket`
``POST /cancel``                           :class:`Cancel`
``GET``/``POST /webhooks/dead``            :class:`DeadLetters`
any method on ``/v1/stream/{path}``        :class:`StreamRequest` (Durable Streams)
``/healthz``, ``/readyz``, ``/metrics``    :class:`Health`, :class:`Ready`, :class:`MetricsPage`
anything else                              :class:`Static` (a file of ``--web-root``, or 404)
=========================================  ==============================

Query arguments
---------------
A repeated argument takes its last value, an empty one included (``?rewind=`` is
refused, ``?wait=`` is 0). Numbers are ASCII digits only (never ``²``, ``nan`` or an
exponent), at most :data:`MAX_QUERY_DIGITS` of them.

A malformed ``?channel=`` or ``?rewind=`` on a route that admits a peer is not refused
here but carried as the route's :attr:`Admitted.fault`: the gate refuses it after its
count of the address's connections (429 first), as it always has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote

from ..core.protocol import MAX_NAME_LENGTH

__all__ = [
    "AI_SDK_PREFIX",
    "AI_SDK_SOCKET_PATH",
    "CANCEL_PATH",
    "DEAD_LETTERS_PATH",
    "MAX_QUERY_DIGITS",
    "MAX_QUERY_NUMBER",
    "MAX_STREAM_PATH",
    "MAX_WAIT_SECONDS",
    "PRODUCE_PATH",
    "SSE_PATH",
    "STREAM_PREFIX",
    "SUBSCRIBE_PATH",
    "Admitted",
    "AiSdkMessages",
    "AiSdkProduce",
    "AiSdkSocket",
    "AiSdkStop",
    "AiSdkStream",
    "Cancel",
    "DeadLetters",
    "Health",
    "HttpProduce",
    "MetricsPage",
    "Produce",
    "Ready",
    "Refusal",
    "Route",
    "Sse",
    "Static",
    "StreamRequest",
    "Subscribe",
    "cross_origin",
    "parse_route",
    "seconds_of",
    "whole_number",
]

PRODUCE_PATH = "/produce"
SUBSCRIBE_PATH = "/subscribe"
SSE_PATH = "/sse"
CANCEL_PATH = "/cancel"
DEAD_LETTERS_PATH = "/webhooks/dead"
AI_SDK_PREFIX = "/ai-sdk/"
MAX_UI_MESSAGES = 1000
"""Replies ``GET /ai-sdk/{channel}/messages`` returns at most (and by default); it returns no
more than the channel's history holds (``--history-size``)."""
AI_SDK_SOCKET_PATH = "/ai-sdk/ws"
STREAM_PREFIX = "/v1/stream/"
"""Where the Durable Streams protocol's streams are (:mod:`token_relay.edge.durable`)."""
_SELF_AUTHORIZED = re.compile(
    r"/v1/stream/__ds/(jwks\.json|subscriptions/[^/]+/(callback|ack|release))"
)
MAX_STREAM_PATH = 1024
"""Characters of a durable stream's path (``/v1/stream/`` included), as sent."""

MAX_QUERY_DIGITS = 9
"""Digits a numeric query argument may have (``?rewind=``, ``?wait=``): more get 400."""
MAX_QUERY_NUMBER = 10**MAX_QUERY_DIGITS - 1
MAX_WAIT_SECONDS = 30.0
"""The longest ``?wait=`` of an AI SDK stream."""

_TRUE = frozenset({"1", "true", "yes", "on"})
"""What ``?deltas=`` takes for yes (case aside)."""

Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request no route takes: its status, a machine-readable code, and the reason the
    client reads (the body of the response)."""

    status: int
    code: str
    reason: str
    headers: Headers = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Admitted:
    """What every route that admits a peer carries: its ``?token=``, and the refusal its
    query earned, for the gate to give once the address's count is checked."""

    token: str = ""
    """The last ``?token=``, or '' (then ``Authorization: Bearer`` may hold one)."""
    fault: Refusal | None = None
    """A malformed ``?channel=`` or ``?rewind=`` (400), or None."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Produce(Admitted):
    """``GET /produce[?channel=C][&session=S]``: a producer's WebSocket."""

    channel: str | None = None
    """The URL's channel: every event goes there unless it names its own."""
    session: str | None = None
    """The session to resume (``?session=``), or None for a new one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpProduce(Admitted):
    """``POST /produce[?channel=C][&producer=NAME]``: a producer made of one request."""

    channel: str | None = None
    producer: str = ""
    """The producer's name: its session outlives the request. '' for none."""

    @property
    def named(self) -> bool:
        """Whether the producer has a name (its session is parked, not ended)."""
        return bool(self.producer)


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscribe(Admitted):
    """``GET /subscribe[?channel=C…][&deltas=1][&rewind=N]``: a subscriber's WebSocket."""

    channels: tuple[str, ...] = ()
    """The channels joined at once, each once, in the order given."""
    deltas: bool = False
    rewind: int = 0
    """Completed messages to replay on join; 0 when not asked."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sse(Admitted):
    """``GET /sse?channel=C…[&deltas=1][&rewind=N][&since=T]``: an event stream."""

    channels: tuple[str, ...] = ()
    deltas: bool = False
    rewind: int = 0
    resume: str = ""
    """Where to resume: ``Last-Event-ID``, else ``?since=``; '' for the live edge. The gate
    decodes it, once the request is authorized."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AiSdkStream(Admitted):
    """``GET /ai-sdk/{channel}/stream[?id=M][&wait=S]``: one reply as a UI message stream."""

    channel: str
    wanted: str | None = None
    """The reply ``?id=`` names, or None for the newest."""
    wait: float = 0.0
    """Seconds to wait for a reply to start (``?wait=``, 0 to :data:`MAX_WAIT_SECONDS`)."""
    rewind: int = 0
    """``?rewind=``, as a subscriber's; the relay sets its own unless ``?wait=`` is given."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AiSdkStop(Admitted):
    """``POST /ai-sdk/{channel}/stop[?id=M]``: Stop, for the reply in progress."""

    channel: str
    wanted: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AiSdkMessages(Admitted):
    r"""``GET /ai-sdk/{channel}/messages[?limit=N]``: the channel's recent replies as the AI
    SDK's ``UIMessage``\ s, oldest first, for ``useChat({messages})`` after a reload."""

    channel: str
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AiSdkProduce(Admitted):
    """``POST /ai-sdk/{channel}/produce[?id=M]``: one reply, as the body of a UI message
    stream (:mod:`token_relay.edge.aisdkproduce`)."""

    channel: str
    wanted: str | None = None
    """The reply's id (``?id=``) if its ``start`` names none; None: the relay makes one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AiSdkSocket(Admitted):
    """``GET /ai-sdk/ws``: the AI SDK's ``WebSocketChatTransport``
    (:mod:`token_relay.edge.aisdkws`); each request names its chat, the channel."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel(Admitted):
    """``POST /cancel``: a cancel frame as a request's body."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetters(Admitted):
    """``GET`` (list) or ``POST`` (replay) ``/webhooks/dead``: an operator's request."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamRequest(Admitted):
    """Any request on ``/v1/stream/{path}``: a Durable Streams stream
    (:mod:`token_relay.edge.durable`), named by its whole path, as sent."""

    method: str
    stream: str
    """The request's path: the stream's name (and a fork's ``Stream-Forked-From``)."""
    offset: str | None = None
    """``?offset=``, or None when not given."""
    live: str = ""
    """``?live=``: ``long-poll``, ``sse``, or '' for a catch-up read."""
    cursor: str = ""
    """``?cursor=``, the last ``Stream-Cursor`` the client was sent."""

    @property
    def sse(self) -> bool:
        """A live read as Server-Sent Events (a streamed response)."""
        return self.method == "GET" and self.live == "sse"

    @property
    def self_authorized(self) -> bool:
        """A request that carries its own authority, or needs none: a subscription's
        callback, ack or release (its wake's token), or the webhook signing keys."""
        return _SELF_AUTHORIZED.fullmatch(self.stream) is not None


@dataclass(frozen=True, slots=True)
class Health:
    """``/healthz``."""


@dataclass(frozen=True, slots=True)
class Ready:
    """``/readyz``."""


@dataclass(frozen=True, slots=True)
class MetricsPage:
    """``/metrics``."""


@dataclass(frozen=True, slots=True)
class Static:
    """Any other path: a file of ``--web-root``, if it has one there."""

    path: str


Route = (
    Produce
    | HttpProduce
    | Subscribe
    | Sse
    | AiSdkStream
    | AiSdkStop
    | AiSdkMessages
    | AiSdkProduce
    | AiSdkSocket
    | Cancel
    | DeadLetters
    | StreamRequest
    | Health
    | Ready
    | MetricsPage
    | Static
)

_PAGES: dict[str, Route] = {"/healthz": Health(), "/readyz": Ready(), "/metrics": MetricsPage()}


def parse_route(
    method: str, path: str, query: str, *, upgrade: bool = False, last_event_id: str = ""
) -> Route | Refusal:
    """The route of a request: ``path`` is its target's path (percent-encoded, as sent),
    ``query`` the query string after ``?``; ``upgrade`` whether it asks for a WebSocket."""
    if path.startswith(STREAM_PREFIX):
        return _stream_request(method, path, query)
    if path == SSE_PATH:
        if method != "GET":
            return _wrong_method(path, "GET")
        return _sse(_arguments(query), last_event_id)
    if path == AI_SDK_SOCKET_PATH:
        if method != "GET":
            return _wrong_method(path, "GET")
        if not upgrade:
            return _upgrade_required(path)
        return AiSdkSocket(token=_last(_arguments(query), "token"))
    if path.startswith(AI_SDK_PREFIX):
        return _ai_sdk(method, path, query)
    if path == CANCEL_PATH:
        if method != "POST":
            return _wrong_method(path, "POST")
        arguments = _arguments(query)
        return Cancel(token=_last(arguments, "token"), fault=_fault(arguments, produce=False))
    if path == DEAD_LETTERS_PATH:
        if method not in ("GET", "POST"):
            return Refusal(
                405, "method_not_allowed", f"{path} takes GET or POST", (("Allow", "GET, POST"),)
            )
        return DeadLetters(token=_last(_arguments(query), "token"))
    if path == PRODUCE_PATH and method == "POST":
        arguments = _arguments(query)
        return HttpProduce(
            token=_last(arguments, "token"),
            fault=_fault(arguments, produce=True),
            channel=_first(arguments, "channel"),
            producer=_last(arguments, "producer"),
        )
    if path in (PRODUCE_PATH, SUBSCRIBE_PATH):
        if method != "GET":
            return _wrong_method(path, "GET")
        if not upgrade:
            return _upgrade_required(path)
        arguments = _arguments(query)
        token = _last(arguments, "token")
        if path == PRODUCE_PATH:
            return Produce(
                token=token,
                fault=_fault(arguments, produce=True),
                channel=_first(arguments, "channel"),
                session=_last(arguments, "session") or None,
            )
        return Subscribe(
            token=token,
            fault=_fault(arguments, produce=False),
            channels=_channels(arguments),
            deltas=_deltas(arguments),
            rewind=_rewind(arguments),
        )
    return _PAGES.get(path) or Static(path)


def cross_origin(method: str, path: str) -> bool:
    """Whether a request is for a surface a browser may call from another origin (it
    answers CORS, preflight included)."""
    return (
        path in (SSE_PATH, CANCEL_PATH)
        or path.startswith(AI_SDK_PREFIX)
        or (path == PRODUCE_PATH and method in ("POST", "OPTIONS"))
    )


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


# ---------------------------------------------------------------------- the routes


def _sse(arguments: dict[str, list[str]], last_event_id: str) -> Sse | Refusal:
    if not arguments.get("channel"):
        return Refusal(400, "channel_required", "give at least one ?channel=")
    return Sse(
        token=_last(arguments, "token"),
        fault=_fault(arguments, produce=False),
        channels=_channels(arguments),
        deltas=_deltas(arguments),
        rewind=_rewind(arguments),
        resume=last_event_id or _last(arguments, "since"),
    )


def _ai_sdk(
    method: str, path: str, query: str
) -> AiSdkStream | AiSdkStop | AiSdkProduce | AiSdkMessages | Refusal:
    name, _, action = path.removeprefix(AI_SDK_PREFIX).partition("/")
    channel = unquote(name)
    if action not in ("stream", "stop", "produce", "messages") or not channel:
        return Refusal(
            404, "no_endpoint", f"use {AI_SDK_PREFIX}CHANNEL/stream, /stop, /produce or /messages"
        )
    wanted_method = "GET" if action in ("stream", "messages") else "POST"
    if method != wanted_method:
        return _wrong_method(path, wanted_method)
    if len(channel) > MAX_NAME_LENGTH:
        return Refusal(400, "bad_channel", f"a channel is 1 to {MAX_NAME_LENGTH} characters")
    arguments = _arguments(query)
    token, fault = _last(arguments, "token"), _fault(arguments, produce=action == "produce")
    wanted = _last(arguments, "id") or None
    if action == "produce":
        if len(wanted or "") > MAX_NAME_LENGTH:
            return Refusal(400, "bad_id", f"?id= is at most {MAX_NAME_LENGTH} characters")
        return AiSdkProduce(token=token, fault=fault, channel=channel, wanted=wanted)
    if action == "stop":
        return AiSdkStop(token=token, fault=fault, channel=channel, wanted=wanted)
    if action == "messages":
        limit = _last(arguments, "limit") or str(MAX_UI_MESSAGES)
        if not (limit.isascii() and limit.isdigit()) or not 1 <= int(limit) <= MAX_UI_MESSAGES:
            return Refusal(400, "bad_limit", f"?limit= must be 1 to {MAX_UI_MESSAGES}")
        return AiSdkMessages(token=token, fault=fault, channel=channel, limit=int(limit))
    wait = seconds_of(_last(arguments, "wait") or "0", MAX_WAIT_SECONDS)
    if wait is None:
        return Refusal(400, "bad_wait", f"?wait= must be seconds, 0 to {MAX_WAIT_SECONDS:g}")
    return AiSdkStream(
        token=token,
        fault=fault,
        channel=channel,
        wanted=wanted,
        wait=wait,
        rewind=_rewind(arguments),
    )


def _stream_request(method: str, path: str, query: str) -> StreamRequest | Refusal:
    if path == STREAM_PREFIX or len(path) > MAX_STREAM_PATH:
        return Refusal(
            400, "bad_path", f"a stream's path is {STREAM_PREFIX}NAME, at most {MAX_STREAM_PATH}"
        )
    arguments = _arguments(query)
    offset = arguments.get("offset")
    live = _last(arguments, "live")
    if live not in ("", "long-poll", "sse"):
        return Refusal(400, "bad_live", "?live= is long-poll or sse")
    if live and offset is None:
        return Refusal(400, "offset_required", "a live read needs ?offset=")
    return StreamRequest(
        token=_last(arguments, "token"),
        method=method,
        stream=path,
        offset=offset[-1] if offset else None,
        live=live,
        cursor=_last(arguments, "cursor"),
    )


def _upgrade_required(path: str) -> Refusal:
    return Refusal(
        426,
        "upgrade_required",
        f"{path} is a WebSocket endpoint: send Upgrade: websocket",
        (("Upgrade", "websocket"), ("Connection", "Upgrade")),
    )


def _wrong_method(path: str, allowed: str) -> Refusal:
    return Refusal(405, "method_not_allowed", f"{path} takes {allowed}", (("Allow", allowed),))


# ---------------------------------------------------------------------- the arguments


def _arguments(query: str) -> dict[str, list[str]]:
    """The query string's arguments, each with every value given, in order."""
    return parse_qs(query, keep_blank_values=True)


def _last(arguments: dict[str, list[str]], name: str) -> str:
    values = arguments.get(name)
    return values[-1] if values else ""


def _first(arguments: dict[str, list[str]], name: str) -> str | None:
    values = arguments.get(name)
    return values[0] if values else None


def _channels(arguments: dict[str, list[str]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(arguments.get("channel", ())))


def _deltas(arguments: dict[str, list[str]]) -> bool:
    return _last(arguments, "deltas").lower() in _TRUE


def _rewind(arguments: dict[str, list[str]]) -> int:
    """``?rewind=`` as given (checked by :func:`_fault`), or 0 when not given."""
    return whole_number(_last(arguments, "rewind")) or 0


def _fault(arguments: dict[str, list[str]], *, produce: bool) -> Refusal | None:
    """What is wrong with the query's ``?channel=`` and ``?rewind=``, if anything."""
    channels = arguments.get("channel", [])
    if produce and len(channels) > 1:
        return Refusal(400, "bad_channel", "give at most one ?channel=")
    for channel in channels:
        if not 1 <= len(channel) <= MAX_NAME_LENGTH:
            return Refusal(
                400, "bad_channel", f"?channel= must be 1 to {MAX_NAME_LENGTH} characters"
            )
    rewind = arguments.get("rewind")
    if rewind is not None and (whole_number(rewind[-1]) or 0) < 1:
        return Refusal(
            400,
            "bad_rewind",
            f"?rewind= must be a whole number of messages, 1 to {MAX_QUERY_NUMBER}",
        )
    return None
