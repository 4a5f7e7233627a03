"""Tests for the hot path of token_relay.core.parts: ``MessageParts.extend``, the short way of
a plain delta for an open part, does what the checked way does, or nothing at all."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from token_relay.core.errors import FrameRejected
from token_relay.core.parts import MessageParts, PartLimits
from token_relay.core.protocol import ProducerEvent
from token_relay.core.streams import Applied, MessageStreams

Chunk = dict[str, Any]

REPLY: list[Chunk] = [
    {"type": "reasoning-start", "id": "r"},
    {"type": "reasoning-delta", "id": "r", "delta": "think"},
    {"type": "reasoning-delta", "id": "r", "delta": ""},
    {"type": "reasoning-delta", "id": "r", "delta": "é"},  # not ASCII: the checked way
    {"type": "reasoning-end", "id": "r"},
    {"type": "tool-input-start", "toolCallId": "c", "toolName": "weather"},
    {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": ""},
    {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": '{"city":'},
    {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": '"Par'},
    {"type": "text-start", "id": "t"},
    {"type": "text-delta", "id": "t", "delta": "It is "},
    {"type": "text-delta", "id": "t", "delta": "\ud83d"},  # a high half, held back
    {"type": "text-delta", "id": "t", "delta": "x"},  # after a held half: the checked way
    {"type": "text-delta", "id": "t", "delta": "sunny", "providerMetadata": {"p": {"k": 1}}},
    {"type": "text-delta", "id": "t", "delta": "."},
]


def snapshot(message: MessageParts) -> tuple[Any, ...]:
    return message.parts(), message.catch_up(), message.text(), message.chars()


def play(chunks: list[Chunk]) -> tuple[list[int | None], list[tuple[Any, ...]]]:
    message = MessageParts()
    indexes, states = [], []
    for chunk in chunks:
        indexes.append(message.apply(chunk))
        states.append(snapshot(message))
    message.finalize()
    states.append(snapshot(message))
    return indexes, states


def test_the_hot_path_gives_what_the_checked_way_gives() -> None:
    hot = play(REPLY)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MessageParts, "extend", lambda self, chunk, budget: -1)
        checked = play(REPLY)
    assert hot == checked
    assert hot[0] == [0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2]
    assert hot[1][-1][0][1] == {
        "type": "tool-weather",
        "toolCallId": "c",
        "state": "output-error",
        "input": {"city": "Par"},
        "errorText": "the message ended before this tool call's input was valid JSON",
        "rawInput": '{"city":"Par',
    }


def test_extend_applies_a_plain_delta_and_returns_the_message_characters() -> None:
    message = MessageParts()
    message.apply({"type": "text-start", "id": "t"})
    message.apply({"type": "tool-input-start", "toolCallId": "c", "toolName": "w"})
    assert message.chars() == len("t") + len("c") + len("w")  # the ids and the tool's name
    assert message.extend({"type": "text-delta", "id": "t", "delta": "abc"}, 10) == 6
    assert (
        message.extend({"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": "[1"}, 10)
        == 8
    )
    assert message.extend({"type": "text-delta", "id": "t", "delta": ""}, 8) == 8
    assert message.text() == "abc"
    assert message.parts()[1]["input"] == [1]


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "text-delta", "id": "nope", "delta": "x"},  # an unknown part
        {"type": "text-delta", "id": "ended", "delta": "x"},  # an ended part
        {"type": "reasoning-delta", "id": "t", "delta": "x"},  # a text part's id
        {"type": "text-delta", "id": 5, "delta": "x"},  # an id that is no string
        {"type": "text-delta", "id": ["t"], "delta": "x"},  # nor hashable
        {"type": "tool-input-delta", "toolCallId": {"c": 1}, "inputTextDelta": "x"},
        {"type": "text-delta", "id": "t", "delta": 5},  # a delta that is no string
        {"type": "text-delta", "id": "t", "delta": "é"},  # not ASCII
        {"type": "text-delta", "id": "t", "delta": "x", "providerMetadata": {"p": {}}},
        {"type": "text-delta", "id": "t", "delta": "x" * 9},  # past the part's bound
        {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": "x" * 5},
        {"type": "text-delta", "id": "t", "delta": "x" * 6},  # past the budget
        # A 'delta' beside the input: the streams size it by that, so the checked way.
        {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": "x", "delta": ""},
        {"type": "text-start", "id": "u"},  # no delta
        {"type": "data-x", "data": 1},
        {"id": "t", "delta": "x"},  # no type
    ],
)
def test_extend_does_nothing_to_what_it_does_not_take(chunk: Chunk) -> None:
    message = MessageParts(PartLimits(max_part_chars=8, max_tool_input_chars=4))
    message.apply({"type": "text-start", "id": "ended"})
    message.apply({"type": "text-end", "id": "ended"})
    message.apply({"type": "text-start", "id": "t"})
    message.apply({"type": "text-delta", "id": "t", "delta": "ab"})
    message.apply({"type": "tool-input-start", "toolCallId": "c", "toolName": "w"})
    before = snapshot(message)
    assert message.extend(chunk, 7) == -1
    assert snapshot(message) == before


def test_extend_takes_only_a_dict_and_nothing_once_finalized() -> None:
    message = MessageParts()
    message.apply({"type": "text-start", "id": "t"})
    delta = {"type": "text-delta", "id": "t", "delta": "x"}
    assert message.extend(MappingProxyType(delta), 10) == -1
    assert message.apply(MappingProxyType(delta)) == 0  # the checked way takes it
    message.finalize()
    assert message.extend(delta, 10) == -1
    assert message.text() == "x"


def test_a_hot_delta_in_the_streams_keeps_its_seq_size_and_clock() -> None:
    streams = MessageStreams("c", part_limits=PartLimits())
    streams.receive(ProducerEvent(id="m", seq=1, chunk={"type": "text-start", "id": "t"}), 1.0)
    delta = ProducerEvent(id="m", seq=2, chunk={"type": "text-delta", "id": "t", "delta": "abc"})
    assert streams.receive(delta, 2.0) == Applied("c", "m", None, chunks=(delta.chunk,))
    assert streams.held_chars() == len("t") + 3  # its chunk id and its text
    assert streams.receive(delta, 3.0) == Applied("c", "m", None, duplicate=True)
    with pytest.raises(FrameRejected) as gap:
        streams.receive(
            ProducerEvent(id="m", seq=4, chunk={"type": "text-delta", "id": "t", "delta": "d"})
        )
    assert gap.value.expected == 3
    assert streams.held_chars() == len("t") + 3
    done = streams.receive(ProducerEvent(id="m", seq=3, final=True), 4.0)
    assert done.text == "abc"
    assert done.parts == [{"type": "text", "text": "abc", "state": "done"}]
