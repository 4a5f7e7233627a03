"""The one table of error codes to HTTP statuses, and the answer of ``POST /produce`` built
from its frames' own JSON: byte for byte what loading and dumping them again gave, the
frames told apart by how they start exactly as by reading them."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from token_relay.core.codec import acks_frame, session_frame
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.grants import Grant, Role
from token_relay.core.protocol import Cancel, encode, error_frame
from token_relay.edge.httpproducer import HttpProducer
from token_relay.edge.statuses import CANCEL_CODES, JOIN_CODES, produce_status, status_of


@pytest.mark.parametrize(
    ("codes", "status"),
    [
        (set(), 200),
        ({"seq_gap", "id_in_use"}, 200),  # refused events, listed in errors
        ({"invalid_json"}, 400),
        ({"invalid_json", "line_too_long"}, 413),
        ({"message_too_large", "broker_unavailable"}, 503),
        ({"broker_unavailable", "rate_limited"}, 429),
        ({"rate_limited", "producer_moved"}, 409),
        ({"producer_busy", "too_many_producers"}, 429),
        ({"too_many_producers", "body_too_large", "invalid_json"}, 413),
    ],
)
def test_a_producer_request_takes_the_status_of_its_first_listed_code(
    codes: set[str], status: int
) -> None:
    assert produce_status(codes) == status


def test_each_surface_maps_only_its_own_codes() -> None:
    assert [status_of(code, CANCEL_CODES) for code in CANCEL_CODES] == [403, 404, 503]
    assert status_of("rate_limited", CANCEL_CODES) == 400
    assert status_of("invalid_frame", CANCEL_CODES) == 400
    assert status_of("forbidden", JOIN_CODES) == 403
    assert status_of("broker_unavailable", JOIN_CODES) == 503
    assert status_of("unknown_message", JOIN_CODES) == 400
    assert status_of("not_a_code_at_all", JOIN_CODES) == 400


def ndjson_producer(transport: object = None, max_line: int = 1000) -> HttpProducer:
    """An unnamed producer of an NDJSON ``POST /produce`` on ``transport``, any channel."""
    return HttpProducer(
        cast(asyncio.Transport, transport),
        path="/produce",
        client="test",
        grant=Grant(Role.PRODUCE, ("*",)),
        ndjson=True,
        named=False,
        max_line=max_line,
    )


def _as_before(frames: list[bytes]) -> bytes:
    """The answer as it was built before: every frame loaded, then all dumped again."""
    answer: dict[str, list[Any]] = {"acks": [], "errors": [], "cancels": []}
    for data in frames:
        frame = json.loads(data)
        kind = frame["type"]
        if kind == "ack":
            answer["acks"].append(frame)
        elif kind == "acks":
            answer["acks"].extend(frame["acks"])
        elif kind in ("error", "cancel"):
            answer[kind + "s"].append(frame)
    return json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode()


def test_the_answer_is_the_frames_own_json_joined() -> None:
    frames = [
        acks_frame([("c", "m1", False)], batch=False).encode(),
        acks_frame([("c", "m\u00e9\u2713", False), ("c\t2", 'q"uote', True)], batch=True).encode(),
        acks_frame([], batch=True).encode(),
        acks_frame([("c", "m3", True)], batch=False).encode(),
        error_frame(
            FrameRejected(ErrorCode.SEQ_GAP, "a gap \u2014 here\n", "m4", expected=3)
        ).encode(),
        b'{"type":"cancel","channel":"c","id":"m1"}',
        b'{"type":"session","session":"s","resumed":false}',  # not part of the answer
    ]
    producer = ndjson_producer()
    for data in frames:
        producer.collect(data)
    assert producer.answer() == _as_before(frames)
    assert producer.codes == {"seq_gap"}
    assert json.loads(producer.answer())["acks"][1] == {"id": "m\u00e9\u2713", "channel": "c"}


def test_an_empty_answer() -> None:
    assert ndjson_producer().answer() == b'{"acks":[],"errors":[],"cancels":[]}'


text = st.text(max_size=6) | st.text(alphabet=st.sampled_from('a"\\\n\x00\u2028\u00e9\U0001f600,'))
numbers = st.none() | st.integers(min_value=0, max_value=2**40)
acks = st.builds(
    lambda entries, batch: acks_frame(entries[:1] if not batch else entries, batch=batch),
    st.lists(st.tuples(text, text, st.booleans()), min_size=1, max_size=3),
    st.booleans(),
)
errors = st.builds(
    lambda code, message, message_id, index, expected, line, channel: error_frame(
        FrameRejected(code, message, message_id, index, expected=expected, line=line), channel
    ),
    st.sampled_from(ErrorCode),
    text,
    st.none() | text,
    numbers,
    numbers,
    numbers,
    st.none() | text,
)
cancels = st.builds(
    lambda channel, message_id: encode(Cancel(channel=channel, id=message_id)),
    st.text(alphabet="ab-_", min_size=1, max_size=4),
    st.text(alphabet="ab-_", min_size=1, max_size=4),
)
sessions = st.builds(session_frame, text, st.booleans())
frame = st.one_of(acks, errors, cancels, sessions)
# The same frames written by another encoder: spaced out, or with their type moved last.
respaced = frame.map(lambda data: json.dumps(json.loads(data)))
reordered = frame.map(lambda data: json.dumps(dict(reversed(json.loads(data).items()))))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(frame, respaced, reordered), max_size=8))
def test_frames_are_told_apart_by_their_start_as_by_reading_them(frames: list[str]) -> None:
    fast, read = ndjson_producer(), ndjson_producer()
    for data in frames:
        fast.collect(data.encode())
        read.collect_parsed(data.encode())
    assert (fast.acks, fast.errors, fast.cancels, fast.codes) == (
        read.acks,
        read.errors,
        read.cancels,
        read.codes,
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(frame, max_size=8))
def test_the_answer_to_generated_frames_is_what_loading_and_dumping_them_gave(
    frames: list[str],
) -> None:
    producer = ndjson_producer()
    for data in frames:
        producer.collect(data.encode())
    assert producer.answer() == _as_before([data.encode() for data in frames])
