"""Tests for token_relay.core.parts: message parts as ai 7's readUIMessageStream builds them.

The expected parts were read from ai 7.0.173's ``processUIMessageStream`` (and the
partial-JSON table from its ``parsePartialJson``, run on the same texts).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from token_relay.core.errors import ConfigError, PartRejected, PeerError, UsageError
from token_relay.core.parts import ABSENT, CODES, MessageParts, PartLimits, _partial_json

Chunk = dict[str, Any]

HIGH, LOW = "\ud83d", "\ude00"  # the two halves of U+1F600
GRIN = "\U0001f600"


def play(message: MessageParts, events: Iterable[Mapping[str, Any]]) -> list[int | None]:
    """Apply chunks; an event without ``type`` is a top-level delta."""
    return [
        message.delta(event["delta"]) if set(event) == {"delta"} else message.apply(event)
        for event in events
    ]


def built(events: Iterable[Mapping[str, Any]], limits: PartLimits | None = None) -> MessageParts:
    message = MessageParts(limits) if limits else MessageParts()
    play(message, events)
    return message


def snapshot(message: MessageParts) -> tuple[Any, ...]:
    return (message.parts(), message.catch_up(), message.text(), message.chars())


def refused(message: MessageParts, event: Mapping[str, Any], code: str) -> PartRejected:
    """Apply ``event``, which must be refused with ``code`` and change nothing."""
    before = snapshot(message)
    with pytest.raises(PartRejected) as info:
        play(message, [event])
    assert info.value.code == code
    assert snapshot(message) == before
    return info.value


def tool_start(call: str = "c1", name: str = "weather", **extra: Any) -> Chunk:
    return {"type": "tool-input-start", "toolCallId": call, "toolName": name, **extra}


def tool_delta(text: str, call: str = "c1") -> Chunk:
    return {"type": "tool-input-delta", "toolCallId": call, "inputTextDelta": text}


def tool_ready(value: Any, call: str = "c1", name: str = "weather", **extra: Any) -> Chunk:
    chunk = {"type": "tool-input-available", "toolCallId": call, "toolName": name}
    return {**chunk, "input": value, **extra}


def text_delta(delta: str, chunk_id: str = "t1", kind: str = "text") -> Chunk:
    return {"type": f"{kind}-delta", "id": chunk_id, "delta": delta}


# ------------------------------------------------------------------ text and reasoning


def test_text_part_start_delta_end() -> None:
    message = MessageParts()
    assert play(
        message,
        [
            {"type": "text-start", "id": "t1"},
            text_delta("Hel"),
            text_delta("lo"),
            {"type": "text-end", "id": "t1"},
        ],
    ) == [0, 0, 0, 0]
    assert message.parts() == [{"type": "text", "text": "Hello", "state": "done"}]
    assert message.text() == "Hello"
    assert message.chars() == len("t1") + len("Hello")  # its chunk id and its text


def test_text_part_keeps_provider_metadata_and_citations_as_ai_does() -> None:
    citation = {"source": {"type": "source", "sourceType": "url", "id": "s", "url": "u"}}
    message = built(
        [
            {"type": "text-start", "id": "t1", "providerMetadata": {"a": {"x": 1}}},
            text_delta("a"),
            {**text_delta("b"), "providerMetadata": {"a": {"x": 2}}},
            {"type": "text-end", "id": "t1", "citations": [citation]},
        ]
    )
    assert message.parts() == [
        {
            "type": "text",
            "text": "ab",
            "providerMetadata": {"a": {"x": 2}},
            "state": "done",
            "citations": [citation],
        }
    ]


def test_reasoning_part_carries_its_id() -> None:
    message = built(
        [
            {"type": "reasoning-start", "id": "r1"},
            text_delta("think", "r1", "reasoning"),
            {"type": "reasoning-end", "id": "r1", "providerMetadata": {"p": {"sig": "s"}}},
        ]
    )
    assert message.parts() == [
        {
            "type": "reasoning",
            "id": "r1",
            "text": "think",
            "providerMetadata": {"p": {"sig": "s"}},
            "state": "done",
        }
    ]
    assert message.text() == ""
    assert message.chars() == len("r1") + len("think") + len('{"p":{"sig":"s"}}')


def test_text_and_reasoning_ids_are_separate_and_an_ended_id_starts_anew() -> None:
    message = built(
        [
            {"type": "text-start", "id": "x"},
            {"type": "reasoning-start", "id": "x"},
            text_delta("T", "x"),
            text_delta("R", "x", "reasoning"),
            {"type": "text-end", "id": "x"},
            {"type": "text-start", "id": "x"},
            text_delta("again", "x"),
        ]
    )
    assert message.parts() == [
        {"type": "text", "text": "T", "state": "done"},
        {"type": "reasoning", "id": "x", "text": "R", "state": "streaming"},
        {"type": "text", "text": "again", "state": "streaming"},
    ]
    assert message.text() == "Tagain"


def test_empty_deltas_count() -> None:
    message = built([{"type": "text-start", "id": "t1"}, text_delta(""), text_delta("")])
    assert message.parts() == [{"type": "text", "text": "", "state": "streaming"}]
    # An empty delta to an ended part is still a delta for an ended part.
    message.apply({"type": "text-end", "id": "t1"})
    refused(message, text_delta(""), "part_ended")


# ------------------------------------------------------------------ the implicit part


def test_first_top_level_delta_creates_the_implicit_text_part_where_the_message_is() -> None:
    message = built([{"type": "reasoning-start", "id": "r"}, text_delta("why", "r", "reasoning")])
    assert message.delta("Hel") == 1
    message.apply({"type": "source-url", "sourceId": "s", "url": "https://a"})
    assert message.delta("lo") == 1
    assert message.parts() == [
        {"type": "reasoning", "id": "r", "text": "why", "state": "streaming"},
        {"type": "text", "text": "Hello", "state": "streaming"},
        {"type": "source-url", "sourceId": "s", "url": "https://a"},
    ]
    assert message.text() == "Hello"


def test_an_empty_first_delta_creates_the_implicit_part() -> None:
    message = MessageParts()
    assert message.delta("") == 0
    assert message.parts() == [{"type": "text", "text": "", "state": "streaming"}]
    assert message.delta("") == 0
    assert message.parts() == [{"type": "text", "text": "", "state": "streaming"}]


def test_the_implicit_part_is_chunk_id_text() -> None:
    message = built([{"delta": "a"}, text_delta("b", "text"), {"delta": "c"}])
    assert message.parts() == [{"type": "text", "text": "abc", "state": "streaming"}]
    refused(message, {"type": "text-start", "id": "text"}, "part_exists")
    message.apply({"type": "text-end", "id": "text"})
    refused(message, {"delta": "late"}, "part_ended")


def test_a_producer_may_open_the_implicit_part_itself() -> None:
    message = built([{"type": "text-start", "id": "text"}, {"delta": "hi"}])
    assert message.parts() == [{"type": "text", "text": "hi", "state": "streaming"}]


def test_a_delta_must_be_a_string() -> None:
    with pytest.raises(UsageError):
        MessageParts().delta(b"x")  # type: ignore[arg-type]


# ------------------------------------------------------------------ surrogates


@pytest.mark.parametrize("kind", ["text", "reasoning"])
def test_a_surrogate_pair_split_across_deltas_is_joined(kind: str) -> None:
    message = built([{"type": f"{kind}-start", "id": "p"}, text_delta("a" + HIGH, "p", kind)])
    assert message.parts()[0]["text"] == "a"  # the half waits for its pair
    assert message.chars() == len("p") + 1
    message.apply(text_delta(LOW + "b", "p", kind))
    assert message.parts()[0]["text"] == "a" + GRIN + "b"
    assert message.chars() == len("p") + 3


def test_a_pair_split_by_empty_deltas_is_still_joined() -> None:
    message = built([{"delta": HIGH}, {"delta": ""}, {"delta": LOW}])
    assert message.text() == GRIN


@pytest.mark.parametrize(
    "ending",
    [
        {"type": "text-end", "id": "p"},
        {"type": "finish-step"},
        None,  # finalize
    ],
)
def test_a_lone_half_becomes_u_fffd_when_the_part_ends(ending: Chunk | None) -> None:
    message = built([{"type": "text-start", "id": "p"}, text_delta("a" + HIGH, "p")])
    if ending is None:
        message.finalize()
    else:
        message.apply(ending)
    assert message.text() == "a\ufffd"
    assert message.chars() == len("p") + 2


def test_a_half_that_does_not_pair_becomes_u_fffd_at_once() -> None:
    message = built([{"delta": HIGH}, {"delta": "x"}, {"delta": LOW}])
    assert message.text() == "\ufffdx\ufffd"


def test_halves_pair_within_one_part_only() -> None:
    message = built(
        [
            {"type": "text-start", "id": "a"},
            {"type": "text-start", "id": "b"},
            text_delta(HIGH, "a"),
            text_delta(LOW, "b"),
            text_delta(LOW, "a"),
        ]
    )
    assert [part["text"] for part in message.parts()] == [GRIN, "\ufffd"]


def test_tool_input_text_joins_surrogate_pairs_too() -> None:
    message = built([tool_start(), tool_delta('"' + HIGH), tool_delta(LOW + '"')])
    assert message.parts()[0]["rawInput"] == '"' + GRIN + '"'
    assert message.parts()[0]["input"] == GRIN
    lone = built([tool_start(), tool_delta('"' + HIGH), tool_ready("x")])
    assert lone.catch_up()[1]["inputTextDelta"] == '"\ufffd'


# ------------------------------------------------------------------ tools


def test_tool_streams_its_input_as_partial_json_then_gets_input_and_output() -> None:
    message = MessageParts()
    assert play(message, [tool_start(title="Weather"), tool_delta('{"city":"Pa')]) == [0, 0]
    assert message.parts() == [
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "input-streaming",
            "title": "Weather",
            "input": {"city": "Pa"},
            "rawInput": '{"city":"Pa',
        }
    ]
    play(message, [tool_delta('ris"}'), tool_ready({"city": "Paris"})])
    assert message.parts() == [
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "input-available",
            "title": "Weather",
            "input": {"city": "Paris"},
        }
    ]
    message.apply(
        {
            "type": "tool-output-available",
            "toolCallId": "c1",
            "output": {"temperature": 20},
            "providerMetadata": {"p": {"id": 1}},
        }
    )
    assert message.parts() == [
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "output-available",
            "title": "Weather",
            "input": {"city": "Paris"},
            "output": {"temperature": 20},
            "resultProviderMetadata": {"p": {"id": 1}},
        }
    ]
    # The input text and the input, the output, and the strings and metadata kept.
    assert message.chars() == (
        len('{"city":"Paris"}') * 2
        + len('{"temperature":20}')
        + len("c1")
        + len("weather")
        + len("Weather")
        + len('{"p":{"id":1}}')
    )


def test_tool_start_without_deltas_has_no_input_key() -> None:
    message = built([tool_start(providerExecuted=True, providerMetadata={"o": {"k": 1}})])
    assert message.parts() == [
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "input-streaming",
            "providerExecuted": True,
            "callProviderMetadata": {"o": {"k": 1}},
        }
    ]


def test_an_empty_input_delta_counts_rawinput_becomes_empty() -> None:
    message = built([tool_start(), tool_delta("")])
    assert message.parts() == [
        {"type": "tool-weather", "toolCallId": "c1", "state": "input-streaming", "rawInput": ""}
    ]


def test_tool_input_available_may_come_without_a_start() -> None:
    message = built([tool_ready({"a": 1}, title="T", toolMetadata={"m": 1})])
    assert message.parts() == [
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "input-available",
            "title": "T",
            "toolMetadata": {"m": 1},
            "input": {"a": 1},
        }
    ]


def test_dynamic_tool_with_text_encoding() -> None:
    message = built(
        [
            tool_start("d1", "search", dynamic=True, inputEncoding="text"),
            tool_delta("cats ", "d1"),
            tool_delta("and dogs", "d1"),
        ]
    )
    assert message.parts() == [
        {
            "type": "dynamic-tool",
            "toolName": "search",
            "toolCallId": "d1",
            "state": "input-streaming",
            "input": "cats and dogs",
            "inputEncoding": "text",
            "rawInput": "cats and dogs",
        }
    ]
    message.apply(tool_ready("cats and dogs", "d1", "search", dynamic=True))
    assert message.parts() == [
        {
            "type": "dynamic-tool",
            "toolName": "search",
            "toolCallId": "d1",
            "state": "input-available",
            "input": "cats and dogs",
        }
    ]


def test_tool_input_error() -> None:
    message = built(
        [
            tool_start(),
            tool_delta('{"x'),
            {
                "type": "tool-input-error",
                "toolCallId": "c1",
                "toolName": "weather",
                "input": '{"x',
                "errorText": "not JSON",
            },
        ]
    )
    assert message.parts() == [
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "output-error",
            "input": '{"x',
            "errorText": "not JSON",
        }
    ]
    refused(message, tool_delta("more"), "part_ended")
    refused(
        message, {"type": "tool-output-available", "toolCallId": "c1", "output": 1}, "part_ended"
    )


def test_preliminary_outputs_then_the_final_one() -> None:
    message = built([tool_ready({})])
    output = {"type": "tool-output-available", "toolCallId": "c1"}
    message.apply({**output, "output": "1/2", "preliminary": True})
    assert message.parts()[0]["preliminary"] is True
    assert message.parts()[0]["output"] == "1/2"
    message.apply({**output, "output": "done"})
    assert message.parts() == [
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "output-available",
            "input": {},
            "output": "done",
        }
    ]
    refused(message, {**output, "output": "again"}, "part_ended")


def test_tool_output_error_after_input() -> None:
    message = built(
        [tool_ready({}), {"type": "tool-output-error", "toolCallId": "c1", "errorText": "boom"}]
    )
    assert message.parts() == [
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "output-error",
            "input": {},
            "errorText": "boom",
        }
    ]


def test_tool_output_error_while_input_streams_keeps_the_raw_text_for_a_static_tool() -> None:
    chunks = [tool_start(), tool_delta('{"a": nu')]
    error = {"type": "tool-output-error", "toolCallId": "c1", "errorText": "boom"}
    static = built([*chunks, error])
    assert static.parts() == [
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "output-error",
            "input": {"a": None},
            "rawInput": '{"a": nu',
            "errorText": "boom",
        }
    ]
    dynamic = built([tool_start(dynamic=True), tool_delta('{"a": nu'), error])
    assert dynamic.parts() == [
        {
            "type": "dynamic-tool",
            "toolName": "weather",
            "toolCallId": "c1",
            "state": "output-error",
            "input": {"a": None},
            "errorText": "boom",
        }
    ]


def test_approval_requested_responded_then_denied() -> None:
    message = built(
        [
            tool_ready({"cmd": "rm"}),
            {
                "type": "tool-approval-request",
                "toolCallId": "c1",
                "approvalId": "a1",
                "reason": "dangerous",
                "isAutomatic": False,
                "inputSchemaInput": None,
            },
        ]
    )
    assert message.parts()[0]["state"] == "approval-requested"
    assert message.parts()[0]["approval"] == {
        "id": "a1",
        "inputSchemaInput": None,
        "requestReason": "dangerous",
    }
    assert (
        message.apply(
            {
                "type": "tool-approval-response",
                "approvalId": "a1",
                "approved": False,
                "reason": "no",
            }
        )
        == 0
    )
    message.apply({"type": "tool-output-denied", "toolCallId": "c1"})
    assert message.parts() == [
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "output-denied",
            "input": {"cmd": "rm"},
            "approval": {
                "id": "a1",
                "inputSchemaInput": None,
                "requestReason": "dangerous",
                "approved": False,
                "reason": "no",
            },
        }
    ]


def test_outputs_find_a_tool_of_an_earlier_step() -> None:
    message = built([tool_ready({}), {"type": "start-step"}])
    assert message.apply({"type": "tool-output-available", "toolCallId": "c1", "output": 1}) == 0


def test_a_tool_still_streaming_when_a_step_starts_takes_no_more_input() -> None:
    message = built([tool_start(), tool_delta("{"), {"type": "start-step"}])
    refused(message, tool_delta("}"), "part_ended")
    refused(message, tool_ready({}), "part_ended")


# ------------------------------------------------------------------ sources, files, data, steps


def test_sources_and_files() -> None:
    message = MessageParts()
    chunks = [
        {"type": "source-url", "sourceId": "s1", "url": "https://e.x", "title": "E"},
        {
            "type": "source-document",
            "sourceId": "s2",
            "mediaType": "application/pdf",
            "title": "Paper",
            "filename": "p.pdf",
        },
        {"type": "file", "url": "data:text/plain,x", "mediaType": "text/plain"},
    ]
    assert play(message, chunks) == [0, 1, 2]
    assert message.parts() == [
        {"type": "source-url", "sourceId": "s1", "url": "https://e.x", "title": "E"},
        {
            "type": "source-document",
            "sourceId": "s2",
            "mediaType": "application/pdf",
            "title": "Paper",
            "filename": "p.pdf",
        },
        {"type": "file", "mediaType": "text/plain", "url": "data:text/plain,x"},
    ]


def test_data_parts_update_in_place_by_type_and_id() -> None:
    message = MessageParts()
    assert message.apply({"type": "data-status", "id": "s", "data": {"n": 1}}) == 0
    assert message.apply({"type": "data-other", "id": "s", "data": 0}) == 1
    assert message.apply({"type": "data-note", "data": [1]}) == 2
    assert message.apply({"type": "data-status", "id": "s", "data": {"n": 22}}) == 0
    assert message.apply({"type": "data-note", "data": [2]}) == 3
    assert message.parts() == [
        {"type": "data-status", "id": "s", "data": {"n": 22}},
        {"type": "data-other", "id": "s", "data": 0},
        {"type": "data-note", "data": [1]},
        {"type": "data-note", "data": [2]},
    ]
    # Each part's data (the one replaced by id counted as it is now), name and id.
    assert message.chars() == (
        (len('{"n":22}') + len("status") + len("s"))
        + (len("0") + len("other") + len("s"))
        + (len("[1]") + len("note")) * 2
    )


def test_transient_data_is_not_stored() -> None:
    message = MessageParts()
    before = snapshot(message)
    assert message.apply({"type": "data-progress", "data": 0.5, "transient": True}) is None
    assert snapshot(message) == before
    # A transient chunk is still checked.
    refused(message, {"type": "data-progress", "transient": True}, "invalid_chunk")


def test_steps() -> None:
    message = MessageParts()
    assert message.apply({"type": "start-step"}) == 0
    message.delta("a")
    assert message.apply({"type": "finish-step"}) is None
    assert message.apply({"type": "start-step"}) == 2
    assert message.parts() == [
        {"type": "step-start"},
        {"type": "text", "text": "a", "state": "streaming"},
        {"type": "step-start"},
    ]


def test_finish_step_ends_open_text_and_reasoning_parts_keeping_their_state() -> None:
    message = built(
        [
            {"type": "text-start", "id": "t1"},
            {"type": "reasoning-start", "id": "r1"},
            tool_start(),
            {"delta": "implicit"},
            {"type": "finish-step"},
        ]
    )
    states = [part["state"] for part in message.parts()]
    assert states == ["streaming", "streaming", "input-streaming", "streaming"]
    refused(message, text_delta("x"), "part_ended")
    refused(message, {"type": "reasoning-end", "id": "r1"}, "part_ended")
    refused(message, {"delta": "x"}, "part_ended")
    assert message.apply(tool_delta("{}")) == 2  # tools end with their step's start
    assert message.apply({"type": "text-start", "id": "t1"}) == 4


# ------------------------------------------------------------------ finalize


def every_kind_streaming() -> list[Chunk]:
    return [
        {"type": "reasoning-start", "id": "r1"},
        text_delta("hm", "r1", "reasoning"),
        tool_start("ok"),
        tool_delta('{"a": [1, 2]}', "ok"),
        tool_start("bad"),
        tool_delta('{"a": [1, 2', "bad"),
        tool_start("dyn", "x", dynamic=True),
        tool_delta("{", "dyn"),
        tool_start("txt", "x", inputEncoding="text"),
        tool_delta("free text", "txt"),
        tool_start("none"),
        tool_ready({}, "ready"),
        {"type": "text-start", "id": "t1"},
        text_delta("answer"),
        {"type": "data-d", "id": "d", "data": 1},
    ]


FINALIZED = [
    {"type": "reasoning", "id": "r1", "text": "hm", "state": "done"},
    {
        "type": "tool-weather",
        "toolCallId": "ok",
        "state": "input-available",
        "input": {"a": [1, 2]},
    },
    {
        "type": "tool-weather",
        "toolCallId": "bad",
        "state": "output-error",
        "input": {"a": [1, 2]},
        "rawInput": '{"a": [1, 2',
        "errorText": "the message ended before this tool call's input was valid JSON",
    },
    {
        "type": "dynamic-tool",
        "toolName": "x",
        "toolCallId": "dyn",
        "state": "output-error",
        "input": {},
        "errorText": "the message ended before this tool call's input was valid JSON",
    },
    {"type": "tool-x", "toolCallId": "txt", "state": "input-available", "input": "free text"},
    {
        "type": "tool-weather",
        "toolCallId": "none",
        "state": "output-error",
        "errorText": "the message ended before this tool call's input was valid JSON",
    },
    {"type": "tool-weather", "toolCallId": "ready", "state": "input-available", "input": {}},
    {"type": "text", "text": "answer", "state": "done"},
    {"type": "data-d", "id": "d", "data": 1},
]


def test_finalize_completes_every_kind_of_part() -> None:
    message = built(every_kind_streaming())
    assert not message.finalized
    message.finalize()
    assert message.finalized
    assert message.parts() == FINALIZED


def test_finalize_is_idempotent() -> None:
    message = built(every_kind_streaming())
    message.finalize()
    once = snapshot(message)
    message.finalize()
    assert snapshot(message) == once


def test_finalize_of_an_empty_message() -> None:
    message = MessageParts()
    message.finalize()
    assert message.parts() == []
    assert message.text() == ""
    assert message.catch_up() == []


def test_nothing_applies_after_finalize() -> None:
    message = built(every_kind_streaming())
    message.finalize()
    before = snapshot(message)
    late = [
        text_delta("more"),
        {"type": "text-start", "id": "t9"},
        tool_delta("x", "ok"),
        {"type": "tool-output-available", "toolCallId": "ok", "output": 1},
        {"type": "data-d", "id": "d", "data": 2},
        {"type": "start-step"},
        {"type": "no-such-type"},
        {"type": "finish"},
    ]
    assert [message.apply(chunk) for chunk in late] == [None] * len(late)
    assert message.delta("more") is None
    assert snapshot(message) == before


def test_finalize_parses_input_as_json_parse_does() -> None:
    for raw, expected in [
        ('{"a": 1.5e3}', {"a": 1500.0}),
        (" [true, null] ", [True, None]),
        ("NaN", ABSENT),
        ('{"__proto__": {}}', ABSENT),
        ("{'a': 1}", ABSENT),
    ]:
        message = built([tool_start(), tool_delta(raw)])
        message.finalize()
        (part,) = message.parts()
        if expected is ABSENT:
            assert part["state"] == "output-error", raw
        else:
            assert (part["state"], part["input"]) == ("input-available", expected)


# ------------------------------------------------------------------ partial JSON, as ai repairs it

PARTIAL_JSON = [
    ("", ABSENT),
    (" ", ABSENT),
    ("{", {}),
    ('{"', {}),
    ('{"ci', {}),
    ('{"city"', {}),
    ('{"city":', {}),
    ('{"city":"Pa', {"city": "Pa"}),
    ('{"city":"Paris","n":[1,tr', {"city": "Paris", "n": [1, True]}),
    ('{"n": -', {}),
    ('{"n": 12.5e', {"n": 12.5}),
    ('{"n": 12.', {"n": 12}),
    ('[1, 2, {"a": [true, nul', [1, 2, {"a": [True, None]}]),
    ('"abc\\n\\u12', "abc\n"),
    ('"x\\u00e9', "xé"),
    ("[1,]", [1]),
    ('{"a":1,}', {"a": 1}),
    ("xyz", ABSENT),
    ("NaN", ABSENT),
    ("[Infinity]", ABSENT),
    ('{"__proto__": 1}', ABSENT),
    ('{"constructor": {"prototype": 1}}', ABSENT),
    ('{"a":"b"}}', {"a": "b"}),
    ("[[[", [[[]]]),
    ('{"a" 1}', {}),
    ('{"é": "ü😀', {"é": "ü😀"}),
    ("fals", False),
    ("nu", None),
    ("[tx", ABSENT),
    ('{"a": trux', ABSENT),
    ("-", ABSENT),
    ("0", 0),
    ("1e400", None),
]


@pytest.mark.parametrize(("text", "expected"), PARTIAL_JSON)
def test_partial_json_matches_ai(text: str, expected: Any) -> None:
    assert _partial_json(text) == expected
    part = built([tool_start(), tool_delta(text)]).parts()[0]
    assert part.get("input", ABSENT) == expected


# ------------------------------------------------------------------ refusals: nothing changes


def test_codes_are_the_designed_ones() -> None:
    assert {
        "invalid_chunk",
        "unknown_part",
        "part_ended",
        "part_exists",
        "too_many_parts",
        "part_too_large",
    } == CODES
    error = PartRejected("unknown_part", "no such part", "t1")
    assert isinstance(error, PeerError)
    assert (error.code, error.message, error.part_id) == ("unknown_part", "no such part", "t1")


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "start", "messageId": "m"},
        {"type": "finish"},
        {"type": "abort"},
        {"type": "error", "errorText": "x"},
        {"type": "message-metadata", "messageMetadata": {}},
        {"type": "reset-step"},
        {"type": "custom", "kind": "a.b"},
        {"type": "reasoning-file", "url": "u", "mediaType": "m"},
        {"type": "no-such-type"},
        {"no": "type"},
        {"type": 3},
        {"type": "text-start"},
        {"type": "text-start", "id": 1},
        {"type": "text-start", "id": "n", "providerMetadata": None},
        {"type": "text-start", "id": "n", "providerMetadata": {"a": 1}},
        {"type": "text-delta", "id": "t1"},
        {"type": "text-delta", "id": "t1", "delta": 5},
        {"type": "text-end", "id": "t1", "citations": {}},
        {"type": "tool-input-start", "toolCallId": "n"},
        {"type": "tool-input-start", "toolCallId": "n", "toolName": "x", "inputEncoding": "xml"},
        {"type": "tool-input-start", "toolCallId": "n", "toolName": "x", "dynamic": "yes"},
        {"type": "tool-input-start", "toolCallId": "n", "toolName": "x", "title": None},
        {"type": "tool-input-start", "toolCallId": "n", "toolName": "x", "toolMetadata": []},
        {"type": "tool-input-available", "toolCallId": "n", "toolName": "x"},
        {"type": "tool-input-available", "toolCallId": "n", "toolName": "x", "input": float("nan")},
        {"type": "tool-input-available", "toolCallId": "n", "toolName": "x", "input": object()},
        {"type": "tool-output-available", "toolCallId": "c1"},
        {"type": "tool-approval-response", "approvalId": "a", "approved": "yes"},
        {"type": "source-url", "sourceId": "s"},
        {"type": "source-document", "sourceId": "s", "mediaType": "m"},
        {"type": "file", "url": "u"},
        {"type": "data-x"},
        {"type": "data-x", "data": 1, "extra": True},
        {"type": "data-x", "data": 1, "id": 7},
        # while its input streams, a tool gets no output: input-available comes first
        {"type": "tool-output-available", "toolCallId": "c1", "output": 1},
        {"type": "tool-output-denied", "toolCallId": "c1"},
        {"type": "tool-approval-request", "toolCallId": "c1", "approvalId": "a"},
        # a tool call keeps its tool and kind
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "other", "input": 1},
        {**tool_ready(1), "dynamic": True},
    ],
)
def test_invalid_chunk(chunk: Chunk) -> None:
    message = built([{"type": "text-start", "id": "t1"}, tool_start()])
    refused(message, chunk, "invalid_chunk")


def test_a_chunk_without_its_id_is_invalid_even_when_an_empty_id_is_open() -> None:
    message = built([{"type": "text-start", "id": ""}, tool_start("")])
    refused(message, {"type": "text-delta", "delta": "x"}, "invalid_chunk")
    refused(message, {"type": "tool-input-delta", "inputTextDelta": "x"}, "invalid_chunk")
    play(message, [text_delta("x", ""), tool_delta("1", "")])
    assert message.parts()[0]["text"] == "x"
    assert message.parts()[1]["input"] == 1


def test_any_mapping_is_a_chunk() -> None:
    message = built([MappingProxyType({"type": "text-start", "id": "t1"})])
    message.apply(MappingProxyType(text_delta("x")))
    assert message.text() == "x"


def test_a_chunk_that_is_not_a_mapping_is_invalid() -> None:
    refused(MessageParts(), ["text-start"], "invalid_chunk")  # type: ignore[list-item]


@pytest.mark.parametrize(
    "chunk",
    [
        text_delta("x", "nope"),
        {"type": "text-end", "id": "nope"},
        text_delta("x", "t1", "reasoning"),  # t1 is a text part, not reasoning
        {"type": "reasoning-end", "id": "t1"},
        tool_delta("x", "nope"),
        {"type": "tool-output-available", "toolCallId": "nope", "output": 1},
        {"type": "tool-output-error", "toolCallId": "nope", "errorText": "e"},
        {"type": "tool-output-denied", "toolCallId": "nope"},
        {"type": "tool-approval-request", "toolCallId": "nope", "approvalId": "a"},
        {"type": "tool-approval-response", "approvalId": "nope", "approved": True},
    ],
)
def test_unknown_part(chunk: Chunk) -> None:
    message = built([{"type": "text-start", "id": "t1"}])
    error = refused(message, chunk, "unknown_part")
    named = chunk.get("id", chunk.get("toolCallId", chunk.get("approvalId")))
    assert error.part_id == named


@pytest.mark.parametrize(
    "chunk",
    [
        text_delta("x"),
        {"type": "text-end", "id": "t1"},
        text_delta("x", "r1", "reasoning"),
        tool_delta("x"),
        tool_ready({}),
        {
            "type": "tool-input-error",
            "toolCallId": "c1",
            "toolName": "weather",
            "input": 1,
            "errorText": "e",
        },
        {"type": "tool-output-available", "toolCallId": "c2", "output": 2},
        {"type": "tool-output-denied", "toolCallId": "c2"},
        {"type": "tool-approval-response", "approvalId": "a1", "approved": True},
        {"delta": "x"},
    ],
)
def test_part_ended(chunk: Chunk) -> None:
    message = built(
        [
            {"type": "text-start", "id": "t1"},
            {"type": "text-end", "id": "t1"},
            {"type": "reasoning-start", "id": "r1"},
            {"type": "reasoning-end", "id": "r1"},
            tool_start(),
            tool_ready({}),
            tool_ready({}, "c2"),
            {"type": "tool-approval-request", "toolCallId": "c2", "approvalId": "a1"},
            {"type": "tool-approval-response", "approvalId": "a1", "approved": True},
            {"type": "tool-output-available", "toolCallId": "c2", "output": 1},
            {"delta": "implicit"},
            {"type": "text-end", "id": "text"},
        ]
    )
    refused(message, chunk, "part_ended")


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "text-start", "id": "t1"},
        {"type": "reasoning-start", "id": "r1"},
        tool_start(),
        tool_start(dynamic=True),
        tool_start("c2"),
        {"type": "tool-approval-request", "toolCallId": "c3", "approvalId": "a1"},
    ],
)
def test_part_exists(chunk: Chunk) -> None:
    message = built(
        [
            {"type": "text-start", "id": "t1"},
            {"type": "reasoning-start", "id": "r1"},
            tool_start(),
            tool_ready({}, "c2"),
            {"type": "tool-approval-request", "toolCallId": "c2", "approvalId": "a1"},
            tool_ready({}, "c3"),
        ]
    )
    refused(message, chunk, "part_exists")


def test_a_refusal_leaves_the_message_going() -> None:
    message = built([{"type": "text-start", "id": "t1"}, text_delta("a")])
    refused(message, text_delta("x", "nope"), "unknown_part")
    refused(message, {"type": "finish"}, "invalid_chunk")
    message.apply(text_delta("b"))
    assert message.text() == "ab"


# ------------------------------------------------------------------ bounds


def test_limits_have_the_documented_defaults_and_are_checked() -> None:
    assert PartLimits() == PartLimits(256, 1_048_576, 262_144, 65_536)
    for bad in ({"max_parts": 0}, {"max_part_chars": 0}, {"max_tool_input_chars": 0}):
        with pytest.raises(ConfigError):
            PartLimits(**bad)
    with pytest.raises(ConfigError):
        PartLimits(max_data_bytes=3)


def test_max_parts_at_its_limit_and_one_past() -> None:
    limits = PartLimits(max_parts=3)
    message = built(
        [{"type": "start-step"}, {"type": "data-x", "id": "a", "data": 1}, tool_ready({})], limits
    )
    assert len(message.parts()) == 3
    for chunk in [
        {"type": "start-step"},
        {"type": "text-start", "id": "t"},
        {"type": "reasoning-start", "id": "r"},
        tool_start("c2"),
        tool_ready({}, "c2"),
        {
            "type": "tool-input-error",
            "toolCallId": "c2",
            "toolName": "x",
            "input": 1,
            "errorText": "e",
        },
        {"type": "source-url", "sourceId": "s", "url": "u"},
        {"type": "source-document", "sourceId": "s", "mediaType": "m", "title": "t"},
        {"type": "file", "url": "u", "mediaType": "m"},
        {"type": "data-x", "data": 2},
        {"type": "data-x", "id": "b", "data": 2},
        {"delta": ""},
    ]:
        refused(message, chunk, "too_many_parts")
    # What changes a part in place still applies.
    assert message.apply({"type": "data-x", "id": "a", "data": 2}) == 1
    assert message.apply({"type": "tool-output-available", "toolCallId": "c1", "output": 1}) == 2
    assert message.apply({"type": "data-x", "data": 2, "transient": True}) is None


@pytest.mark.parametrize("kind", ["text", "reasoning"])
def test_max_part_chars_at_its_limit_and_one_past(kind: str) -> None:
    message = built(
        [{"type": f"{kind}-start", "id": "p"}, text_delta("abc", "p", kind)],
        PartLimits(max_part_chars=5),
    )
    refused(message, text_delta("def", "p", kind), "part_too_large")
    message.apply(text_delta("de", "p", kind))
    assert message.parts()[0]["text"] == "abcde"
    refused(message, text_delta("f", "p", kind), "part_too_large")
    message.apply(text_delta("", "p", kind))  # an empty delta still fits
    assert message.chars() == len("p") + 5


def test_max_part_chars_counts_a_held_half_and_a_pair_as_one() -> None:
    message = built([{"delta": "abc"}], PartLimits(max_part_chars=5))
    message.delta("d" + HIGH)
    assert message.text() == "abcd"
    refused(message, {"delta": LOW + "e"}, "part_too_large")
    message.delta(LOW)
    assert message.text() == "abcd" + GRIN


def test_max_part_chars_bounds_the_first_delta_of_the_implicit_part() -> None:
    message = MessageParts(PartLimits(max_part_chars=2))
    refused(message, {"delta": "abc"}, "part_too_large")
    assert message.delta("ab") == 0


def test_max_part_chars_bounds_every_string_field() -> None:
    limits = PartLimits(max_part_chars=4)
    message = built([{"type": "source-url", "sourceId": "s", "url": "abcd"}], limits)
    refused(message, {"type": "source-url", "sourceId": "s", "url": "abcde"}, "part_too_large")
    refused(message, {"type": "text-start", "id": "12345"}, "part_too_large")


def test_max_tool_input_chars_at_its_limit_and_one_past() -> None:
    message = built([tool_start(), tool_delta("[1,")], PartLimits(max_tool_input_chars=5))
    refused(message, tool_delta("22]"), "part_too_large")
    message.apply(tool_delta("2]"))
    assert message.parts()[0]["input"] == [1, 2]
    refused(message, tool_delta(" "), "part_too_large")


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (lambda value: {"type": "data-x", "id": "d", "data": value}, "data"),
        (lambda value: tool_ready(value, "c9"), "input"),
        (
            lambda value: {"type": "tool-output-available", "toolCallId": "c1", "output": value},
            "output",
        ),
        (lambda value: {"type": "text-start", "id": "n", "providerMetadata": value}, None),
        (lambda value: tool_start("c9", toolMetadata=value), None),
    ],
)
def test_max_data_bytes_at_its_limit_and_one_past(make: Any, key: str | None) -> None:
    # The compact JSON in UTF-8: {"k":{"v":"é"}} is 16 bytes, {"k":{"v":"éa"}} is 17.
    at_limit, past = {"k": {"v": "é"}}, {"k": {"v": "éa"}}
    assert len(json.dumps(at_limit, ensure_ascii=False, separators=(",", ":")).encode()) == 16
    message = built([tool_ready({})], PartLimits(max_data_bytes=16))
    refused(message, make(past), "part_too_large")
    index = message.apply(make(at_limit))
    assert index is not None
    if key is not None:
        assert message.parts()[index][key] == at_limit


def test_max_data_bytes_bounds_an_update_in_place() -> None:
    message = built([{"type": "data-x", "id": "d", "data": 1}], PartLimits(max_data_bytes=4))
    refused(message, {"type": "data-x", "id": "d", "data": 12345}, "part_too_large")
    message.apply({"type": "data-x", "id": "d", "data": 1234})
    assert message.parts() == [{"type": "data-x", "id": "d", "data": 1234}]
    assert message.chars() == len("1234") + len("x") + len("d")


# ------------------------------------------------------------------ text()


def test_text_is_the_concatenation_of_the_text_parts() -> None:
    message = built(
        [
            {"delta": "one "},
            {"type": "reasoning-start", "id": "r"},
            text_delta("not text", "r", "reasoning"),
            {"type": "text-start", "id": "t1"},
            text_delta("two "),
            tool_ready({"q": "not text"}),
            {"type": "text-start", "id": "t2"},
            text_delta("three", "t2"),
        ]
    )
    texts = [part["text"] for part in message.parts() if part["type"] == "text"]
    assert texts == ["one ", "two ", "three"]
    assert message.text() == "".join(texts) == "one two three"


# ------------------------------------------------------------------ catch-up


def mixed_reply() -> list[Chunk]:
    """A long reply: reasoning, tools (streamed input, output, approval), text, sources,
    data updated in place, the implicit part, a split surrogate pair, two steps."""
    return [
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "r1", "providerMetadata": {"p": {"sig": "x"}}},
        text_delta("Let me ", "r1", "reasoning"),
        text_delta("think.", "r1", "reasoning"),
        {"type": "reasoning-end", "id": "r1"},
        tool_start("c1", "weather", title="Weather"),
        tool_delta('{"ci', "c1"),
        tool_delta('ty":"Pa', "c1"),
        tool_delta('ris", "n": [1, tr', "c1"),
        tool_delta("ue]}", "c1"),
        tool_ready({"city": "Paris", "n": [1, True]}, "c1"),
        {"type": "data-status", "id": "s", "data": {"phase": 1}},
        {"type": "tool-output-available", "toolCallId": "c1", "output": 1, "preliminary": True},
        {"type": "tool-output-available", "toolCallId": "c1", "output": {"t": 20}},
        tool_start("c2", "ask", dynamic=True, inputEncoding="text"),
        tool_delta("sure?", "c2"),
        tool_ready("sure?", "c2", "ask", dynamic=True),
        {"type": "tool-approval-request", "toolCallId": "c2", "approvalId": "a1", "reason": "r"},
        {"type": "tool-approval-response", "approvalId": "a1", "approved": False},
        {"type": "tool-output-denied", "toolCallId": "c2"},
        {"delta": "Hi "},
        {"type": "finish-step"},
        {"type": "start-step"},
        {"type": "text-start", "id": "t1"},
        text_delta("It is " + HIGH),
        {"type": "data-status", "id": "s", "data": {"phase": 2}},
        text_delta(LOW + " sunny", "t1"),
        {"type": "source-url", "sourceId": "s1", "url": "https://e.x", "title": "E"},
        {"type": "source-document", "sourceId": "s2", "mediaType": "text/plain", "title": "D"},
        {"type": "file", "url": "data:,x", "mediaType": "text/plain"},
        text_delta(""),
        {"type": "text-end", "id": "t1", "citations": []},
        {"type": "data-note", "data": [1, 2]},
        {"type": "data-note", "data": [3], "transient": True},
        tool_start("c3", "calc"),
        tool_delta('{"x": 1', "c3"),
        {
            "type": "tool-input-error",
            "toolCallId": "c3",
            "toolName": "calc",
            "input": 1,
            "errorText": "e",
        },
        tool_start("c4", "calc"),
        tool_delta('{"x": nu', "c4"),
        {"type": "tool-output-error", "toolCallId": "c4", "errorText": "boom"},
        tool_start("c5", "calc"),
        tool_delta('[1, {"a": "b\\u00', "c5"),
        {"type": "reasoning-start", "id": "r2"},
        text_delta("more", "r2", "reasoning"),
        {"type": "finish-step"},
        {"type": "text-start", "id": "t1"},
        text_delta("again"),
        {"type": "data-status", "id": "s", "data": {"phase": 3}},
        tool_delta("1]}]", "c5"),
    ]


def test_catch_up_rebuilds_the_parts_so_far() -> None:
    message = built(mixed_reply())
    assert built(message.catch_up()).parts() == message.parts()
    assert message.catch_up()[:8] == [
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "r1", "providerMetadata": {"p": {"sig": "x"}}},
        {"type": "reasoning-delta", "id": "r1", "delta": "Let me think."},
        {"type": "reasoning-end", "id": "r1"},
        {
            "type": "tool-input-start",
            "toolCallId": "c1",
            "toolName": "weather",
            "title": "Weather",
        },
        {
            "type": "tool-input-delta",
            "toolCallId": "c1",
            "inputTextDelta": '{"city":"Paris", "n": [1, true]}',
        },
        tool_ready({"city": "Paris", "n": [1, True]}, "c1"),
        {"type": "tool-output-available", "toolCallId": "c1", "output": {"t": 20}},
    ]


def test_catch_up_is_one_start_one_delta_and_the_end_per_part() -> None:
    message = built([{"delta": "a"}, {"delta": "b"}, {"delta": ""}, tool_start(), tool_delta("[")])
    message.apply(tool_delta("1]"))
    assert message.catch_up() == [
        {"type": "text-start", "id": "text"},
        {"type": "text-delta", "id": "text", "delta": "ab"},
        tool_start(),
        tool_delta("[1]"),
    ]
    empty = built([{"delta": ""}])
    assert empty.catch_up() == [{"type": "text-start", "id": "text"}]
    empty.finalize()
    assert empty.catch_up() == [
        {"type": "text-start", "id": "text"},
        {"type": "text-end", "id": "text"},
    ]


def test_catch_up_of_a_finalized_message_rebuilds_it() -> None:
    message = built(every_kind_streaming())
    message.finalize()
    assert built(message.catch_up()).parts() == FINALIZED


def test_catch_up_at_every_chunk_boundary_then_the_rest_gives_the_whole() -> None:
    """The relay hands the producer's events on as they came; a catch-up taken while half
    a surrogate pair is held carries that half at the end of its part's delta, so the next
    live delta completes the pair, whatever the cut."""
    events = mixed_reply()
    high = events.index(text_delta("It is " + HIGH))
    low = events.index(text_delta(LOW + " sunny"))
    whole = built(events)
    for cut in range(len(events) + 1):
        prefix = built(events[:cut])
        joiner = built(prefix.catch_up())
        assert joiner.parts() == prefix.parts(), cut
        if high < cut <= low:
            assert HIGH in json.dumps(prefix.catch_up(), ensure_ascii=False), cut
        play(joiner, events[cut:])
        assert joiner.parts() == whole.parts(), cut
        assert joiner.text() == whole.text(), cut
        assert joiner.chars() == whole.chars(), cut


def test_catch_up_at_every_boundary_after_finalize_too() -> None:
    events = mixed_reply()
    whole = built(events)
    whole.finalize()
    for cut in range(len(events) + 1):
        prefix = built(events[:cut])
        joiner = built(prefix.catch_up())
        play(joiner, events[cut:])
        joiner.finalize()
        assert joiner.parts() == whole.parts(), cut


def test_a_catch_up_never_holds_a_part_twice() -> None:
    events = mixed_reply()
    for cut in range(len(events) + 1):
        parts = built(events[:cut]).parts()
        chunks = built(events[:cut]).catch_up()
        types = [chunk["type"] for chunk in chunks]
        opened = sum(types.count(t) for t in ("text-start", "reasoning-start", "start-step"))
        opened += types.count("tool-input-start")
        assert opened == sum(
            1
            for part in parts
            if part["type"] in ("text", "reasoning", "step-start", "dynamic-tool")
            or part["type"].startswith("tool-")
        ), cut
        deltas = sum(types.count(t) for t in ("text-delta", "reasoning-delta", "tool-input-delta"))
        assert deltas <= opened, cut
        assert [t for t in types if t.startswith(("data-", "source-", "file"))] == [
            part["type"] for part in parts if part["type"].startswith(("data-", "source-", "file"))
        ], cut


# ------------------------------------------------------------------ interleavings

_PIECES = st.text(alphabet=st.sampled_from('ab é😀{}[]",:1'), max_size=4)


@st.composite
def interleavings(draw: st.DrawFn) -> list[Chunk]:
    """Several parts streaming at once, their chunks interleaved at random."""
    streams: list[list[Chunk]] = []
    for n in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["text", "reasoning"]))
        deltas = draw(st.lists(_PIECES, max_size=5))
        stream = [{"type": f"{kind}-start", "id": f"p{n}"}]
        stream += [text_delta(delta, f"p{n}", kind) for delta in deltas]
        if draw(st.booleans()):
            stream.append({"type": f"{kind}-end", "id": f"p{n}"})
        streams.append(stream)
    for n in range(draw(st.integers(0, 2))):
        tool = [tool_start(f"c{n}")]
        tool += [tool_delta(delta, f"c{n}") for delta in draw(st.lists(_PIECES, max_size=4))]
        if draw(st.booleans()):
            tool.append(tool_ready({"n": n}, f"c{n}"))
            if draw(st.booleans()):
                tool.append({"type": "tool-output-available", "toolCallId": f"c{n}", "output": n})
        streams.append(tool)
    implicit = [{"delta": delta} for delta in draw(st.lists(_PIECES, max_size=4))]
    streams.append(implicit)
    streams.append(
        [
            {"type": "data-d", "id": "d", "data": value}
            for value in draw(st.lists(st.integers(), max_size=3))
        ]
    )
    merged: list[Chunk] = []
    while any(streams):
        stream = draw(st.sampled_from([s for s in streams if s]))
        merged.append(stream.pop(0))
    return merged


def expected_texts(events: list[Chunk]) -> tuple[list[str], list[str]]:
    """The texts of the text parts and of the reasoning parts, in order, each the
    concatenation of its deltas (no split pairs among these deltas)."""
    texts: dict[tuple[str, str], list[str]] = {}
    for event in events:
        kind = event.get("type", "text-delta")
        if kind in ("text-start", "reasoning-start"):
            texts[(kind[:-6], event["id"])] = []
        elif kind in ("text-delta", "reasoning-delta"):
            key = (kind[:-6], event.get("id", "text"))
            texts.setdefault(key, []).append(event["delta"])
    return (
        ["".join(deltas) for (kind, _), deltas in texts.items() if kind == "text"],
        ["".join(deltas) for (kind, _), deltas in texts.items() if kind == "reasoning"],
    )


@settings(max_examples=150, deadline=None)
@given(interleavings(), st.data())
def test_interleaved_parts_assemble_and_catch_up_anywhere(
    events: list[Chunk], data: st.DataObject
) -> None:
    whole = built(events)
    parts = whole.parts()
    texts, reasonings = expected_texts(events)
    assert [part["text"] for part in parts if part["type"] == "text"] == texts
    assert [part["text"] for part in parts if part["type"] == "reasoning"] == reasonings
    assert whole.text() == "".join(texts)
    cut = data.draw(st.integers(0, len(events)))
    joiner = built(built(events[:cut]).catch_up())
    play(joiner, events[cut:])
    assert joiner.parts() == parts
    assert joiner.chars() == whole.chars()


def test_finalizing_sends_a_reader_exactly_what_completing_the_message_made() -> None:
    """For a reply with no finish-step and no half pair held at its end, a reader holding
    the chunks so far, then given ``finalizing()``, holds exactly the completed parts."""
    events = [e for e in mixed_reply() if e.get("type") not in ("finish-step", "start-step")]
    events = [e for e in events if HIGH not in str(e.get("delta", ""))]
    events = [e for e in events if LOW not in str(e.get("delta", ""))]
    for cut in range(len(events) + 1):
        message = built(events[:cut])
        reader = built(message.catch_up())
        closing = message.finalizing()
        play(reader, closing)
        assert reader.parts() == message.parts(), cut
        kinds = {chunk["type"] for chunk in closing}
        assert kinds <= {"text-end", "reasoning-end", "tool-input-available", "tool-output-error"}


def test_step_ends_closes_the_open_text_and_reasoning_parts_before_a_finish_step() -> None:
    message = built([{"type": "reasoning-start", "id": "r"}, {"delta": "so"}])
    assert message.step_ends() == [
        {"type": "reasoning-end", "id": "r"},
        {"type": "text-end", "id": "text"},
    ]
    assert [part["state"] for part in message.parts()] == ["done", "done"]
    assert message.step_ends() == []
