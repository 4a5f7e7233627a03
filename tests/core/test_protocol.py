"""Tests for token_relay.core.protocol: decoding peer frames, encoding relay frames, the schema."""

from __future__ import annotations

import json

import pytest
from pydantic import MISSING, BaseModel
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.protocol import (
    SERVER_FRAME,
    Aborted,
    AbortReason,
    Ack,
    Cancel,
    DeltaFrame,
    ErrorFrame,
    MessageFrame,
    ProducerEvent,
    Since,
    Snapshot,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    decode_producer_event,
    decode_producer_frame,
    decode_subscriber_frame,
    encode,
    error_frame,
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


def test_event_lone_surrogate_escape_in_a_delta_is_accepted_as_is() -> None:
    # Half of an emoji cut by a gateway slicing a JavaScript string: the message
    # streams join the halves (see test_streams).
    assert decode_producer_event('{"id": "m", "delta": "A\\ud83d"}').delta == "A\ud83d"
    frame = decode_producer_frame('[{"id": "m", "delta": "\\ude00B"}]')
    assert isinstance(frame, list) and frame[0].delta == "\ude00B"


def test_lone_surrogate_in_a_name_is_rejected() -> None:
    rejected = _rejected_event('{"id": "\\ud83d", "delta": "x"}')
    # Names are refused by their own validation: only a delta may hold half a pair.
    assert rejected.code is ErrorCode.INVALID_EVENT
    assert rejected.message.startswith("'id'")
    with pytest.raises(FrameRejected) as batch:
        decode_producer_frame('[{"id": "a"}, {"id": "m", "channel": "\\udc00"}]')
    assert (batch.value.code, batch.value.index) == (ErrorCode.INVALID_EVENT, 1)


def test_non_json_constants_beside_a_surrogate_are_still_refused() -> None:
    rejected = _rejected_event('{"id": "m", "delta": NaN, "x": "\\ud83d"}')
    assert rejected.code in (ErrorCode.INVALID_JSON, ErrorCode.INVALID_EVENT)
    assert _rejected_event('{"id": "m", "delta": "\\ud83d"').code is ErrorCode.INVALID_JSON


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
        "unknown frame type; expected 'type' to be 'subscribe', 'unsubscribe' or 'cancel'"
    )


def test_subscriber_missing_type() -> None:
    rejected = _rejected_frame('{"channel": "c"}')
    assert rejected.code is ErrorCode.UNKNOWN_FRAME
    assert rejected.message == (
        "frame has no 'type'; expected 'subscribe', 'unsubscribe' or 'cancel'"
    )


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


# ------------------------------------------- subscribe options: deltas, since, positions


def test_subscribe_defaults_have_no_deltas_since_or_positions() -> None:
    frame = decode_subscriber_frame('{"type": "subscribe", "channel": "c"}')
    assert isinstance(frame, Subscribe)
    assert frame.deltas is False
    assert frame.since is MISSING
    assert frame.positions is MISSING


@pytest.mark.parametrize("value", [True, False])
def test_subscribe_deltas_flag(value: bool) -> None:
    frame = decode_subscriber_frame(
        json.dumps({"type": "subscribe", "channel": "c", "deltas": value})
    )
    assert isinstance(frame, Subscribe)
    assert frame.deltas is value


@pytest.mark.parametrize("value", ["1", "0", '"true"', "null", "[]"])
def test_subscribe_deltas_must_be_a_strict_boolean(value: str) -> None:
    rejected = _rejected_frame(f'{{"type": "subscribe", "channel": "c", "deltas": {value}}}')
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message == "'deltas' must be a boolean (true or false)"
    assert rejected.message_id is None


def test_subscribe_with_every_option() -> None:
    frame = decode_subscriber_frame(
        '{"type": "subscribe", "channel": "c", "deltas": true,'
        ' "since": {"offset": 4, "epoch": "ep"}, "positions": {"m": 3, "": 0}}'
    )
    assert frame == Subscribe(
        type="subscribe",
        channel="c",
        deltas=True,
        since=Since(offset=4, epoch="ep"),
        positions={"m": 3, "": 0},
    )


def test_subscribe_since_offset_zero_and_empty_epoch_are_valid() -> None:
    frame = decode_subscriber_frame(
        '{"type": "subscribe", "channel": "c", "since": {"offset": 0, "epoch": ""}}'
    )
    assert isinstance(frame, Subscribe)
    assert frame.since == Since(offset=0, epoch="")


def test_subscribe_since_epoch_at_length_limit_is_valid() -> None:
    frame = decode_subscriber_frame(
        json.dumps({"type": "subscribe", "channel": "c", "since": {"offset": 1, "epoch": "e" * 64}})
    )
    assert isinstance(frame, Subscribe)
    assert frame.since == Since(offset=1, epoch="e" * 64)


