"""The hot path's codec: producer frames decoded, and the frames sent most, encoded, by msgspec.

The pydantic models of :mod:`token_relay.core.protocol` are the one source of truth
for the protocol. This module only takes a faster road to the same place:

* :func:`decode_events` reads a producer frame with msgspec into :class:`FastEvent`,
  whose fields and constraints are those of :class:`~token_relay.core.protocol.ProducerEvent`.
  It never refuses anything: whatever msgspec does not accept as it stands (a frame
  with an error, a lone surrogate escape, a number msgspec will not hold) returns None,
  and the pydantic models decide, with their own error codes and words.
* The encoders build the ``session``, ``ack``, ``acks``, ``delta`` and unpositioned
  ``message`` frames the pydantic models would serialize, byte for byte; any text msgspec will not
  encode, and any metadata, goes to the models instead.

``tests/core/test_codec.py`` proves both over generated valid and invalid frames:
what is accepted here equals the models' result, and every encoding equals theirs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec
from pydantic import MISSING

from .protocol import (
    MAX_BATCH,
    MAX_JSON_DEPTH,
    MAX_NAME_LENGTH,
    Ack,
    AckBatch,
    AckEntry,
    DeltaFrame,
    MessageFrame,
    ProducerEvent,
    SessionFrame,
    encode,
    encode_unpositioned,
    may_nest_too_deep,
    nested_too_deep,
)
from .protocol import decode_producer_frame as decode_by_models

__all__ = [
    "Event",
    "FastEvent",
    "ack_frame",
    "acks_frame",
    "decode_by_models",
    "decode_events",
    "decode_fast",
    "decode_producer_frame",
    "encode_chunks",
    "encode_delta",
    "encode_parts_snapshot",
    "message_body",
    "nests_too_deep",
    "session_frame",
]

_Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_LENGTH)]
_Channel = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_LENGTH)]
_Seq = Annotated[int, msgspec.Meta(ge=1)]


class FastEvent(msgspec.Struct, forbid_unknown_fields=True, frozen=True, gc=False):
    """A producer event as msgspec reads it: the fields of ``ProducerEvent``, absent ones
    ``MISSING`` as there."""

    id: _Name
    delta: str = MISSING  # type: ignore[assignment]
    chunk: dict[str, Any] = MISSING  # type: ignore[assignment]
    final: bool = False
    channel: _Channel = MISSING  # type: ignore[assignment]
    seq: _Seq = MISSING  # type: ignore[assignment]
    meta: dict[str, Any] = MISSING  # type: ignore[assignment]
    abort: Literal["cancelled", "error"] = MISSING  # type: ignore[assignment]


_DECODER = msgspec.json.Decoder(
    FastEvent | Annotated[list[FastEvent], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]
)
_ENCODER = msgspec.json.Encoder()

decode_fast = _DECODER.decode
"""The msgspec half of :func:`decode_producer_frame`, for a caller that inlines it (a call
less per frame): it raises :class:`msgspec.DecodeError` where the models must decide
(:func:`decode_by_models`), and :class:`RecursionError` for a frame nested past msgspec's
own depth. A frame longer than :data:`~token_relay.core.protocol.MAX_JSON_DEPTH` may nest
deeper than the models read: the caller asks :func:`nests_too_deep` of it, and leaves it to
the models if so."""


def nests_too_deep(raw: str | bytes, frame: Event | Sequence[Event]) -> bool:
    """Whether a frame msgspec read nests its ``meta`` or ``chunk`` deeper than the models'
    parser reads (:data:`~token_relay.core.protocol.MAX_JSON_DEPTH`): the models decide it.
    Cheap unless the frame holds that many brackets beside its events' own objects (two
    counts of a character: a frame's single scans cost the least)."""
    events = frame if isinstance(frame, Sequence) else (frame,)
    if not may_nest_too_deep(raw, MAX_JSON_DEPTH - 10 + len(events)):
        return False
    limit = MAX_JSON_DEPTH - 3  # the frame, a batch, and the event's own object
    values: list[Any] = [value for event in events for value in (event.meta, event.chunk)]
    return any(value is not MISSING and nested_too_deep(value, limit) for value in values)


def _decode_checked(raw: str | bytes) -> FastEvent | list[FastEvent] | None:
    """:func:`decode_fast`; None where the models must decide, a frame nested too deep
    included."""
    try:
        frame = decode_fast(raw)
    except (msgspec.DecodeError, RecursionError):  # a ValidationError is a DecodeError
        return None
    if len(raw) > MAX_JSON_DEPTH and nests_too_deep(raw, frame):
        return None
    return frame


def decode_events(raw: str | bytes) -> FastEvent | list[FastEvent] | None:
    """The frame's event, or a batch's events, if msgspec accepts the frame as it stands;
    None to leave the frame to the pydantic models."""
    return _decode_checked(raw)


