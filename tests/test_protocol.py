"""Tests for server.protocol: decoding peer frames, encoding relay frames, the schema."""

from __future__ import annotations

import json

import pytest
from pydantic import MISSING, BaseModel

from server.errors import ErrorCode, FrameRejected
from server.protocol import (
    SERVER_FRAME,
    Ack,
    ErrorFrame,
    MessageFrame,
    ProducerEvent,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    decode_producer_event,
    decode_subscriber_frame,
    encode,
    json_schema,
)


def _rejected_event(raw: str | bytes) -> FrameRejected:
    with pytest.raises(FrameRejected) as info:
        decode_producer_event(raw)
    return info.value


def _rejected_frame(raw: str | bytes) -> FrameRejected:
    with pytest.raises(FrameRejected) as info:
        decode_subscriber_frame(raw)
    return info.value


# ------------------------------------------------------------ producer events: valid


def test_event_with_id_only() -> None:
    event = decode_producer_event('{"id": "m"}')
    assert event == ProducerEvent(id="m")
    assert event.id == "m"
    assert event.delta is MISSING
    assert event.final is False
    assert event.channel is MISSING


def test_event_with_every_field() -> None:
    event = decode_producer_event('{"id": "m", "delta": "hi", "final": true, "channel": "c"}')
    assert event.id == "m"
    assert event.delta == "hi"
    assert event.final is True
    assert event.channel == "c"


def test_event_empty_delta_is_kept_as_empty_string() -> None:
    event = decode_producer_event('{"id": "m", "delta": ""}')
    assert event.delta == ""
    assert event.delta is not MISSING


def test_event_final_false_explicit() -> None:
    event = decode_producer_event('{"id": "m", "final": false}')
    assert event.final is False


def test_event_empty_id_is_valid() -> None:
    assert decode_producer_event('{"id": ""}').id == ""


def test_event_unicode_delta() -> None:
    event = decode_producer_event('{"id": "m", "delta": "caf\\u00e9 \\ud83d\\ude00"}')
    assert event.delta == "caf\u00e9 \U0001f600"


def test_event_from_bytes() -> None:
    event = decode_producer_event(b'{"id": "m", "delta": "x", "channel": "c"}')
    assert event == ProducerEvent(id="m", delta="x", channel="c")


def test_event_from_utf8_bytes() -> None:
    event = decode_producer_event('{"id": "m", "delta": "caf\u00e9"}'.encode())
    assert event.delta == "caf\u00e9"


# ---------------------------------------------------------- producer events: rejected


@pytest.mark.parametrize("raw", ["nope", "{", "", '{"id": "m",}', "{'id': 'm'}"])
def test_event_invalid_json(raw: str) -> None:
    rejected = _rejected_event(raw)
    assert rejected.code is ErrorCode.INVALID_JSON
    assert rejected.message.startswith("frame is not valid JSON: ")
    assert rejected.message_id is None


@pytest.mark.parametrize("raw", ["[]", '[{"id": "m"}]', "3", "1.5", '"m"', "null", "true"])
def test_event_not_an_object(raw: str) -> None:
    rejected = _rejected_event(raw)
    assert rejected.code is ErrorCode.INVALID_JSON
    assert rejected.message == "an event must be a JSON object"
    assert rejected.message_id is None


def test_event_missing_id() -> None:
    rejected = _rejected_event('{"delta": "x"}')
    assert rejected.code is ErrorCode.INVALID_EVENT
    assert rejected.message == "'id' is required"
    assert rejected.message_id is None


@pytest.mark.parametrize("raw", ['{"id": 3}', '{"id": null}', '{"id": ["m"]}', '{"id": true}'])
def test_event_non_string_id(raw: str) -> None:
    rejected = _rejected_event(raw)
    assert rejected.code is ErrorCode.INVALID_EVENT
    assert rejected.message == "'id' must be a string"
    assert rejected.message_id is None


def test_event_id_too_long() -> None:
    long_id = "i" * 257
    rejected = _rejected_event(json.dumps({"id": long_id}))
    assert rejected.code is ErrorCode.INVALID_EVENT
    assert rejected.message == "'id' is longer than 256 characters"
    assert rejected.message_id == long_id


def test_event_id_at_length_limit_is_valid() -> None:
    assert decode_producer_event(json.dumps({"id": "i" * 256})).id == "i" * 256


@pytest.mark.parametrize("delta", ["3", "null", '["a"]', "{}", "false"])
def test_event_non_string_delta(delta: str) -> None:
    rejected = _rejected_event(f'{{"id": "m", "delta": {delta}}}')
    assert rejected.code is ErrorCode.INVALID_EVENT
    assert rejected.message == "'delta' must be a string"
    assert rejected.message_id == "m"


