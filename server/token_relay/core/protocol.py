"""Wire frames, as pydantic models, and their validation.

Every frame is one JSON text frame. Frames a peer sends are validated strictly
(``extra="forbid"``, no coercion); frames the relay sends are built from the
same kind of models and serialized once. The JSON Schema printed by
``token-relay schema`` is generated from these models.

Producer -> relay: :class:`ProducerEvent`.
Subscriber -> relay: :data:`SubscriberFrame` (tagged on ``type``).
Relay -> peers: :data:`ServerFrame` (tagged on ``type``).
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import MISSING, BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from .errors import ErrorCode, FrameRejected
from .surrogates import has_surrogate

__all__ = [
    "MAX_FRAME_HEADER",
    "MAX_JSON_DEPTH",
    "PRODUCER_EVENT",
    "SERVER_FRAME",
    "SUBSCRIBER_FRAME",
    "AbortReason",
    "Aborted",
    "Ack",
    "AckBatch",
    "AckEntry",
    "AiSdkProduced",
    "AnyServerFrame",
    "Cancel",
    "ChannelName",
    "ChatRequest",
    "Chunk",
    "ChunksFrame",
    "DeltaFrame",
    "ErrorFrame",
    "MessageFrame",
    "MessageId",
    "Part",
    "ProducerEvent",
    "ServerFrame",
    "SessionFrame",
    "Since",
    "Snapshot",
    "Subscribe",
    "Subscribed",
    "SubscriberFrame",
    "Unsubscribe",
    "Unsubscribed",
    "decode_producer_event",
    "decode_producer_frame",
    "decode_subscriber_frame",
    "encode",
    "encode_unpositioned",
    "error_frame",
    "json_schema",
    "may_nest_too_deep",
    "nested_too_deep",
    "with_position",
]

MAX_NAME_LENGTH = 256

T = TypeVar("T")

ChannelName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]
"""A channel name: 1 to 256 characters."""

MessageId = Annotated[str, Field(max_length=MAX_NAME_LENGTH)]
"""A message id: any string up to 256 characters (the empty string is a valid id)."""


MAX_BATCH = 10_000
"""Events one batch frame may hold."""

MAX_JSON_DEPTH = 200
"""How deep the models' JSON parser reads arrays and objects nested in a frame (deeper is
``invalid_json``); what is nested deeper could not be serialized again either."""


def nested_too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON) nests arrays and objects more than ``limit`` deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def may_nest_too_deep(raw: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Cheap and conservative: False when ``raw`` has too few brackets to nest past ``limit``."""
    if isinstance(raw, str):
        return raw.count("[") + raw.count("{") > limit
    return raw.count(b"[") + raw.count(b"{") > limit


MAX_POSITIONS = 1000
"""How many message ids a subscribe frame's ``positions`` may name."""

MAX_FRAME_HEADER = "Relay-Max-Frame-Bytes"
"""The header of a WebSocket upgrade's 101 response that gives the relay's
``--max-frame-bytes``: the largest frame it reads (1009 past it)."""

Offset = Annotated[int, Field(ge=0)]
"""A per-channel offset: the first completed message of a channel has offset 1."""

Epoch = Annotated[str, Field(max_length=64)]
"""Names one unbroken history of a channel; it changes whenever history is lost."""


class _Frame(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        serialize_by_alias=True,
        validate_by_alias=True,
        validate_by_name=True,
    )


class AbortReason(StrEnum):
    """Why a message died unfinished."""

    PRODUCER_DISCONNECTED = "producer_disconnected"
    IDLE_TIMEOUT = "idle_timeout"
    MESSAGE_TOO_LARGE = "message_too_large"
    SHUTDOWN = "shutdown"
    RELAY_LOST = "relay_lost"
    CANCELLED = "cancelled"
    """Stop was pressed (or the producer aborted it) and its producer ended it so."""
    ERROR = "error"
    """Its producer reported an error (the AI SDK's ``error`` chunk, its text in ``meta``)."""


# ---------------------------------------------------------------- producer -> relay


Meta = dict[str, JsonValue]
"""A message's metadata: what the model reported (usage, ``finish_reason``, model name)."""