Event = FastEvent | ProducerEvent
"""One producer event, as either decoder read it: the same fields, the same values."""


def decode_producer_frame(raw: str | bytes) -> Event | list[FastEvent] | list[ProducerEvent]:
    """Validate a producer frame: one event, or a JSON array of them (all or nothing);
    raise :class:`~token_relay.core.errors.FrameRejected` as the models do."""
    frame = _decode_checked(raw)
    return decode_by_models(raw) if frame is None else frame


def _dumps(value: Any) -> bytes | None:
    try:
        return _ENCODER.encode(value)
    except (UnicodeEncodeError, msgspec.EncodeError):
        return None  # a lone surrogate: the models say how it goes out


def ack_frame(channel: str, message_id: str, duplicate: bool) -> bytes:
    """The ``ack`` frame for a single event, as the bytes a socket is sent."""
    one: dict[str, Any] = {"type": "ack", "id": message_id, "channel": channel}
    if duplicate:
        one["duplicate"] = True
    data = _dumps(one)
    if data is not None:
        return data
    ack = Ack(id=message_id, channel=channel)
    return encode(ack.model_copy(update={"duplicate": True}) if duplicate else ack).encode()


def acks_frame(acks: list[tuple[str, str, bool]], *, batch: bool) -> str:
    """One ``ack`` frame for a single event, one ``acks`` frame for a batch."""
    if not batch:
        return ack_frame(*acks[0]).decode()
    entries: list[dict[str, Any]] = []
    for channel, message_id, duplicate in acks:
        entry: dict[str, Any] = {"id": message_id, "channel": channel}
        if duplicate:
            entry["duplicate"] = True
        entries.append(entry)
    data = _dumps({"type": "acks", "acks": entries})
    if data is not None:
        return data.decode()
    models = [
        AckEntry(id=message_id, channel=channel).model_copy(update={"duplicate": True})
        if duplicate
        else AckEntry(id=message_id, channel=channel)
        for channel, message_id, duplicate in acks
    ]
    return encode(AckBatch(acks=models))


def session_frame(token: str, resumed: bool) -> str:
    """The ``session`` frame a producer is sent first thing."""
    data = _dumps({"type": "session", "session": token, "resumed": resumed})
    if data is not None:
        return data.decode()
    return encode(SessionFrame(session=token, resumed=resumed))


def encode_delta(channel: str, message_id: str, delta: str) -> str:
    """A ``delta`` frame from values already validated."""
    data = _dumps({"type": "delta", "channel": channel, "id": message_id, "delta": delta})
    if data is not None:
        return data.decode()
    return DeltaFrame.model_construct(channel=channel, id=message_id, delta=delta).model_dump_json()


def encode_chunks(channel: str, message_id: str, chunks: Sequence[dict[str, Any]]) -> str:
    """A ``chunks`` frame (:class:`~token_relay.core.protocol.ChunksFrame`) from chunks a
    message's parts accepted. Its numbers are written as msgspec writes them (``1e16``):
    equal as JSON to the models' serialization, not byte for byte."""
    frame = {"type": "chunks", "channel": channel, "id": message_id, "chunks": chunks}
    data = _dumps(frame)
    if data is not None:
        return data.decode()
    # Half of a surrogate pair a producer split across two chunks: it goes as its escape,
    # as the producer sent it (the next frame holds the other half).
    return json.dumps(frame, separators=(",", ":"))


def encode_parts_snapshot(
    channel: str, message_id: str, text: str, chunks: list[dict[str, Any]]
) -> str:
    """A structured message's ``snapshot`` frame: its text so far and its compacted
    chunks, whose last delta of a part may end in half a surrogate pair (it goes as its
    escape, as in :func:`encode_chunks`)."""
    frame: dict[str, Any] = {"type": "snapshot", "channel": channel, "id": message_id}
    frame["text"], frame["chunks"] = text, chunks
    data = _dumps(frame)
    if data is not None:
        return data.decode()
    return json.dumps(frame, separators=(",", ":"))


def message_body(
    channel: str,
    message_id: str,
    text: str,
    meta: dict[str, Any] | None = None,
    parts: list[dict[str, Any]] | None = None,
) -> str:
    """A ``message`` frame without its position, which the broker gives it; ``parts`` for a
    structured message.

    Metadata and parts go through the models: their numbers are written as serde writes
    them (``1e+16``), not as msgspec does (``1e16``)."""
    if meta is None and parts is None:
        body = {"type": "message", "channel": channel, "id": message_id, "text": text}
        data = _dumps(body)
        if data is not None:
            return data.decode()
    frame = MessageFrame.model_construct(
        channel=channel,
        id=message_id,
        text=text,
        parts=MISSING if parts is None else parts,
        meta=MISSING if meta is None else meta,
        offset=0,
        epoch="",
    )
    return encode_unpositioned(frame)