@pytest.mark.parametrize("final", ['"true"', "1", "0", "null"])
def test_event_non_boolean_final(final: str) -> None:
    rejected = _rejected_event(f'{{"id": "m", "final": {final}}}')
    assert rejected.code is ErrorCode.INVALID_EVENT
    assert rejected.message == "'final' must be a boolean (true or false)"
    assert rejected.message_id == "m"


def test_event_unknown_key() -> None:
    rejected = _rejected_event('{"id": "m", "delta": "x", "extra": 1}')
    assert rejected.code is ErrorCode.INVALID_EVENT
    assert rejected.message == "unknown field 'extra'"
    assert rejected.message_id == "m"


def test_event_empty_channel() -> None:
    rejected = _rejected_event('{"id": "m", "channel": ""}')
    assert rejected.code is ErrorCode.INVALID_EVENT
    assert rejected.message == "'channel' must not be empty"
    assert rejected.message_id == "m"


def test_event_non_string_channel() -> None:
    rejected = _rejected_event('{"id": "m", "channel": 7}')
    assert rejected.code is ErrorCode.INVALID_EVENT
    assert rejected.message == "'channel' must be a string"
    assert rejected.message_id == "m"


def test_event_several_errors_are_all_named() -> None:
    rejected = _rejected_event('{"id": 7, "extra": 1}')
    assert rejected.code is ErrorCode.INVALID_EVENT
    assert rejected.message == "'id' must be a string; unknown field 'extra'"
    assert rejected.message_id is None


def test_event_rejection_message_id_is_empty_string_id() -> None:
    rejected = _rejected_event('{"id": "", "final": 1}')
    assert rejected.code is ErrorCode.INVALID_EVENT
    assert rejected.message_id == ""


def test_event_bytes_rejection_names_id() -> None:
    rejected = _rejected_event(b'{"id": "m", "delta": 5}')
    assert rejected.code is ErrorCode.INVALID_EVENT
    assert rejected.message == "'delta' must be a string"
    assert rejected.message_id == "m"


@pytest.mark.parametrize(
    "raw",
    [b"\xff\xfe", b'{"id": "\xff"}', b'{"id": "m", "delta": "\xc3"}', b'{"id": "\xed\xa0\x80"}'],
)
def test_event_invalid_utf8_bytes(raw: bytes) -> None:
    rejected = _rejected_event(raw)
    assert rejected.code is ErrorCode.INVALID_JSON
    assert rejected.message.startswith("frame is not valid JSON: ")
    assert rejected.message_id is None


def test_event_lone_surrogate_escape_is_rejected() -> None:
    rejected = _rejected_event('{"id": "m", "delta": "\\ud83d"}')
    assert rejected.code is ErrorCode.INVALID_JSON


def test_rejection_is_a_relay_error_with_message() -> None:
    rejected = _rejected_event('{"id": "m", "extra": 1}')
    assert str(rejected) == "unknown field 'extra'"


# --------------------------------------------------------------- subscriber frames


def test_subscribe_frame() -> None:
    frame = decode_subscriber_frame('{"type": "subscribe", "channel": "c"}')
    assert isinstance(frame, Subscribe)
    assert frame == Subscribe(type="subscribe", channel="c")


def test_unsubscribe_frame() -> None:
    frame = decode_subscriber_frame('{"type": "unsubscribe", "channel": "c"}')
    assert isinstance(frame, Unsubscribe)
    assert frame == Unsubscribe(type="unsubscribe", channel="c")


def test_subscriber_frame_from_bytes() -> None:
    frame = decode_subscriber_frame(b'{"channel": "c", "type": "subscribe"}')
    assert frame == Subscribe(type="subscribe", channel="c")


@pytest.mark.parametrize("kind", ['"publish"', '"Subscribe"', '""', "3", "null"])
def test_subscriber_unknown_type(kind: str) -> None:
    rejected = _rejected_frame(f'{{"type": {kind}, "channel": "c"}}')
    assert rejected.code is ErrorCode.UNKNOWN_FRAME
    assert rejected.message == (
        "unknown frame type; expected 'type' to be 'subscribe' or 'unsubscribe'"
    )


def test_subscriber_missing_type() -> None:
    rejected = _rejected_frame('{"channel": "c"}')
    assert rejected.code is ErrorCode.UNKNOWN_FRAME
    assert rejected.message == "frame has no 'type'; expected 'subscribe' or 'unsubscribe'"


@pytest.mark.parametrize("kind", ["subscribe", "unsubscribe"])
def test_subscriber_missing_channel(kind: str) -> None:
    rejected = _rejected_frame(f'{{"type": "{kind}"}}')
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message == "'channel' is required"