@pytest.mark.parametrize(
    ("since", "message"),
    [
        ('{"offset": -1, "epoch": "e"}', "'since.offset' must not be negative"),
        ('{"offset": "1", "epoch": "e"}', "'since.offset' must be an integer"),
        ('{"offset": 1.5, "epoch": "e"}', "'since.offset' must be an integer"),
        ('{"offset": true, "epoch": "e"}', "'since.offset' must be an integer"),
        ('{"offset": null, "epoch": "e"}', "'since.offset' must be an integer"),
        ('{"epoch": "e"}', "'since.offset' is required"),
        ('{"offset": 1}', "'since.epoch' is required"),
        ('{"offset": 1, "epoch": 5}', "'since.epoch' must be a string"),
        ('{"offset": 1, "epoch": "e", "extra": 1}', "unknown field 'since.extra'"),
        ("3", "'since' must be an object"),
        ("null", "'since' must be an object"),
        ('"e"', "'since' must be an object"),
    ],
)
def test_subscribe_invalid_since(since: str, message: str) -> None:
    rejected = _rejected_frame(f'{{"type": "subscribe", "channel": "c", "since": {since}}}')
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message == message
    assert rejected.message_id is None


def test_subscribe_since_epoch_too_long_is_rejected() -> None:
    rejected = _rejected_frame(
        json.dumps({"type": "subscribe", "channel": "c", "since": {"offset": 1, "epoch": "e" * 65}})
    )
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message.startswith("'since.epoch' is longer than ")


def test_subscribe_since_epoch_too_long_names_its_own_limit() -> None:
    rejected = _rejected_frame(
        json.dumps({"type": "subscribe", "channel": "c", "since": {"offset": 1, "epoch": "e" * 65}})
    )
    assert rejected.message == "'since.epoch' is longer than 64 characters"


@pytest.mark.parametrize(
    ("positions", "message"),
    [
        ('{"m": -1}', "'positions.m' must not be negative"),
        ('{"m": "1"}', "'positions.m' must be an integer"),
        ('{"m": 1.5}', "'positions.m' must be an integer"),
        ('{"m": false}', "'positions.m' must be an integer"),
        ('{"m": null}', "'positions.m' must be an integer"),
        ('{"ok": 1, "m": -2}', "'positions.m' must not be negative"),
        ("[]", "'positions' must be an object"),
        ("null", "'positions' must be an object"),
        ("5", "'positions' must be an object"),
    ],
)
def test_subscribe_invalid_positions(positions: str, message: str) -> None:
    rejected = _rejected_frame(f'{{"type": "subscribe", "channel": "c", "positions": {positions}}}')
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message == message
    assert rejected.message_id is None


def test_subscribe_positions_empty_object_is_valid() -> None:
    frame = decode_subscriber_frame('{"type": "subscribe", "channel": "c", "positions": {}}')
    assert isinstance(frame, Subscribe)
    assert frame.positions == {}


def test_subscribe_positions_at_the_entry_limit_is_valid() -> None:
    positions = {f"m{i}": i for i in range(1000)}
    frame = decode_subscriber_frame(
        json.dumps({"type": "subscribe", "channel": "c", "positions": positions})
    )
    assert isinstance(frame, Subscribe)
    assert frame.positions == positions


def test_subscribe_positions_over_the_entry_limit() -> None:
    positions = {f"m{i}": 0 for i in range(1001)}
    rejected = _rejected_frame(
        json.dumps({"type": "subscribe", "channel": "c", "positions": positions})
    )
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message == "'positions' has too many entries"


def test_subscribe_positions_key_too_long() -> None:
    rejected = _rejected_frame(
        json.dumps({"type": "subscribe", "channel": "c", "positions": {"k" * 257: 1}})
    )
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message.startswith("'positions.")
    assert rejected.message.endswith("' is longer than 256 characters")


def test_subscribe_positions_key_at_length_limit_is_valid() -> None:
    frame = decode_subscriber_frame(
        json.dumps({"type": "subscribe", "channel": "c", "positions": {"k" * 256: 1}})
    )
    assert isinstance(frame, Subscribe)
    assert frame.positions == {"k" * 256: 1}


@pytest.mark.parametrize("field", ['"deltas": true', '"since": {"offset": 0, "epoch": "e"}'])
def test_unsubscribe_takes_no_subscribe_options(field: str) -> None:
    rejected = _rejected_frame(f'{{"type": "unsubscribe", "channel": "c", {field}}}')
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message.startswith("unknown field '")


# --------------------------------------------------------------------- cancel frame


