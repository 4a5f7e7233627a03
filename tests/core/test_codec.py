"""The hot path's codec against the pydantic models, the protocol's one source of truth.

Over generated frames, valid and invalid: a frame msgspec accepts is one the models
accept, with the same values; the codec's decoder accepts and refuses exactly what the
models do, with the same error code, words, id, index and expected seq; and every frame
the codec encodes is, byte for byte, the one the models serialize.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import MISSING
from token_relay.core import codec, protocol
from token_relay.core.errors import FrameRejected
from token_relay.core.protocol import (
    Ack,
    AckBatch,
    AckEntry,
    DeltaFrame,
    MessageFrame,
    SessionFrame,
    encode,
    encode_unpositioned,
)

FIELDS = ("id", "delta", "chunk", "final", "channel", "seq", "meta", "abort")

# Text near every limit: empty, 255-257 characters, non-BMP, control characters, quotes.
edge_text = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["", "a" * 255, "a" * 256, "a" * 257, "\U0001f600" * 256, "\U0001f600" * 257]),
    st.text(alphabet=st.sampled_from('a"\\\n\t\x00\x1f\x7f\u2028é\U0001f600/<'), max_size=6),
)
json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    edge_text,
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(edge_text, inner, max_size=3),
    max_leaves=6,
)
# Each field: often a value of the right type, sometimes any JSON value at all.
field_values = {
    "id": st.one_of(edge_text, json_value),
    "delta": st.one_of(edge_text, json_value),
    "final": st.one_of(st.booleans(), json_value),
    "channel": st.one_of(edge_text, json_value),
    "seq": st.one_of(st.integers(min_value=-2, max_value=2**65), json_value),
    "meta": st.one_of(st.dictionaries(edge_text, json_value, max_size=3), json_value),
    "chunk": st.one_of(st.dictionaries(edge_text, json_value, max_size=3), json_value),
    "abort": st.one_of(st.sampled_from(["cancelled", "error", "Cancelled", ""]), json_value),
}


@st.composite
def event_objects(draw: st.DrawFn) -> Any:
    present = draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=8))
    if draw(st.integers(0, 9)):  # usually an id, since a frame without one is dull
        present = ["id", *(f for f in present if f != "id")]
    event = {name: draw(field_values[name]) for name in present}
    if not draw(st.integers(0, 14)):
        event[draw(st.sampled_from(["type", "Id", "extra", "from"]))] = draw(json_value)
    if not draw(st.integers(0, 19)):
        return draw(json_value)  # not an object at all
    return event


def _dumps(value: Any, ascii_only: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_only)


@st.composite
def frames(draw: st.DrawFn) -> str:
    """A producer frame's text: an event, a batch, or JSON bent out of shape."""
    ascii_only = draw(st.booleans())
    if draw(st.integers(0, 3)):
        text = _dumps(draw(event_objects()), ascii_only)
    else:
        batch = draw(st.lists(event_objects(), max_size=4))
        text = _dumps(batch, ascii_only)
    bend = draw(st.integers(0, 9))
    if bend == 0:  # a lone surrogate escape in some string
        text = text.replace('"', '"\\udc80', 1) if draw(st.booleans()) else text
        text = text.replace('":"', '":"\\ud83d', 1)
    elif bend == 1:  # a repeated key
        text = text.replace("{", '{"id": "first", ', 1)
    elif bend == 2:  # whitespace around, or truncated, or trailing junk
        text = draw(st.sampled_from([f"  {text}\n", text[:-1], text + "x", text + " ", ""]))
    return text