def test_subscriber_empty_channel() -> None:
    rejected = _rejected_frame('{"type": "subscribe", "channel": ""}')
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message == "'channel' must not be empty"


def test_subscriber_non_string_channel() -> None:
    rejected = _rejected_frame('{"type": "subscribe", "channel": ["c"]}')
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message == "'channel' must be a string"


def test_subscriber_extra_key() -> None:
    rejected = _rejected_frame('{"type": "subscribe", "channel": "c", "extra": 1}')
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message == "unknown field 'extra'"


@pytest.mark.parametrize("raw", ["[]", "3", '"subscribe"', "null"])
def test_subscriber_not_an_object(raw: str) -> None:
    rejected = _rejected_frame(raw)
    assert rejected.code is ErrorCode.INVALID_JSON
    assert rejected.message == "a frame must be a JSON object"
    assert rejected.message_id is None


@pytest.mark.parametrize("raw", ["subscribe", "{", b"\xff", b'{"type": "subscribe\xff"}'])
def test_subscriber_invalid_json(raw: str | bytes) -> None:
    rejected = _rejected_frame(raw)
    assert rejected.code is ErrorCode.INVALID_JSON
    assert rejected.message.startswith("frame is not valid JSON: ")
    assert rejected.message_id is None


# ------------------------------------------------------------------------ encoding


def test_encode_error_frame_without_id_has_null_id() -> None:
    text = encode(ErrorFrame(code=ErrorCode.INVALID_JSON, message="bad"))
    assert json.loads(text) == {
        "type": "error",
        "code": "invalid_json",
        "message": "bad",
        "id": None,
    }
    assert '"id":null' in text


def test_encode_error_frame_with_id() -> None:
    text = encode(ErrorFrame(code=ErrorCode.CHANNEL_MISMATCH, message="no", id="m"))
    assert json.loads(text) == {
        "type": "error",
        "code": "channel_mismatch",
        "message": "no",
        "id": "m",
    }


def test_encode_ack() -> None:
    assert json.loads(encode(Ack(id="m", channel="c"))) == {
        "type": "ack",
        "id": "m",
        "channel": "c",
    }


def test_encode_message_frame() -> None:
    frame = MessageFrame(channel="c", id="m", text='caf\u00e9 \U0001f600\n"q"')
    assert json.loads(encode(frame)) == {
        "type": "message",
        "channel": "c",
        "id": "m",
        "text": 'caf\u00e9 \U0001f600\n"q"',
    }


def test_encode_message_frame_empty_text() -> None:
    assert json.loads(encode(MessageFrame(channel="c", id="", text=""))) == {
        "type": "message",
        "channel": "c",
        "id": "",
        "text": "",
    }


def test_encode_subscribed_and_unsubscribed() -> None:
    assert json.loads(encode(Subscribed(channel="c"))) == {"type": "subscribed", "channel": "c"}
    assert json.loads(encode(Unsubscribed(channel="c"))) == {
        "type": "unsubscribed",
        "channel": "c",
    }


def test_encode_returns_str() -> None:
    assert isinstance(encode(Ack(id="m", channel="c")), str)


@pytest.mark.parametrize(
    "frame",
    [
        Ack(id="m", channel="c"),
        ErrorFrame(code=ErrorCode.INVALID_EVENT, message="bad"),
        ErrorFrame(code=ErrorCode.TOO_MANY_MESSAGES, message="full", id="m"),
        Subscribed(channel="c"),
        Unsubscribed(channel="c"),
        MessageFrame(channel="c", id="m", text="hello \U0001f600"),
    ],
)
def test_server_frames_round_trip(frame: BaseModel) -> None:
    decoded = SERVER_FRAME.validate_json(encode(frame))
    assert type(decoded) is type(frame)
    assert decoded == frame


# -------------------------------------------------------------------------- schema


def test_json_schema_keys() -> None:
    schema = json_schema()
    assert {"producer_to_relay", "subscriber_to_relay", "relay_to_client"} <= set(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_json_schema_producer_event() -> None:
    producer = json_schema()["producer_to_relay"]
    assert producer["type"] == "object"
    assert producer["additionalProperties"] is False
    assert producer["required"] == ["id"]
    assert set(producer["properties"]) == {"id", "delta", "final", "channel"}
    assert producer["properties"]["final"]["type"] == "boolean"
    assert producer["properties"]["delta"]["type"] == "string"
    assert producer["properties"]["channel"]["minLength"] == 1


def test_json_schema_is_json_serializable() -> None:
    schema = json_schema()
    assert json.loads(json.dumps(schema)) == schema