def test_cancel_frame() -> None:
    frame = decode_subscriber_frame('{"type": "cancel", "channel": "c", "id": "m"}')
    assert isinstance(frame, Cancel)
    assert frame == Cancel(channel="c", id="m")
    assert frame.type == "cancel"


def test_cancel_frame_with_empty_id() -> None:
    frame = decode_subscriber_frame('{"type": "cancel", "channel": "c", "id": ""}')
    assert frame == Cancel(channel="c", id="")


@pytest.mark.parametrize(
    ("raw", "message", "message_id"),
    [
        ('{"type": "cancel", "channel": "c"}', "'id' is required", None),
        ('{"type": "cancel", "id": "m"}', "'channel' is required", "m"),
        ('{"type": "cancel", "channel": "", "id": "m"}', "'channel' must not be empty", "m"),
        ('{"type": "cancel", "channel": 3, "id": "m"}', "'channel' must be a string", "m"),
        ('{"type": "cancel", "channel": "c", "id": 5}', "'id' must be a string", None),
        ('{"type": "cancel", "channel": "c", "id": "m", "x": 1}', "unknown field 'x'", "m"),
    ],
)
def test_cancel_invalid(raw: str, message: str, message_id: str | None) -> None:
    rejected = _rejected_frame(raw)
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message == message
    assert rejected.message_id == message_id


def test_cancel_id_too_long() -> None:
    rejected = _rejected_frame(json.dumps({"type": "cancel", "channel": "c", "id": "i" * 257}))
    assert rejected.code is ErrorCode.INVALID_FRAME
    assert rejected.message == "'id' is longer than 256 characters"


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


def test_error_frame_names_the_refused_line_of_a_body() -> None:
    refused = FrameRejected(ErrorCode.LINE_TOO_LONG, "line 3 is over 10 bytes", line=3)
    assert error_frame(refused) == (
        '{"type":"error","code":"line_too_long","message":"line 3 is over 10 bytes",'
        '"id":null,"line":3}'
    )
    without = FrameRejected(ErrorCode.BODY_TOO_LARGE, "request body over 10 bytes")
    assert '"line"' not in error_frame(without)


def test_encode_ack() -> None:
    assert json.loads(encode(Ack(id="m", channel="c"))) == {
        "type": "ack",
        "id": "m",
        "channel": "c",
    }


def test_encode_message_frame() -> None:
    frame = MessageFrame(
        channel="c", id="m", text='caf\u00e9 \U0001f600\n"q"', offset=7, epoch="ep"
    )
    assert json.loads(encode(frame)) == {
        "type": "message",
        "channel": "c",
        "id": "m",
        "text": 'caf\u00e9 \U0001f600\n"q"',
        "offset": 7,
        "epoch": "ep",
    }


def test_encode_message_frame_empty_text() -> None:
    assert json.loads(encode(MessageFrame(channel="c", id="", text="", offset=1, epoch="e"))) == {
        "type": "message",
        "channel": "c",
        "id": "",
        "text": "",
        "offset": 1,
        "epoch": "e",
    }


def test_encode_subscribed_and_unsubscribed() -> None:
    assert json.loads(encode(Subscribed(channel="c", offset=0, epoch="e"))) == {
        "type": "subscribed",
        "channel": "c",
        "offset": 0,
        "epoch": "e",
    }
    assert json.loads(encode(Unsubscribed(channel="c"))) == {
        "type": "unsubscribed",
        "channel": "c",
    }


def test_encode_snapshot_without_from() -> None:
    text = encode(Snapshot(channel="c", id="m", text="hel"))
    assert json.loads(text) == {"type": "snapshot", "channel": "c", "id": "m", "text": "hel"}
    assert "from" not in json.loads(text)


def test_encode_snapshot_with_from() -> None:
    text = encode(Snapshot(channel="c", id="m", text="lo", from_=3))
    assert json.loads(text) == {
        "type": "snapshot",
        "channel": "c",
        "id": "m",
        "text": "lo",
        "from": 3,
    }
    assert "from_" not in text


def test_encode_snapshot_with_from_zero_keeps_the_key() -> None:
    assert json.loads(encode(Snapshot(channel="c", id="m", text="all", from_=0)))["from"] == 0


def test_snapshot_accepts_from_by_alias() -> None:
    assert Snapshot(channel="c", id="m", text="x", **{"from": 2}).from_ == 2


def test_encode_subscribed_with_recovered() -> None:
    assert json.loads(encode(Subscribed(channel="c", offset=5, epoch="e", recovered=True))) == {
        "type": "subscribed",
        "channel": "c",
        "offset": 5,
        "epoch": "e",
        "recovered": True,
    }
    assert json.loads(encode(Subscribed(channel="c", offset=5, epoch="e", recovered=False))) == {
        "type": "subscribed",
        "channel": "c",
        "offset": 5,
        "epoch": "e",
        "recovered": False,
    }