def _same(value: Any) -> Any:
    """A value with its types spelled out: 1, 1.0 and True are told apart."""
    if isinstance(value, dict):
        return ("dict", tuple((k, _same(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", tuple(_same(v) for v in value))
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    return (type(value).__name__, value)


def _event(event: codec.Event) -> tuple[Any, ...]:
    return tuple(
        "MISSING" if (value := getattr(event, name)) is MISSING else _same(value) for name in FIELDS
    )


def _outcome(decode: Any, raw: str | bytes) -> tuple[Any, ...]:
    try:
        frame = decode(raw)
    except FrameRejected as exc:
        return ("refused", exc.code, exc.message, exc.message_id, exc.index, exc.expected)
    if isinstance(frame, list):
        return ("batch", tuple(_event(event) for event in frame))
    return ("event", _event(frame))


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames(), st.booleans())
@example('{"id": "m", "delta": "\\ud83d"}', False)
@example('{"id": "m", "id": "n", "final": true}', False)
@example('[{"id": "m", "seq": 1}, {"id": "m", "seq": 0}]', True)
@example('{"id": "m", "meta": {"n": 1e400}}', False)
@example('{"id": "m", "meta": {"n": 123456789012345678901234567890}}', False)
@example('{"id": "m", "final": 1}', False)
@example(" \n[]", False)
def test_the_codec_decodes_exactly_what_the_models_do(raw: str, as_bytes: bool) -> None:
    data: str | bytes = raw.encode("utf-8", "surrogatepass") if as_bytes else raw
    by_models = _outcome(protocol.decode_producer_frame, data)
    assert _outcome(codec.decode_producer_frame, data) == by_models
    fast = codec.decode_events(data)
    if fast is not None:
        assert by_models[0] != "refused", f"msgspec took a frame the models refuse: {raw!r}"
        assert _outcome(lambda _: fast, data) == by_models


names = st.one_of(edge_text, st.text(max_size=4))
surrogate_text = st.one_of(
    edge_text, st.text(alphabet=st.sampled_from("a\ud800\udfff\U0001f600"), max_size=4)
)


def _or_error(build: Any) -> Any:
    try:
        return ("ok", build())
    except Exception as exc:
        return ("error", type(exc).__name__)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(names, surrogate_text, st.booleans()), min_size=1, max_size=4),
    st.booleans(),
)
def test_acks_are_encoded_as_the_models_do(acks: list[tuple[str, str, bool]], batch: bool) -> None:
    def by_models() -> str:
        if not batch:
            channel, message_id, duplicate = acks[0]
            ack = Ack(id=message_id, channel=channel)
            return encode(ack.model_copy(update={"duplicate": True}) if duplicate else ack)
        entries = [
            AckEntry(id=message_id, channel=channel).model_copy(update={"duplicate": True})
            if duplicate
            else AckEntry(id=message_id, channel=channel)
            for channel, message_id, duplicate in acks
        ]
        return encode(AckBatch(acks=entries))

    assert _or_error(lambda: codec.acks_frame(acks, batch=batch)) == _or_error(by_models)


@settings(max_examples=400, deadline=None)
@given(surrogate_text, st.booleans())
def test_session_frames_are_encoded_as_the_models_do(token: str, resumed: bool) -> None:
    def by_models() -> str:
        return encode(SessionFrame(session=token, resumed=resumed))

    assert _or_error(lambda: codec.session_frame(token, resumed)) == _or_error(by_models)


@settings(max_examples=400, deadline=None)
@given(names, names, surrogate_text)
def test_deltas_are_encoded_as_the_models_do(channel: str, message_id: str, delta: str) -> None:
    def by_models() -> str:
        return encode(DeltaFrame.model_construct(channel=channel, id=message_id, delta=delta))

    got = _or_error(lambda: codec.encode_delta(channel, message_id, delta))
    assert got == _or_error(by_models)


@settings(max_examples=400, deadline=None)
@given(
    names,
    names,
    surrogate_text,
    st.one_of(st.none(), st.dictionaries(edge_text, json_value, max_size=3)),
    st.one_of(st.none(), st.lists(st.dictionaries(edge_text, json_value, max_size=3), max_size=3)),
)
def test_message_bodies_are_encoded_as_the_models_do(
    channel: str,
    message_id: str,
    text: str,
    meta: dict[str, Any] | None,
    parts: list[dict[str, Any]] | None,
) -> None:
    def by_models() -> str:
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

    got = _or_error(lambda: codec.message_body(channel, message_id, text, meta, parts))
    assert got == _or_error(by_models)


def _accepted_by(decode: Any, raw: str) -> bool:
    try:
        decode(raw)
    except FrameRejected:
        return False
    return True


def test_the_depth_the_models_read_is_the_depth_every_path_takes() -> None:
    """A frame nesting ``meta`` or ``chunk`` around the models' depth: msgspec reads deeper,
    so the frames it read that nest past it (``nests_too_deep``) go to the models, and the
    fast path takes exactly what the models take, one event or a batch."""
    shapes = [
        '{"id":"d","delta":"x","meta":{"a":%s}}',
        '{"id":"d","chunk":{"type":"data-x","data":%s}}',
        '[{"id":"e","delta":"y"},{"id":"d","delta":"x","meta":{"a":%s}}]',
        '{"id":"d","delta":"x","\\u006deta":{"a":%s}}',  # "meta", spelled with an escape
    ]
    cut = set()
    for shape in shapes:
        for depth in range(185, 215):
            raw = shape % ("[" * depth + "]" * depth)
            fast = codec.decode_events(raw)
            read = fast is not None  # (decode_events leaves a frame nested too deep out)
            by_models = _accepted_by(codec.decode_by_models, raw)
            assert _accepted_by(codec.decode_producer_frame, raw) == by_models, (shape, depth)
            if read:
                assert by_models, (shape, depth)  # msgspec's reading is trusted only within
            if not by_models:
                cut.add(shape)
    assert cut == set(shapes)  # each shape crosses the models' depth within the range
