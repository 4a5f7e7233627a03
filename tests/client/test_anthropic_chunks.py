"""Tests for token_relay.client.anthropic_chunks: Anthropic events to chunks, exactly."""

from __future__ import annotations

from typing import Any

import pytest
from token_relay.client.anthropic_chunks import MessagesChunks
from token_relay.client.forward import translator_for
from token_relay.client.openai_chunks import ChatCompletionsChunks, ResponsesChunks
from token_relay.core.errors import UsageError


@pytest.mark.parametrize(
    ("reason", "mapped"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool-calls"),
        ("refusal", "content-filter"),
        ("pause_turn", "other"),
    ],
)
def test_a_stop_reason_maps_to_ai_7s(reason: str, mapped: str) -> None:
    messages = MessagesChunks()
    messages.feed(
        {"type": "message_start", "message": {"model": "c", "usage": {"input_tokens": 2}}}
    )
    messages.feed(
        {"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 5}}
    )
    assert messages.meta == {
        "model": "c",
        "stop_reason": reason,
        "finishReason": mapped,
        "usage": {"input_tokens": 2, "output_tokens": 5},
    }


def test_the_events_messages_stream_adds_are_skipped() -> None:
    messages = MessagesChunks()
    messages.feed({"type": "content_block_start", "index": 0, "content_block": {"type": "text"}})
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "a"},
    }
    assert messages.feed(delta) == [{"type": "text-delta", "id": "text-0", "delta": "a"}]
    assert messages.feed({"type": "text", "text": "a", "snapshot": "a"}) == []
    # A block the stream left open ends with the stream.
    assert messages.end() == [{"type": "text-end", "id": "text-0"}]
    assert messages.meta == {"finishReason": "other"}


def test_a_tool_use_block_with_no_input_gives_an_empty_object() -> None:
    messages = MessagesChunks()
    block = {"type": "tool_use", "id": "t", "name": "now", "input": {}}
    assert messages.feed({"type": "content_block_start", "index": 3, "content_block": block}) == [
        {"type": "tool-input-start", "toolCallId": "t", "toolName": "now"}
    ]
    assert messages.feed({"type": "content_block_stop", "index": 3}) == [
        {"type": "tool-input-available", "toolCallId": "t", "toolName": "now", "input": {}}
    ]


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        ({"object": "chat.completion.chunk", "choices": []}, ChatCompletionsChunks),
        ({"type": "response.created"}, ResponsesChunks),
        ({"type": "error", "message": "x"}, ResponsesChunks),
        ({"type": "message_start"}, MessagesChunks),
        ({"type": "text"}, MessagesChunks),
    ],
)
def test_the_stream_kind_is_found_by_its_first_event(event: Any, kind: type) -> None:
    assert type(translator_for(event)) is kind


def test_an_unknown_event_names_itself() -> None:
    with pytest.raises(UsageError, match="not an OpenAI Chat Completions"):
        translator_for({"type": "delta"})
