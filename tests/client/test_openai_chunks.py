"""Tests for token_relay.client.openai_chunks: OpenAI stream events to chunks, exactly."""

from __future__ import annotations

from typing import Any

import pytest
from token_relay.client.openai_chunks import ChatCompletionsChunks, ResponsesChunks, to_json


def _chat(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return {"object": "chat.completion.chunk", "model": "m", "choices": [choice]}


@pytest.mark.parametrize(
    ("reason", "mapped"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("content_filter", "content-filter"),
        ("tool_calls", "tool-calls"),
        ("function_call", "tool-calls"),
        ("something_new", "other"),
    ],
)
def test_a_chat_finish_reason_maps_to_ai_7s(reason: str, mapped: str) -> None:
    chat = ChatCompletionsChunks()
    assert chat.feed(_chat({"content": "Hi"})) == [
        {"type": "text-start", "id": "text-0"},
        {"type": "text-delta", "id": "text-0", "delta": "Hi"},
    ]
    assert chat.feed(_chat({}, reason)) == [{"type": "text-end", "id": "text-0"}]
    assert chat.meta == {"model": "m", "finish_reason": reason, "finishReason": mapped}
    assert chat.end() == []


def test_chat_reasoning_and_parallel_tool_calls_each_stream_as_a_part() -> None:
    chat = ChatCompletionsChunks()
    calls = [
        {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}},
        {"index": 1, "id": "b", "function": {"name": "g", "arguments": "[1"}},
    ]
    assert chat.feed(_chat({"reasoning_content": "hm"})) == [
        {"type": "reasoning-start", "id": "reasoning-0"},
        {"type": "reasoning-delta", "id": "reasoning-0", "delta": "hm"},
    ]
    assert chat.feed(_chat({"tool_calls": calls})) == [
        {"type": "tool-input-start", "toolCallId": "a", "toolName": "f"},
        {"type": "tool-input-delta", "toolCallId": "a", "inputTextDelta": "{"},
        {"type": "tool-input-start", "toolCallId": "b", "toolName": "g"},
        {"type": "tool-input-delta", "toolCallId": "b", "inputTextDelta": "[1"},
    ]
    more = [
        {"index": 0, "function": {"arguments": "}"}},
        {"index": 1, "function": {"arguments": "]"}},
    ]
    chat.feed(_chat({"tool_calls": more}))
    assert chat.feed(_chat({}, "tool_calls")) == [
        {"type": "reasoning-end", "id": "reasoning-0"},
        {"type": "tool-input-available", "toolCallId": "a", "toolName": "f", "input": {}},
        {"type": "tool-input-available", "toolCallId": "b", "toolName": "g", "input": [1]},
    ]


def test_a_tool_call_whose_arguments_are_not_json_ends_in_an_input_error() -> None:
    chat = ChatCompletionsChunks()
    call = {"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x":'}}
    chat.feed(_chat({"tool_calls": [call]}))
    assert chat.end() == [
        {
            "type": "tool-input-error",
            "toolCallId": "a",
            "toolName": "f",
            "input": '{"x":',
            "errorText": "the model's tool arguments are not valid JSON",
        }
    ]
    assert chat.meta["finishReason"] == "other"  # the stream ended without a reason


def test_an_empty_delta_opens_no_part() -> None:
    chat = ChatCompletionsChunks()
    assert chat.feed(_chat({"role": "assistant", "content": ""})) == []
    assert chat.end() == []


def _response(status: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "status": status, "usage": {"total_tokens": 3}, **extra}


@pytest.mark.parametrize(
    ("event", "reason", "mapped"),
    [
        ({"type": "response.completed", "response": _response("completed")}, "completed", "stop"),
        (
            {
                "type": "response.incomplete",
                "response": _response(
                    "incomplete", incomplete_details={"reason": "max_output_tokens"}
                ),
            },
            "max_output_tokens",
            "length",
        ),
        (
            {
                "type": "response.incomplete",
                "response": _response(
                    "incomplete", incomplete_details={"reason": "content_filter"}
                ),
            },
            "content_filter",
            "content-filter",
        ),
        (
            {
                "type": "response.failed",
                "response": _response("failed", error={"message": "boom"}),
            },
            "failed",
            "error",
        ),
    ],
)
def test_a_responses_status_maps_to_ai_7s_finish_reason(
    event: dict[str, Any], reason: str, mapped: str
) -> None:
    responses = ResponsesChunks()
    responses.feed({"type": "response.output_text.delta", "item_id": "i", "delta": "x"})
    assert responses.feed(event) == [{"type": "text-end", "id": "i"}]
    assert responses.meta["finish_reason"] == reason
    assert responses.meta["finishReason"] == mapped
    assert responses.meta["usage"] == {"total_tokens": 3}
    assert ("errorText" in responses.meta) == (mapped == "error")


def test_to_json_drops_unset_fields_of_nested_values() -> None:
    assert to_json({"a": None, "b": [1, {"c": None, "d": "x"}]}) == {"b": [1, {"d": "x"}]}