Chunk = dict[str, JsonValue]
"""One ``UIMessageChunk`` of the AI SDK (``ai`` 7) that builds a part of a message."""

Part = dict[str, JsonValue]
"""One part of a structured message, in the shape ``readUIMessageStream`` of ``ai`` 7
assembles (``{"type": "text", "text": ..., "state": "done"}``, ``tool-<name>``, ...)."""


class ProducerEvent(_Frame):
    """One event from a producer. Absent ``delta``, ``chunk`` and ``channel`` stay ``MISSING``.

    ``delta`` extends the message's text; ``chunk`` (an AI SDK ``UIMessageChunk``: a
    ``text-delta``, a ``tool-input-start``, a ``source-url``...) builds one of its parts,
    and makes the message structured. An event carries one or the other, never both
    (``invalid_event``). ``meta`` is merged into its message's metadata, shallowly, last
    write wins; the merged metadata is at most ``--max-meta-bytes`` of JSON (an event that
    would pass it gets ``invalid_event``).

    ``abort`` is the producer's own end of an unfinished message: ``"cancelled"`` (it obeyed
    a Stop) or ``"error"`` (its model failed; ``meta.errorText`` may say how). Subscribers
    get its ``aborted`` frame with that reason at once. Such an
    event carries no ``delta``, ``chunk`` or ``final`` (``invalid_event``); ``meta`` merges
    before the abort; nothing is acknowledged, and an id not in progress changes nothing.
    """

    id: MessageId
    delta: str | MISSING = MISSING
    chunk: Chunk | MISSING = MISSING
    final: bool = False
    channel: ChannelName | MISSING = MISSING
    seq: Annotated[int, Field(ge=1)] | MISSING = MISSING
    meta: Meta | MISSING = MISSING
    abort: Literal["cancelled", "error"] | MISSING = MISSING


# -------------------------------------------------------------- subscriber -> relay


class Since(_Frame):
    """The last position a resuming subscriber holds: ``offset`` within ``epoch``."""

    offset: Offset
    epoch: Epoch


class Subscribe(_Frame):
    """Start receiving a channel: completed messages, and live deltas if ``deltas``.

    ``since`` resumes after a drop: every message after that offset is replayed
    first. ``positions`` maps an in-progress message id to the number of
    characters (Unicode code points) the client already holds, so its snapshot
    carries only the rest.
    """

    type: Literal["subscribe"]
    channel: ChannelName
    deltas: bool = False
    since: Since | MISSING = MISSING
    rewind: Annotated[int, Field(ge=1)] | MISSING = MISSING
    """Without ``since``: replay the channel's last N completed or aborted messages first
    (at most ``--history-size``), by the rules of ``since``."""
    positions: Annotated[dict[MessageId, Offset], Field(max_length=MAX_POSITIONS)] | MISSING = (
        MISSING
    )


class Unsubscribe(_Frame):
    """Stop receiving a channel."""

    type: Literal["unsubscribe"]
    channel: ChannelName


class Cancel(_Frame):
    """Stop a generation. Sent by a subscriber, and forwarded as is to the owning producer."""

    type: Literal["cancel"] = "cancel"
    channel: ChannelName
    id: MessageId


SubscriberFrame = Annotated[Subscribe | Unsubscribe | Cancel, Field(discriminator="type")]

# ----------------------------------------------------------------- relay -> peers


class Ack(_Frame):
    """Answer to every ``final: true`` event that completes its message, and to every one
    repeated after it completed.

    ``duplicate`` is present (true) when the final's ``seq`` had already been applied.
    """

    type: Literal["ack"] = "ack"
    id: str
    channel: str
    duplicate: bool | MISSING = MISSING


class SessionFrame(_Frame):
    """Sent to a producer on connecting: the token that resumes this connection's state.

    ``resumed`` says whether a ``?session=`` given on the URL was resumed.
    """

    type: Literal["session"] = "session"
    session: str
    resumed: bool


