"""Tests for token_relay.client.ui_messages: a chat's UIMessages to Chat Completions
messages, exactly."""

from __future__ import annotations

from typing import Any

import pytest
from token_relay.client import openai_messages
from token_relay.core.errors import UsageError

from ..docs.blocks import docs_block


def test_the_documented_example_holds() -> None:
    code = docs_block("library-openai-messages")
    assert "assert" in code
    exec(compile(code, "library-openai-messages", "exec"), {})


def test_text_parts_are_joined_in_order_and_other_parts_left_out() -> None:
    chat: list[Any] = [
        {"id": "s", "role": "system", "parts": [{"type": "text", "text": "Be brief."}]},
        {
            "id": "u1",
            "role": "user",
            "parts": [
                {"type": "text", "text": "Weather "},
                {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,"},
                {"type": "text", "text": "in Paris?"},
            ],
        },
        {
            "id": "a1",
            "role": "assistant",
            "metadata": {"finishReason": "stop"},
            "parts": [
                {"type": "step-start"},
                {"type": "reasoning", "text": "A tool.", "state": "done"},
                {"type": "tool-weather", "toolCallId": "c", "state": "output-available",
                 "input": {"city": "Paris"}, "output": {"celsius": 21}},
                {"type": "text", "text": "21 °C.", "state": "done"},
            ],
        },
    ]  # fmt: skip
    assert openai_messages(chat) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "21 °C."},
    ]


def test_a_message_with_no_text_is_dropped() -> None:
    chat: list[Any] = [
        {"role": "user", "parts": [{"type": "text", "text": "Go"}]},
        {"role": "assistant", "parts": [{"type": "tool-weather", "toolCallId": "c"}]},
        {"role": "assistant", "parts": [{"type": "text", "text": ""}]},
        {"role": "user", "parts": []},
    ]
    assert openai_messages(chat) == [{"role": "user", "content": "Go"}]
    assert openai_messages([]) == []


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ("hi", "messages[1] is not a UIMessage object"),
        ({"role": "tool", "parts": []}, "messages[1].role is not one of"),
        ({"role": ["user"], "parts": []}, "messages[1].role is not one of"),
        ({"parts": []}, "messages[1].role is not one of"),
        ({"role": "user"}, "messages[1].parts is not a list of objects"),
        ({"role": "user", "parts": ["hi"]}, "messages[1].parts is not a list of objects"),
        (
            {"role": "user", "parts": [{"type": "text", "text": 7}]},
            "messages[1] has a text part whose text is not a string",
        ),
    ],
)
def test_what_is_not_a_ui_message_is_refused_by_its_index(message: Any, error: str) -> None:
    good = {"role": "user", "parts": [{"type": "text", "text": "ok"}]}
    with pytest.raises(UsageError, match=error.replace("[", r"\[").replace("]", r"\]")):
        openai_messages([good, message])