def test_encode_subscribed_without_recovered_omits_the_key() -> None:
    text = encode(Subscribed(channel="c", offset=0, epoch="e"))
    assert "recovered" not in json.loads(text)


@pytest.mark.parametrize(
    ("reason", "wire"),
    [
        (AbortReason.PRODUCER_DISCONNECTED, "producer_disconnected"),
        (AbortReason.IDLE_TIMEOUT, "idle_timeout"),
    ],
)
def test_encode_aborted(reason: AbortReason, wire: str) -> None:
    frame = Aborted(channel="c", id="m", text="par", reason=reason, offset=4, epoch="e")
    assert json.loads(encode(frame)) == {
        "type": "aborted",
        "channel": "c",
        "id": "m",
        "text": "par",
        "reason": wire,
        "offset": 4,
        "epoch": "e",
    }


def test_encode_delta_frame() -> None:
    assert json.loads(encode(DeltaFrame(channel="c", id="m", delta="lo"))) == {
        "type": "delta",
        "channel": "c",
        "id": "m",
        "delta": "lo",
    }


def test_encode_cancel() -> None:
    assert json.loads(encode(Cancel(channel="c", id="m"))) == {
        "type": "cancel",
        "channel": "c",
        "id": "m",
    }


def test_encode_returns_str() -> None:
    assert isinstance(encode(Ack(id="m", channel="c")), str)


@pytest.mark.parametrize(
    "frame",
    [
        Ack(id="m", channel="c"),
        ErrorFrame(code=ErrorCode.INVALID_EVENT, message="bad"),
        ErrorFrame(code=ErrorCode.TOO_MANY_MESSAGES, message="full", id="m"),
        Subscribed(channel="c", offset=0, epoch="e"),
        Subscribed(channel="c", offset=3, epoch="e", recovered=True),
        Subscribed(channel="c", offset=3, epoch="e", recovered=False),
        Unsubscribed(channel="c"),
        MessageFrame(channel="c", id="m", text="hello \U0001f600", offset=1, epoch="e"),
        DeltaFrame(channel="c", id="m", delta="hel"),
        Snapshot(channel="c", id="m", text="hello"),
        Snapshot(channel="c", id="m", text="lo", from_=3),
        Aborted(
            channel="c",
            id="m",
            text="par",
            reason=AbortReason.PRODUCER_DISCONNECTED,
            offset=2,
            epoch="e",
        ),
        Aborted(channel="c", id="m", text="", reason=AbortReason.IDLE_TIMEOUT, offset=9, epoch="e"),
        Cancel(channel="c", id="m"),
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
    producer = json_schema()["producer_to_relay"]["$defs"]["ProducerEvent"]
    assert producer["type"] == "object"
    assert producer["additionalProperties"] is False
    assert producer["required"] == ["id"]
    assert set(producer["properties"]) == {
        "id",
        "delta",
        "chunk",
        "final",
        "channel",
        "seq",
        "meta",
        "abort",
    }
    assert producer["properties"]["abort"] == {
        "enum": ["cancelled", "error"],
        "title": "Abort",
        "type": "string",
    }
    assert producer["properties"]["final"]["type"] == "boolean"
    assert producer["properties"]["delta"]["type"] == "string"
    assert producer["properties"]["channel"]["minLength"] == 1


def test_json_schema_is_json_serializable() -> None:
    schema = json_schema()
    assert json.loads(json.dumps(schema)) == schema


def test_json_schema_subscriber_frames_include_cancel_and_options() -> None:
    subscriber = json_schema()["subscriber_to_relay"]
    defs = subscriber["$defs"]
    assert set(subscriber["discriminator"]["mapping"]) == {"subscribe", "unsubscribe", "cancel"}
    assert set(defs["Subscribe"]["properties"]) == {
        "type",
        "channel",
        "deltas",
        "since",
        "positions",
        "rewind",
    }
    assert defs["Cancel"]["required"] == ["channel", "id"]
    assert defs["Since"]["required"] == ["offset", "epoch"]


def test_json_schema_snapshot_uses_the_wire_name_from() -> None:
    snapshot = json_schema()["relay_to_client"]["$defs"]["Snapshot"]
    assert set(snapshot["properties"]) == {"type", "channel", "id", "text", "from", "chunks"}
    assert snapshot["required"] == ["channel", "id", "text"]


def test_json_schema_has_the_chunks_frame() -> None:
    defs = json_schema()["relay_to_client"]["$defs"]
    assert set(defs["ChunksFrame"]["properties"]) == {"type", "channel", "id", "chunks"}
    assert defs["ChunksFrame"]["required"] == ["channel", "id", "chunks"]