class ErrorFrame(_Frame):
    """Answer to a rejected frame or event.

    ``id`` is the event's id when it could be read; ``index`` is the event's
    position when it came in a batch frame; ``channel`` is the channel a refused
    ``subscribe``, ``unsubscribe`` or ``cancel`` named; ``line`` is the number (from 1) of
    an NDJSON request body's line refused before it was decoded.
    """

    type: Literal["error"] = "error"
    code: ErrorCode
    message: str
    id: str | None = None
    channel: str | MISSING = MISSING
    index: int | MISSING = MISSING
    expected: int | MISSING = MISSING
    line: int | MISSING = MISSING


class AckEntry(_Frame):
    """One final acknowledged in an ``acks`` frame."""

    id: str
    channel: str
    duplicate: bool | MISSING = MISSING


class AckBatch(_Frame):
    """Answer to a batch frame: one entry per final in it, in order."""

    type: Literal["acks"] = "acks"
    acks: list[AckEntry]


class Subscribed(_Frame):
    """Confirms a subscription, with the channel's current ``offset`` and ``epoch``.

    ``recovered`` is present only when the subscribe frame had ``since``: true if
    every missed message was replayed, false if the gap could not be filled.
    ``replayed`` is present when history follows (``since`` or ``rewind``): how many
    messages, the run of offsets ending at ``offset``. So a client's position is
    ``offset - replayed`` until the first of them arrives.
    """

    type: Literal["subscribed"] = "subscribed"
    channel: str
    offset: int
    epoch: str
    recovered: bool | MISSING = MISSING
    replayed: int | MISSING = MISSING


class Unsubscribed(_Frame):
    """Confirms an unsubscription."""

    type: Literal["unsubscribed"] = "unsubscribed"
    channel: str


class MessageFrame(_Frame):
    """A completed message, delivered exactly once to each subscriber of its channel.

    ``parts`` is present only for a structured message (one a producer sent chunks for):
    every part, as ``readUIMessageStream`` of ``ai`` 7 assembles them; ``text`` is then
    its text parts' texts joined.
    """

    type: Literal["message"] = "message"
    channel: str
    id: str
    text: str
    parts: list[Part] | MISSING = MISSING
    meta: Meta | MISSING = MISSING
    offset: int
    epoch: str


class DeltaFrame(_Frame):
    """One accepted, non-empty delta, for subscribers that asked for deltas."""

    type: Literal["delta"] = "delta"
    channel: str
    id: str
    delta: str


class ChunksFrame(_Frame):
    r"""What one or more accepted events did to a structured message in progress, for
    subscribers that asked for deltas: the ``UIMessageChunk``\ s they amount to, in order.

    A producer's chunk goes as it was given; a top-level delta as a ``text-delta`` of the
    implicit text part (chunk id ``"text"``), after a ``text-start`` for it when the delta
    opens it. Each chunk names the part it extends by its ``id`` or ``toolCallId``. Before
    its first chunk a message is plain, and its ``delta`` frames are that implicit part's
    text: the first opens it.
    """

    type: Literal["chunks"] = "chunks"
    channel: str
    id: str
    chunks: list[Chunk]


class Snapshot(_Frame):
    """The text so far of a message in progress, sent when a deltas subscriber joins.

    Without ``from`` the text is the whole partial text; with it, only the part
    after the first ``from`` characters the client said it holds.

    For a structured message, ``chunks`` is the reply so far, compacted: per part its
    start, one delta holding its text so far, and its end where it has ended, to be read
    after a ``start``; ``text`` is its text parts' text so far, and ``from`` is never set.
    It replaces whatever the client held of the message; the live ``chunks`` frames
    that follow apply on top, so no part comes twice.
    """

    type: Literal["snapshot"] = "snapshot"
    channel: str
    id: str
    text: str
    from_: int | MISSING = Field(default=MISSING, alias="from")
    chunks: list[Chunk] | MISSING = MISSING


class Aborted(_Frame):
    """A message died unfinished; ``text`` (and ``parts``, for a structured message) is
    what it had. It takes an offset like a message."""

    type: Literal["aborted"] = "aborted"
    channel: str
    id: str
    text: str
    parts: list[Part] | MISSING = MISSING
    reason: AbortReason
    meta: Meta | MISSING = MISSING
    offset: int
    epoch: str


