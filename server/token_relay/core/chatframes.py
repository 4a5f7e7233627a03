"""The frames of the AI SDK's ``WebSocketChatTransport`` (``ai`` 7), as pydantic models.

The transport multiplexes a chat's requests over one WebSocket, ``ws://HOST/ai-sdk/ws``:

* client -> relay (:data:`ChatClientFrame`, tagged on ``type``): :class:`ChatSend` (a new
  message: its reply streams back), :class:`ChatResume` (the reply in progress, from its
  start, or after ``lastSequence``) and :class:`ChatAbort` (Stop);
* relay -> client: :class:`ChatStart`, :class:`ChatChunk` (one ``UIMessageChunk``, with
  its ``sequence``), :class:`ChatEnd`, :class:`ChatNoActive` (a resume with nothing in
  progress) and :class:`ChatError`; each names its ``requestId``.

Field names are the SDK's (camelCase), as its client sends and checks them; the client
frames are validated strictly, as every peer's. The ``chat id`` (``id``) is the channel.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    MISSING,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    ValidationError,
)

from .errors import ErrorCode, FrameRejected
from .protocol import MAX_NAME_LENGTH, Chunk

__all__ = [
    "CHAT_CLIENT_FRAME",
    "MAX_MESSAGES",
    "MAX_REQUEST_ID_LENGTH",
    "ChatAbort",
    "ChatChunk",
    "ChatClientFrame",
    "ChatEnd",
    "ChatError",
    "ChatNoActive",
    "ChatResume",
    "ChatSend",
    "ChatStart",
    "chat_schema",
    "decode_chat_frame",
]

MAX_REQUEST_ID_LENGTH = 128
"""The longest ``requestId`` (the SDK's are 16 characters)."""
MAX_MESSAGES = 10_000
"""The most ``messages`` one ``send`` may carry (its size is bounded by the frame's)."""

RequestId = Annotated[str, Field(min_length=1, max_length=MAX_REQUEST_ID_LENGTH)]
ChatId = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]
Headers = dict[str, str]


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ChatSend(_Frame):
    """``send``: a new message of chat ``id``; the relay hands it to a producer of the
    channel (a :class:`~token_relay.core.protocol.ChatRequest`) and streams its reply."""

    type: Literal["send"]
    requestId: RequestId
    id: ChatId
    trigger: Literal["submit-message", "regenerate-message"]
    messageId: str | MISSING = MISSING
    messages: Annotated[list[JsonValue], Field(max_length=MAX_MESSAGES)]
    headers: Headers | MISSING = MISSING
    body: dict[str, JsonValue] | MISSING = MISSING
    metadata: JsonValue | MISSING = MISSING


class ChatResume(_Frame):
    """``resume``: chat ``id``'s reply in progress. Without ``lastSequence``, from its
    ``start``; with it, what follows chunk ``lastSequence`` of request ``requestId``."""

    type: Literal["resume"]
    requestId: RequestId
    id: ChatId
    lastSequence: Annotated[int, Field(ge=0)] | MISSING = MISSING
    headers: Headers | MISSING = MISSING
    body: dict[str, JsonValue] | MISSING = MISSING
    metadata: JsonValue | MISSING = MISSING


class ChatAbort(_Frame):
    """``abort``: Stop the request's reply (its producer gets a ``cancel``)."""

    type: Literal["abort"]
    requestId: RequestId


ChatClientFrame = Annotated[ChatSend | ChatResume | ChatAbort, Field(discriminator="type")]
CHAT_CLIENT_FRAME: TypeAdapter[ChatSend | ChatResume | ChatAbort] = TypeAdapter(ChatClientFrame)


class ChatStart(_Frame):
    """A request's reply starts (a resume's stream exists)."""

    type: Literal["start"] = "start"
    requestId: str


class ChatChunk(_Frame):
    """One ``UIMessageChunk`` of the reply; ``sequence`` counts them from 0, one by one."""

    type: Literal["chunk"] = "chunk"
    requestId: str
    sequence: int
    chunk: Chunk


class ChatEnd(_Frame):
    """The reply ended (its last chunk was ``finish``, ``abort`` or ``error``)."""

    type: Literal["end"] = "end"
    requestId: str


class ChatNoActive(_Frame):
    """A ``resume`` found no reply in progress."""

    type: Literal["no-active"] = "no-active"
    requestId: str


class ChatError(_Frame):
    """The request failed; ``errorText`` starts with the error's code (``no_producer:``)."""

    type: Literal["error"] = "error"
    requestId: str
    errorText: str


ChatServerFrame = Annotated[
    ChatStart | ChatChunk | ChatEnd | ChatNoActive | ChatError, Field(discriminator="type")
]


def chat_schema() -> dict[str, Any]:
    """The JSON Schema of the transport's frames, both ways (``token-relay schema``)."""
    return {
        "ai_sdk_ws_client_to_relay": CHAT_CLIENT_FRAME.json_schema(),
        "ai_sdk_ws_relay_to_client": TypeAdapter(ChatServerFrame).json_schema(mode="serialization"),
    }


def decode_chat_frame(raw: str | bytes) -> ChatSend | ChatResume | ChatAbort:
    """Validate one frame of the transport's client, or raise :class:`FrameRejected`
    (its ``id`` is the frame's ``requestId`` when it could be read)."""
    try:
        return CHAT_CLIENT_FRAME.validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"][1:])  # after the frame's type
        invalid_json = first["type"] == "json_invalid"
        code = ErrorCode.INVALID_JSON if invalid_json else ErrorCode.INVALID_FRAME
        message = f"{where}: {first['msg']}" if where else first["msg"]
        raise FrameRejected(code, message, _peek_request_id(raw)) from None


def _peek_request_id(raw: str | bytes) -> str | None:
    """The ``requestId`` of a refused frame, if it has a readable one."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    request_id = value.get("requestId") if isinstance(value, dict) else None
    return request_id if isinstance(request_id, str) else None
