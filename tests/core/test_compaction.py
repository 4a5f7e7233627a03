"""``chunks_of``: the compacted chunks that rebuild a list of assembled parts, checked by the
core itself, synchronously (tests/e2e/test_parts_shape.py holds them to the real ``ai``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from token_relay.core.parts import MessageParts, chunks_of

from .parts_cases import CASES, Step, random_reply


def _core(steps: Iterable[Step]) -> MessageParts:
    message = MessageParts()
    for step in steps:
        if step.keys() == {"delta"}:
            message.delta(step["delta"])
        else:
            message.apply(step)
    return message


def _rebuilt(parts: list[dict[str, Any]]) -> MessageParts:
    message = MessageParts()
    for chunk in chunks_of(parts):
        message.apply(chunk)
    return message


def test_every_case_is_rebuilt_from_its_parts_streaming_and_finalized() -> None:
    wrong = []
    for case in CASES:
        message = _core(case.steps)
        for when in ("streaming", "finalized"):
            if when == "finalized":
                message.finalize()
            rebuilt = _rebuilt(message.parts())
            if rebuilt.parts() != message.parts() or rebuilt.text() != message.text():
                wrong.append(f"{case.name} ({when}):\n  {message.parts()}\n  {rebuilt.parts()}")
    assert not wrong, "\n".join(wrong)


def test_random_replies_are_rebuilt_from_their_parts() -> None:
    for seed in range(200):
        message = _core(random_reply(seed))
        assert _rebuilt(message.parts()).parts() == message.parts(), seed
        message.finalize()
        assert _rebuilt(message.parts()).parts() == message.parts(), seed


def test_one_start_one_delta_and_the_end_per_part_text_parts_named_in_order() -> None:
    parts: list[dict[str, Any]] = [
        {"type": "step-start"},
        {"type": "reasoning", "id": "r1", "text": "Think.", "state": "done"},
        {"type": "tool-weather", "toolCallId": "c1", "state": "output-available",
         "input": {"city": "Paris"}, "output": {"celsius": 21}},
        {"type": "step-start"},
        {"type": "text", "text": "It is ", "state": "done"},
        {"type": "source-url", "sourceId": "s1", "url": "https://weather.example/paris"},
        {"type": "text", "text": "21 °C", "state": "streaming"},
        {"type": "data-chart", "id": "d1", "data": {"points": [1, 2]}},
    ]  # fmt: skip
    assert chunks_of(parts) == [
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "r1"},
        {"type": "reasoning-delta", "id": "r1", "delta": "Think."},
        {"type": "reasoning-end", "id": "r1"},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "weather"},
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "weather",
         "input": {"city": "Paris"}},
        {"type": "tool-output-available", "toolCallId": "c1", "output": {"celsius": 21}},
        {"type": "finish-step"},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-1"},
        {"type": "text-delta", "id": "text-1", "delta": "It is "},
        {"type": "text-end", "id": "text-1"},
        {"type": "source-url", "sourceId": "s1", "url": "https://weather.example/paris"},
        {"type": "text-start", "id": "text-2"},
        {"type": "text-delta", "id": "text-2", "delta": "21 °C"},
        {"type": "data-chart", "id": "d1", "data": {"points": [1, 2]}},
    ]  # fmt: skip
    assert _rebuilt(parts).parts() == parts
    assert chunks_of([]) == []


def test_a_streaming_tool_input_and_one_that_failed_keep_their_text() -> None:
    parts: list[dict[str, Any]] = [
        {"type": "tool-search", "toolCallId": "c1", "state": "input-streaming",
         "input": {"q": "pa"}, "rawInput": '{"q": "pa'},
        {"type": "tool-note", "toolCallId": "c2", "state": "output-error",
         "input": "half", "rawInput": "half", "errorText": "cut"},
        {"type": "dynamic-tool", "toolName": "t", "toolCallId": "c3",
         "state": "output-error", "input": [1], "errorText": "refused"},
    ]  # fmt: skip
    assert chunks_of(parts) == [
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "search"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"q": "pa'},
        {"type": "tool-input-start", "toolCallId": "c2", "toolName": "note",
         "inputEncoding": "text"},
        {"type": "tool-input-delta", "toolCallId": "c2", "inputTextDelta": "half"},
        {"type": "tool-output-error", "toolCallId": "c2", "errorText": "cut"},
        {"type": "tool-input-start", "toolCallId": "c3", "toolName": "t", "dynamic": True},
        {"type": "tool-input-available", "toolCallId": "c3", "toolName": "t", "dynamic": True,
         "input": [1]},
        {"type": "tool-output-error", "toolCallId": "c3", "errorText": "refused"},
    ]  # fmt: skip
    assert _rebuilt(parts).parts() == parts


def test_a_reasoning_id_reused_after_a_step_finished_its_part_gets_a_finish_step() -> None:
    message = _core(
        [
            {"type": "reasoning-start", "id": "r"},
            {"type": "reasoning-delta", "id": "r", "delta": "a"},
            {"type": "finish-step"},
            {"type": "reasoning-start", "id": "r"},
            {"type": "reasoning-delta", "id": "r", "delta": "b"},
        ]
    )
    chunks = chunks_of(message.parts())
    assert [chunk["type"] for chunk in chunks] == [
        "reasoning-start", "reasoning-delta", "finish-step", "reasoning-start", "reasoning-delta",
    ]  # fmt: skip
    assert _rebuilt(message.parts()).parts() == message.parts()