class AiSdkProduced(_Frame):
    """The answer to ``POST /ai-sdk/{channel}/produce``: what became of the reply its body
    carried.

    ``outcome`` is ``completed`` (``finish`` or ``[DONE]``), ``stopped`` (a Stop came while
    the body streamed: the reply was aborted with reason ``cancelled`` and the answer came
    at once, so that the app aborts its model), ``aborted`` (``abort``, ``error``, a body
    that ended before its reply did, or a bound: ``reason`` says which) or ``none`` (nothing
    of it was published: the body held no chunk, or each was refused). ``offset`` and
    ``epoch`` are the reply's place in the channel, as its ``message`` or ``aborted`` frame
    has them. ``errors`` are the error frames a WebSocket producer would have been sent for
    the body's events, in order.
    """

    id: str
    channel: str
    outcome: Literal["completed", "aborted", "stopped", "none"]
    stopped: bool
    """``outcome == "stopped"``: the app should abort its model."""
    reason: AbortReason | MISSING = MISSING
    offset: int | MISSING = MISSING
    epoch: str | MISSING = MISSING
    errors: list[ErrorFrame]


class ChatRequest(_Frame):
    """A chat's request, handed to a producer of its channel: the ``send`` of the AI SDK's
    ``WebSocketChatTransport`` (``ws://HOST/ai-sdk/ws``). The producer answers by streaming
    a reply under ``id`` on ``channel``, as any message; the transport serves that reply.

    ``request`` is the transport's request id; ``trigger``, ``messageId``, ``messages``
    (the chat's ``UIMessage``\\ s), ``body`` and ``metadata`` are the transport's, as sent.
    The transport's ``headers`` are not passed on: the relay's token is the credential.
    """

    type: Literal["request"] = "request"
    channel: str
    id: str
    """The id the reply must have (the relay's choice, unique per request)."""
    request: str
    trigger: Literal["submit-message", "regenerate-message"]
    message_id: str | MISSING = Field(default=MISSING, alias="messageId")
    messages: list[JsonValue]
    body: dict[str, JsonValue] | MISSING = MISSING
    metadata: JsonValue | MISSING = MISSING


AnyServerFrame = (
    Ack
    | SessionFrame
    | AckBatch
    | ErrorFrame
    | Subscribed
    | Unsubscribed
    | MessageFrame
    | DeltaFrame
    | ChunksFrame
    | Snapshot
    | Aborted
    | Cancel
    | ChatRequest
)

ServerFrame = Annotated[AnyServerFrame, Field(discriminator="type")]

PRODUCER_EVENT: TypeAdapter[ProducerEvent] = TypeAdapter(ProducerEvent)
PRODUCER_BATCH: TypeAdapter[list[ProducerEvent]] = TypeAdapter(
    Annotated[list[ProducerEvent], Field(min_length=1, max_length=MAX_BATCH)]
)
SUBSCRIBER_FRAME: TypeAdapter[Subscribe | Unsubscribe | Cancel] = TypeAdapter(SubscriberFrame)
SERVER_FRAME: TypeAdapter[AnyServerFrame] = TypeAdapter(ServerFrame)


def encode(frame: BaseModel) -> str:
    """Serialize a frame to its JSON text, once; absent optional fields are left out."""
    return frame.model_dump_json()


_POSITION = {"offset", "epoch"}


def encode_unpositioned(frame: MessageFrame | Aborted) -> str:
    """Serialize a terminal frame without its ``offset`` and ``epoch`` (its last two fields).

    The broker that assigns the offset completes it with :func:`with_position`,
    so the frame is serialized once, wherever the offset is decided.
    """
    return frame.model_dump_json(exclude=_POSITION)


def with_position(body: str, offset: int, epoch: str) -> str:
    """Complete an unpositioned terminal frame; equals ``encode`` of the positioned model.

    ``epoch`` is URL-safe base64 (:func:`token_relay.core.history.new_epoch`): no escaping.
    """
    return f'{body[:-1]},"offset":{offset},"epoch":"{epoch}"}}'


