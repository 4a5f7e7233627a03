"""The one table of error codes to HTTP statuses, and the answer of ``POST /produce`` built
from its frames' own JSON: byte for byte what loading and dumping them again gave."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest
from token_relay.core.codec import acks_frame
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.grants import Grant, Role
from token_relay.core.protocol import error_frame
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


def _producer() -> HttpProducer:
    return HttpProducer(
        cast(asyncio.Transport, object()),
        path="/produce",
        client="test",
        grant=Grant(Role.PRODUCE, ("*",)),
        ndjson=True,
        named=False,
        max_line=1000,
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
    producer = _producer()
    for data in frames:
        producer.collect(data)
    assert producer.answer() == _as_before(frames)
    assert producer.codes == {"seq_gap"}
    assert json.loads(producer.answer())["acks"][1] == {"id": "m\u00e9\u2713", "channel": "c"}


def test_an_empty_answer() -> None:
    assert _producer().answer() == b'{"acks":[],"errors":[],"cancels":[]}'