# ----------------------------------------------------------------- reply builders


def error_frame(exc: FrameRejected, channel: str | None = None) -> str:
    """The ``error`` frame answering a rejection, with its index, expected seq and the
    channel it concerns, if any."""
    frame = ErrorFrame(code=exc.code, message=exc.message, id=exc.message_id)
    extra = {
        name: value
        for name, value in (
            ("index", exc.index),
            ("expected", exc.expected),
            ("channel", channel),
            ("line", exc.line),
        )
        if value is not None
    }
    if extra:
        frame = frame.model_copy(update=extra)
    return encode(frame)


# ----------------------------------------------------------------- decoding errors


def _field(error: ErrorDetails) -> str:
    name = ".".join(str(part) for part in error["loc"]) or "frame"
    # Keys of a map (positions) come from the peer: never echo a huge one back.
    return name if len(name) <= 80 else name[:77] + "..."


def _describe(error: ErrorDetails) -> str:
    """One human sentence naming the offending field."""
    kind = error["type"]
    field = _field(error)
    if kind == "missing":
        return f"'{field}' is required"
    if kind == "extra_forbidden":
        return f"unknown field '{field}'"
    if kind == "string_type":
        return f"'{field}' must be a string"
    if kind == "bool_type":
        return f"'{field}' must be a boolean (true or false)"
    if kind == "string_too_short":
        return f"'{field}' must not be empty"
    if kind == "string_too_long":
        limit = error.get("ctx", {}).get("max_length", MAX_NAME_LENGTH)
        return f"'{field}' is longer than {limit} characters"
    if kind == "greater_than_equal":
        limit = error.get("ctx", {}).get("ge", 0)
        return f"'{field}' must be at least {limit}" if limit else f"'{field}' must not be negative"
    if kind == "int_type":
        return f"'{field}' must be an integer"
    if kind in ("model_type", "dict_type"):
        return f"'{field}' must be an object"
    if kind == "too_long":
        return f"'{field}' has too many entries"
    if kind == "literal_error":
        return f"'{field}' has an unexpected value"
    return f"'{field}': {error['msg']}"


_NOT_AN_OBJECT = frozenset({"model_type", "model_attributes_type", "dict_type"})


def _peek_id(raw: str | bytes, index: int | None = None) -> str | None:
    """Best effort: the ``id`` of a rejected frame, so the error can name it. Cold path."""
    try:
        parsed: Any = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if index is not None:
        parsed = parsed[index] if isinstance(parsed, list) and index < len(parsed) else None
    if isinstance(parsed, dict):
        message_id = parsed.get("id")
        # An id with half a surrogate pair is not readable: it could not be sent back.
        if isinstance(message_id, str) and not has_surrogate(message_id):
            return message_id
    return None


def _rejection(
    exc: ValidationError, raw: str | bytes, invalid: ErrorCode, what: str
) -> FrameRejected:
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    kind = first["type"]
    if kind == "json_invalid":
        return FrameRejected(ErrorCode.INVALID_JSON, f"frame is not valid JSON: {first['msg']}")
    if not first["loc"] and kind in _NOT_AN_OBJECT:
        return FrameRejected(ErrorCode.INVALID_JSON, f"{what} must be a JSON object")
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        return FrameRejected(
            ErrorCode.UNKNOWN_FRAME,
            "unknown frame type; expected 'type' to be 'subscribe', 'unsubscribe' or 'cancel'"
            if kind == "union_tag_invalid"
            else "frame has no 'type'; expected 'subscribe', 'unsubscribe' or 'cancel'",
        )
    # Tagged-union locations start with the tag ("subscribe", "channel"); drop it.
    cleaned = [
        {**error, "loc": error["loc"][1:]}
        if invalid is ErrorCode.INVALID_FRAME and error["loc"]
        else error
        for error in errors
    ]
    message = "; ".join(_describe(error) for error in cleaned)  # type: ignore[arg-type]
    return FrameRejected(invalid, message, _peek_id(raw))


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _with_surrogates(raw: str | bytes) -> Any:
    """Parse JSON whose strings may hold lone UTF-16 surrogate escapes (``"\\ud83d"``).

    The fast parser refuses them; the standard library's takes them. The constants
    JSON itself does not have (``NaN``, ``Infinity``) become an object that no field
    accepts. None if it is not valid JSON either way, or has no surrogate escape (cold
    path only).
    """
    data = raw.encode() if isinstance(raw, str) else raw
    if not _SURROGATE_ESCAPE.search(data):
        return None
    try:
        parsed = json.loads(data, parse_constant=lambda name: _NOT_JSON)
    except (ValueError, RecursionError):
        return None
    # Nested deeper than the fast parser reads: as invalid as it is there.
    return None if nested_too_deep(parsed, MAX_JSON_DEPTH + 1) else parsed  # as it counts


_NOT_JSON = object()


def _validate(adapter: TypeAdapter[T], raw: str | bytes) -> T:
    """``adapter.validate_json``, falling back to the standard parser for surrogate escapes."""
    try:
        return adapter.validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        parsed = _with_surrogates(raw) if first["type"] == "json_invalid" else None
        if parsed is None:
            raise
        return adapter.validate_python(parsed)


def decode_producer_event(raw: str | bytes) -> ProducerEvent:
    """Validate one producer event frame, or raise :class:`FrameRejected`."""
    try:
        return _validate(PRODUCER_EVENT, raw)
    except ValidationError as exc:
        raise _rejection(exc, raw, ErrorCode.INVALID_EVENT, "an event") from None


def decode_producer_frame(raw: str | bytes) -> ProducerEvent | list[ProducerEvent]:
    """Validate a producer frame: one event, or a JSON array of them (all or nothing)."""
    head = raw[:1]
    if head in ("[", b"[") or (head.isspace() and raw.lstrip()[:1] in ("[", b"[")):
        try:
            return _validate(PRODUCER_BATCH, raw)
        except ValidationError as exc:
            raise _batch_rejection(exc, raw) from None
    return decode_producer_event(raw)


def _batch_rejection(exc: ValidationError, raw: str | bytes) -> FrameRejected:
    first = exc.errors(include_url=False, include_input=False)[0]
    loc = first["loc"]
    if first["type"] == "json_invalid":
        return FrameRejected(ErrorCode.INVALID_JSON, f"frame is not valid JSON: {first['msg']}")
    if not loc:
        limit = f"1 to {MAX_BATCH}"
        return FrameRejected(ErrorCode.INVALID_EVENT, f"a batch must hold {limit} events")
    index = int(loc[0])
    if len(loc) == 1:
        # The same code as for a lone frame that is not an object.
        return FrameRejected(
            ErrorCode.INVALID_JSON, f"event {index} must be a JSON object", None, index
        )
    details = [
        {**error, "loc": error["loc"][1:]}
        for error in exc.errors(include_url=False, include_input=False)
        if error["loc"] and error["loc"][0] == index
    ]
    message = "; ".join(_describe(error) for error in details)  # type: ignore[arg-type]
    return FrameRejected(
        ErrorCode.INVALID_EVENT,
        f"event {index}: {message}; nothing in this batch was applied",
        _peek_id(raw, index),
        index,
    )


def decode_subscriber_frame(raw: str | bytes) -> Subscribe | Unsubscribe | Cancel:
    """Validate one subscriber frame, or raise :class:`FrameRejected`."""
    try:
        return _validate(SUBSCRIBER_FRAME, raw)
    except ValidationError as exc:
        raise _rejection(exc, raw, ErrorCode.INVALID_FRAME, "a frame") from None


def json_schema() -> dict[str, Any]:
    """The protocol's JSON Schema, generated from the models."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "token-relay wire protocol",
        "producer_to_relay": TypeAdapter(
            ProducerEvent
            | Annotated[list[ProducerEvent], Field(min_length=1, max_length=MAX_BATCH)]
        ).json_schema(),
        "subscriber_to_relay": SUBSCRIBER_FRAME.json_schema(),
        "relay_to_client": SERVER_FRAME.json_schema(mode="serialization"),
        "ai_sdk_produce_answer": AiSdkProduced.model_json_schema(mode="serialization"),
    }
