"""Replies as the AI SDK's UI message chunks, for holding ``MessageParts`` to the real ``ai``
package (tests/e2e/test_parts_shape.py runs each one through both and compares the parts).

A case's steps are ``ai`` 7 ``UIMessageChunk``s that build parts, or :func:`delta` steps: a
top-level delta that names no part and extends the message's implicit text part. The package
sees a delta step as ``text-delta`` on the text part with id ``"text"``, opened by a
``text-start`` before the first one.

``finalize_as``, where given, are the chunks that complete the parts as ``finalize()`` does:
fed to the package after the steps, they give the parts that ``finalize()`` leaves. An
``errorText`` of :data:`ANY_ERROR_TEXT` stands for the core's own wording.

Text is written with escapes where the code points matter: ``"\\ud83d"`` is half of a
surrogate pair, sent alone in a delta as a producer cutting UTF-16 would.

The sources of cases: :data:`CASES`, fixed replies; :data:`TOOL_INPUTS`, tool inputs to cut
at every character; :func:`random_reply`, replies drawn from a seed; :data:`REFUSED`, chunks
both sides refuse; :data:`STRICTER`, chunks the package takes and the core refuses on purpose.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

Step = dict[str, Any]
"""A UIMessageChunk, or a top-level delta (:func:`delta`)."""

ANY_ERROR_TEXT = "*"
"""In ``finalize_as``: the ``errorText`` the core chooses, any non-empty string."""


def delta(text: str) -> Step:
    """A top-level delta: no part named, so it extends the implicit text part."""
    return {"delta": text}


@dataclass(frozen=True)
class PartsCase:
    """A reply's steps, and how ``finalize()`` completes it where that is checked."""

    name: str
    steps: list[Step]
    finalize_as: list[Step] | None = None


@dataclass(frozen=True)
class RefusedCase:
    """Steps the package accepts, then one chunk the core refuses with ``code``, changing
    nothing; in :data:`REFUSED` the package (at ``majors``) refuses it too, in
    :data:`STRICTER` it takes it."""

    name: str
    steps: list[Step]
    refused: Step
    code: str
    majors: tuple[str, ...] = field(default=("ai", "ai-v6"))


def _text(part_id: str, *pieces: str, end: bool = True) -> list[Step]:
    chunks: list[Step] = [{"type": "text-start", "id": part_id}]
    chunks += [{"type": "text-delta", "id": part_id, "delta": piece} for piece in pieces]
    if end:
        chunks.append({"type": "text-end", "id": part_id})
    return chunks


def _reasoning(part_id: str, *pieces: str, end: bool = True) -> list[Step]:
    chunks: list[Step] = [{"type": "reasoning-start", "id": part_id}]
    chunks += [{"type": "reasoning-delta", "id": part_id, "delta": piece} for piece in pieces]
    if end:
        chunks.append({"type": "reasoning-end", "id": part_id})
    return chunks


def _tool_input(call: str, name: str, *pieces: str, **start: Any) -> list[Step]:
    chunks: list[Step] = [
        {"type": "tool-input-start", "toolCallId": call, "toolName": name, **start}
    ]
    chunks += [
        {"type": "tool-input-delta", "toolCallId": call, "inputTextDelta": piece}
        for piece in pieces
    ]
    return chunks


def _available(call: str, name: str, value: Any, **more: Any) -> Step:
    return {
        "type": "tool-input-available",
        "toolCallId": call,
        "toolName": name,
        "input": value,
        **more,
    }


def _unparsed(call: str) -> Step:
    """What ``finalize()`` makes of a tool input that is not JSON: as if
    ``tool-output-error`` came, in the core's wording (the design's rule; ``ai`` then keeps
    the text so far in ``rawInput`` for a static tool)."""
    return {"type": "tool-output-error", "toolCallId": call, "errorText": ANY_ERROR_TEXT}


def _output(call: str, value: Any, **more: Any) -> Step:
    return {"type": "tool-output-available", "toolCallId": call, "output": value, **more}


def _pieces(text: str, size: int = 3) -> list[str]:
    return [text[start : start + size] for start in range(0, len(text), size)]


WEATHER_INPUT = ('{"ci', 'ty": "Pa', 'ris", "days"', ": [1, 2]}")
WEATHER = {"city": "Paris", "days": [1, 2]}
CITATION = {
    "source": {"type": "source", "sourceType": "url", "id": "s1", "url": "https://example.com"},
    "startIndex": 0,
    "endIndex": 5,
    "citedText": "Paris",
}
METADATA_A = {"openai": {"itemId": "item-1"}}
METADATA_B = {"openai": {"itemId": "item-2", "score": 0.5}}

CASES: list[PartsCase] = [
    # --- text
    PartsCase("plain text", _text("t1", "Hel", "lo, ", "world")),
    PartsCase(
        "text still streaming",
        _text("t1", "Hel", "lo", end=False),
        finalize_as=[{"type": "text-end", "id": "t1"}],
    ),
    PartsCase("text part with no delta", _text("t1")),
    PartsCase(
        "text part opened, nothing yet",
        _text("t1", end=False),
        finalize_as=[{"type": "text-end", "id": "t1"}],
    ),
    PartsCase("empty deltas count", _text("t1", "", "a", "", "b", "")),
    PartsCase("two text parts", _text("t1", "first") + _text("t2", "second")),
    PartsCase(
        "two text parts interleaved",
        [
            {"type": "text-start", "id": "t1"},
            {"type": "text-start", "id": "t2"},
            {"type": "text-delta", "id": "t1", "delta": "one "},
            {"type": "text-delta", "id": "t2", "delta": "two"},
            {"type": "text-end", "id": "t2"},
            {"type": "text-delta", "id": "t1", "delta": "more"},
        ],
        finalize_as=[{"type": "text-end", "id": "t1"}],
    ),
    # --- the implicit text part: top-level deltas
    PartsCase(
        "implicit text",
        [delta("Hel"), delta("lo"), delta(", world")],
        finalize_as=[{"type": "text-end", "id": "text"}],
    ),
    PartsCase(
        "implicit text opened by an empty delta",
        [delta(""), delta(""), delta("x")],
        finalize_as=[{"type": "text-end", "id": "text"}],
    ),
    PartsCase(
        "implicit text that is only an empty delta",
        [delta("")],
        finalize_as=[{"type": "text-end", "id": "text"}],
    ),
    PartsCase(
        "implicit text after a reasoning part, beside an explicit text part",
        [
            *_reasoning("r1", "think"),
            delta("a"),
            *_text("t2", "b", end=False),
            delta("c"),
            {"type": "text-end", "id": "t2"},
            delta("d"),
        ],
        finalize_as=[{"type": "text-end", "id": "text"}],
    ),
    PartsCase(
        'a producer\'s own text part "text", extended by top-level deltas',
        [
            {"type": "text-start", "id": "text"},
            delta("a"),
            {"type": "text-delta", "id": "text", "delta": "b"},
            delta("c"),
        ],
        finalize_as=[{"type": "text-end", "id": "text"}],
    ),
    PartsCase(
        "an id used again after its part ended opens a new part",
        [*_text("t1", "one"), *_text("t1", "two", end=False)],
        finalize_as=[{"type": "text-end", "id": "t1"}],
    ),
    # --- reasoning
    PartsCase("reasoning then text", _reasoning("r1", "Let me ", "think.") + _text("t1", "Yes.")),
    PartsCase(
        "reasoning still streaming",
        _reasoning("r1", "hmm", end=False),
        finalize_as=[{"type": "reasoning-end", "id": "r1"}],
    ),
    PartsCase(
        "reasoning with an empty delta and no end, then text",
        [*_reasoning("r1", "", "a", end=False), *_text("t1", "b", end=False)],
        finalize_as=[{"type": "reasoning-end", "id": "r1"}, {"type": "text-end", "id": "t1"}],
    ),
    # --- tools
    PartsCase(
        "a tool call: streamed input, input-available, output-available",
        [
            *_tool_input("call-1", "weather", *WEATHER_INPUT),
            _available("call-1", "weather", WEATHER),
            _output("call-1", {"temperature": 21, "unit": "C"}),
        ],
    ),
    PartsCase(
        "a tool call awaiting its output",
        [
            *_tool_input("call-1", "weather", *WEATHER_INPUT),
            _available("call-1", "weather", WEATHER),
        ],
    ),
    PartsCase("tool input opened, nothing yet", _tool_input("call-1", "weather")),
    PartsCase(
        "tool input streaming, cut inside a string (the package repairs the partial JSON)",
        _tool_input("call-1", "weather", '{"city": "Par'),
        # Finalize parses the input strictly: a cut JSON is not JSON.
        finalize_as=[_unparsed("call-1")],
    ),
    PartsCase(
        "tool input streaming, whole JSON, no input-available yet",
        _tool_input("call-1", "weather", *WEATHER_INPUT),
        finalize_as=[_available("call-1", "weather", WEATHER)],
    ),
    PartsCase(
        "tool input streaming that never parses",
        _tool_input("call-1", "weather", '{"city": ', "}"),
        finalize_as=[_unparsed("call-1")],
    ),
    PartsCase(
        "input-available with no input streamed",
        [_available("call-1", "search", {"q": "relay"}), _output("call-1", ["a", "b"])],
    ),
    PartsCase(
        "a tool error: input that did not parse",
        [
            *_tool_input("call-1", "weather", '{"city"'),
            {
                "type": "tool-input-error",
                "toolCallId": "call-1",
                "toolName": "weather",
                "input": '{"city"',
                "errorText": "Invalid JSON input",
            },
        ],
    ),
    PartsCase(
        "tool-output-error",
        [
            *_tool_input("call-1", "weather", '{"city": "Oslo"}'),
            _available("call-1", "weather", {"city": "Oslo"}),
            {"type": "tool-output-error", "toolCallId": "call-1", "errorText": "timed out"},
        ],
    ),
    PartsCase(
        "preliminary outputs, then the final one",
        [
            _available("call-1", "research", {"topic": "relays"}),
            _output("call-1", {"status": "reading"}, preliminary=True),
            _output("call-1", {"status": "writing"}, preliminary=True),
            _output("call-1", {"status": "done", "pages": 3}),
        ],
    ),
    PartsCase(
        "tool-output-denied",
        [
            _available("call-1", "delete", {"path": "/tmp/x"}),
            {"type": "tool-output-denied", "toolCallId": "call-1"},
        ],
    ),
    PartsCase(
        "a dynamic tool with a title",
        [
            *_tool_input("call-9", "mcp_lookup", '{"id"', ": 7}", dynamic=True, title="Lookup"),
            _available("call-9", "mcp_lookup", {"id": 7}, dynamic=True),
            _output("call-9", {"name": "seven"}, dynamic=True),
        ],
    ),
    PartsCase(
        "a dynamic tool still streaming its input",
        _tool_input("call-9", "mcp_lookup", '{"id": 7', "}", dynamic=True),
        finalize_as=[_available("call-9", "mcp_lookup", {"id": 7}, dynamic=True)],
    ),
    PartsCase(
        "a dynamic tool's output error",
        [
            _available("call-9", "mcp_lookup", {"id": 7}, dynamic=True),
            {"type": "tool-output-error", "toolCallId": "call-9", "errorText": "no such id"},
        ],
    ),
    PartsCase(
        "two tool calls in one step, outputs in the other order",
        [
            *_tool_input("call-1", "weather", '{"city": "Rome"}'),
            *_tool_input("call-2", "time", '{"tz": "CET"}'),
            _available("call-1", "weather", {"city": "Rome"}),
            _available("call-2", "time", {"tz": "CET"}),
            _output("call-2", "12:00"),
            _output("call-1", {"temperature": 30}),
        ],
    ),
    PartsCase(
        "a provider-executed tool with provider metadata on call and result",
        [
            *_tool_input(
                "call-1",
                "web_search",
                '{"q": "x"}',
                providerExecuted=True,
                providerMetadata=METADATA_A,
            ),
            _available(
                "call-1",
                "web_search",
                {"q": "x"},
                providerExecuted=True,
                providerMetadata=METADATA_A,
            ),
            _output("call-1", {"hits": 2}, providerExecuted=True, providerMetadata=METADATA_B),
        ],
    ),
    # --- sources, files, data
    PartsCase(
        "sources and a file",
        [
            {"type": "source-url", "sourceId": "s1", "url": "https://example.com/a", "title": "A"},
            {"type": "source-url", "sourceId": "s2", "url": "https://example.com/b"},
            {
                "type": "source-document",
                "sourceId": "s3",
                "mediaType": "application/pdf",
                "title": "Report",
                "filename": "report.pdf",
            },
            {
                "type": "source-document",
                "sourceId": "s4",
                "mediaType": "text/plain",
                "title": "Notes",
            },
            {"type": "file", "url": "https://example.com/chart.png", "mediaType": "image/png"},
            {
                "type": "file",
                "url": "data:text/plain;base64,aGk=",
                "mediaType": "text/plain",
                "providerMetadata": METADATA_A,
            },
        ],
    ),
    PartsCase(
        "sources with provider metadata",
        [
            {
                "type": "source-url",
                "sourceId": "s1",
                "url": "https://example.com",
                "providerMetadata": METADATA_A,
            },
            {
                "type": "source-document",
                "sourceId": "s2",
                "mediaType": "text/plain",
                "title": "T",
                "providerMetadata": METADATA_B,
            },
        ],
    ),
    PartsCase(
        "a data part with an id, updated in place",
        [
            {"type": "data-weather", "id": "w1", "data": {"status": "loading"}},
            *_text("t1", "Checking"),
            {"type": "data-weather", "id": "w1", "data": {"status": "done", "temp": 21}},
        ],
    ),
    PartsCase(
        "data parts without an id are each a part",
        [
            {"type": "data-note", "data": "one"},
            {"type": "data-note", "data": "one"},
            {"type": "data-note", "data": {"nested": [1, None, True]}},
        ],
    ),
    PartsCase(
        "one id under two data types is two parts",
        [
            {"type": "data-a", "id": "x", "data": 1},
            {"type": "data-b", "id": "x", "data": 2},
            {"type": "data-a", "id": "x", "data": 3},
        ],
    ),
    PartsCase(
        "transient data is not a part",
        [
            {"type": "data-progress", "data": {"percent": 10}, "transient": True},
            delta("a"),
            {"type": "data-progress", "id": "p", "data": {"percent": 50}, "transient": True},
            delta("b"),
        ],
    ),
    PartsCase(
        "data marked not transient keeps the flag",
        [{"type": "data-status", "id": "s", "data": "ok", "transient": False}],
    ),
    PartsCase(
        "data values of every JSON kind",
        [
            {"type": "data-n", "data": 0},
            {"type": "data-f", "data": 1.5},
            {"type": "data-s", "data": ""},
            {"type": "data-b", "data": False},
            {"type": "data-z", "data": None},
            {"type": "data-l", "data": []},
            {"type": "data-o", "data": {}},
        ],
    ),
    # --- steps
    PartsCase(
        "two steps with parts in each",
        [
            {"type": "start-step"},
            *_reasoning("r1", "I should look it up."),
            *_tool_input("call-1", "weather", '{"city": "Paris"}'),
            _available("call-1", "weather", {"city": "Paris"}),
            _output("call-1", {"temperature": 21}),
            {"type": "finish-step"},
            {"type": "start-step"},
            *_text("t1", "It is ", "21 °C."),
            {"type": "source-url", "sourceId": "s1", "url": "https://weather.example"},
            {"type": "finish-step"},
        ],
    ),
    PartsCase(
        "a step still streaming",
        [
            {"type": "start-step"},
            *_text("t1", "done"),
            {"type": "finish-step"},
            {"type": "start-step"},
            *_reasoning("r2", "still", end=False),
            *_tool_input("call-2", "calc", '{"a": 1', dynamic=True),
        ],
        finalize_as=[
            {"type": "reasoning-end", "id": "r2"},
            _unparsed("call-2"),
        ],
    ),
    PartsCase(
        "a step with nothing in it",
        [{"type": "start-step"}, {"type": "finish-step"}, {"type": "start-step"}, delta("x")],
        finalize_as=[{"type": "text-end", "id": "text"}],
    ),
    PartsCase(
        "a structured reply in 3-character deltas",
        [
            *_reasoning("r1", *_pieces("The user wants the weather in Paris; call the tool.")),
            *_tool_input("call-1", "weather", *_pieces('{"city": "Paris", "unit": "C"}')),
            _available("call-1", "weather", {"city": "Paris", "unit": "C"}),
            _output("call-1", {"temperature": 21, "sky": "clear"}),
            *(delta(piece) for piece in _pieces("It is 21 °C and clear in Paris. 🌤️")),
        ],
        finalize_as=[{"type": "text-end", "id": "text"}],
    ),
    # --- edges the package accepts
    PartsCase(
        "a tool input streamed as plain text (inputEncoding text)",
        _tool_input("call-1", "shell", "ls -", "la", inputEncoding="text"),
    ),
    PartsCase(
        "tool metadata and a title given only with the input",
        [
            *_tool_input("call-1", "weather", "{}", toolMetadata={"version": 2}),
            _available("call-1", "weather", {}, title="Weather"),
            _output("call-1", 1, toolMetadata={"version": 3}),
        ],
    ),
    PartsCase(
        "a tool approval requested and granted",
        [
            _available("call-1", "delete", {"path": "x"}),
            {"type": "tool-approval-request", "approvalId": "a1", "toolCallId": "call-1"},
            {"type": "tool-approval-response", "approvalId": "a1", "approved": True},
            _output("call-1", "deleted"),
        ],
    ),
    PartsCase(
        "a tool approval requested, then denied",
        [
            _available("call-1", "delete", {"path": "x"}),
            {
                "type": "tool-approval-request",
                "approvalId": "a1",
                "toolCallId": "call-1",
                "reason": "destructive",
            },
            {
                "type": "tool-approval-response",
                "approvalId": "a1",
                "approved": False,
                "reason": "no",
            },
            {"type": "tool-output-denied", "toolCallId": "call-1"},
        ],
    ),
    PartsCase(
        "text-end with citations",
        [
            *_text("t1", "Paris is in France.", end=False),
            {"type": "text-end", "id": "t1", "citations": [CITATION]},
        ],
    ),
    PartsCase(
        "citations with keys ai does not know (dropped), a document, whole-number floats",
        [
            *_text("t1", "See the report.", end=False),
            {
                "type": "text-end",
                "id": "t1",
                "citations": [
                    {**CITATION, "extra": 1, "source": {**CITATION["source"], "rank": 2}},
                    {
                        "source": {
                            "type": "source",
                            "sourceType": "document",
                            "id": "d1",
                            "mediaType": "application/pdf",
                            "title": "Report",
                            "filename": "report.pdf",
                            "providerMetadata": METADATA_A,
                        },
                        "startIndex": 4.0,
                    },
                ],
            },
        ],
    ),
    PartsCase(
        "a tool's output in the step after its call",
        [
            {"type": "start-step"},
            _available("call-1", "weather", {"city": "Oslo"}),
            {"type": "finish-step"},
            {"type": "start-step"},
            _output("call-1", {"temperature": 3}),
            *_text("t1", "Cold."),
        ],
    ),
    PartsCase(
        "tool-input-error with no start",
        [
            {
                "type": "tool-input-error",
                "toolCallId": "call-1",
                "toolName": "weather",
                "input": {"city": 5},
                "errorText": "city must be a string",
            }
        ],
    ),
    PartsCase(
        "an output marked not preliminary, and null values",
        [
            _available("call-1", "noop", None),
            _output("call-1", None, preliminary=False),
            _available("call-2", "noop", {}, providerExecuted=False),
        ],
    ),
    PartsCase(
        "a transient update of a stored data part leaves it as it was",
        [
            {"type": "data-status", "id": "s", "data": "first"},
            {"type": "data-status", "id": "s", "data": "second", "transient": True},
        ],
    ),
    PartsCase(
        "fields a chunk type does not have are dropped, as the package drops them",
        [
            {
                "type": "file",
                "url": "https://example.com/f.txt",
                "mediaType": "text/plain",
                "filename": "f.txt",
            },
            {"type": "source-url", "sourceId": "s1", "url": "https://example.com", "rank": 1},
            {"type": "text-start", "id": "t1", "role": "assistant"},
            {"type": "text-delta", "id": "t1", "delta": "a", "seq": 1},
        ],
    ),
    PartsCase(
        "a text part and a reasoning part under one id",
        [
            {"type": "text-start", "id": "x"},
            {"type": "reasoning-start", "id": "x"},
            {"type": "reasoning-delta", "id": "x", "delta": "think"},
            {"type": "text-delta", "id": "x", "delta": "say"},
            {"type": "reasoning-end", "id": "x"},
        ],
    ),
    PartsCase(
        "a data part updated in place from a later step",
        [
            {"type": "start-step"},
            {"type": "data-plan", "id": "p", "data": ["a"]},
            {"type": "finish-step"},
            {"type": "start-step"},
            {"type": "data-plan", "id": "p", "data": ["a", "b"]},
        ],
    ),
    PartsCase(
        "an output error while the input still streams",
        [
            *_tool_input("call-1", "search", '{"q": "re'),
            {"type": "tool-output-error", "toolCallId": "call-1", "errorText": "cancelled"},
            *_tool_input("call-2", "search", '{"q"', dynamic=True),
            {"type": "tool-output-error", "toolCallId": "call-2", "errorText": "cancelled"},
        ],
    ),
    PartsCase(
        "a step finished with its text and reasoning never ended",
        [
            {"type": "start-step"},
            *_reasoning("r1", "hm", end=False),
            *_text("t1", "part", end=False),
            {"type": "finish-step"},
            {"type": "start-step"},
            *_text("t2", "next"),
        ],
    ),
    PartsCase(
        "provider metadata on tool errors lands on the result",
        [
            {
                "type": "tool-input-error",
                "toolCallId": "call-1",
                "toolName": "w",
                "input": "x",
                "errorText": "bad",
                "providerMetadata": METADATA_A,
            },
            _available("call-2", "w", {}, providerMetadata=METADATA_A),
            {
                "type": "tool-output-error",
                "toolCallId": "call-2",
                "errorText": "failed",
                "providerMetadata": METADATA_B,
            },
        ],
    ),
    PartsCase(
        "a preliminary output, then an output error; a title replaced",
        [
            *_tool_input("call-1", "research", "{}", title="Research"),
            _available("call-1", "research", {}, title="Deep research"),
            _output("call-1", {"status": "reading"}, preliminary=True),
            {"type": "tool-output-error", "toolCallId": "call-1", "errorText": "gave up"},
        ],
    ),
    PartsCase(
        "an approval on a dynamic tool, with every approval field",
        [
            _available("call-1", "mcp_rm", {"path": "x"}, dynamic=True),
            {
                "type": "tool-approval-request",
                "approvalId": "a1",
                "toolCallId": "call-1",
                "approvalDescriptor": {"risk": "high"},
                "inputSchemaInput": {"path": "x"},
                "reason": "deletes",
                "isAutomatic": True,
                "signature": "sig",
            },
            {
                "type": "tool-approval-response",
                "approvalId": "a1",
                "approved": True,
                "reason": "ok",
                "providerExecuted": True,
                "providerMetadata": METADATA_A,
            },
            _output("call-1", "removed", dynamic=True),
        ],
    ),
    PartsCase(
        "control characters and line separators in text",
        [*_text("t1", "a\x00b", "\u2028\u2029", "\r\n\t\x7f"), delta("\x1b[0m")],
    ),
    # --- provider metadata on text and reasoning
    PartsCase(
        "provider metadata set at start, replaced by a delta and by the end",
        [
            {"type": "text-start", "id": "t1", "providerMetadata": METADATA_A},
            {"type": "text-delta", "id": "t1", "delta": "a"},
            {"type": "text-delta", "id": "t1", "delta": "b", "providerMetadata": METADATA_B},
            {"type": "text-end", "id": "t1"},
            {"type": "reasoning-start", "id": "r1"},
            {"type": "reasoning-delta", "id": "r1", "delta": "c"},
            {"type": "reasoning-end", "id": "r1", "providerMetadata": METADATA_A},
        ],
    ),
    # --- unicode
    PartsCase(
        "astral and combining characters",
        _text("t1", "👋🏽 ", "e\u0301", "\U0001f600", "\u200d") + _reasoning("r1", "日本語 ", "🧠"),
    ),
    PartsCase(
        "a surrogate pair split across deltas of each kind of part",
        [
            *_text("t1", "a\ud83d", "\ude00b"),
            *_reasoning("r1", "\ud83e", "\udde0"),
            delta("x\ud83d"),
            delta("\udc4b"),
            *_tool_input("call-1", "echo", '{"s": "\ud83d', '\ude00"}'),
        ],
        finalize_as=[
            {"type": "text-end", "id": "text"},
            _available("call-1", "echo", {"s": "\U0001f600"}),
        ],
    ),
    PartsCase(
        "unicode in tool input, data and sources",
        [
            _available("call-1", "translate", {"text": "naïve 🍣"}),
            _output("call-1", "ナイーブ"),
            {"type": "data-emoji", "id": "e", "data": "🎉"},
            {"type": "source-url", "sourceId": "s", "url": "https://例え.jp", "title": "例"},
        ],
    ),
]


_NULLED: list[tuple[Step, str]] = [
    ({"type": "data-x", "data": 1}, "transient"),
    ({"type": "data-x", "data": 1}, "id"),
    ({"type": "text-start", "id": "t"}, "providerMetadata"),
    ({"type": "tool-input-start", "toolCallId": "c", "toolName": "w"}, "dynamic"),
    ({"type": "tool-input-start", "toolCallId": "c", "toolName": "w"}, "title"),
    ({"type": "source-url", "sourceId": "s", "url": "u"}, "title"),
    (
        {"type": "source-document", "sourceId": "s", "mediaType": "m", "title": "t"},
        "filename",
    ),
]
"""Chunks, and an optional field of theirs that is not allowed to be null."""

_MESSAGE_LEVEL: list[tuple[str, Step]] = [
    ("start", {"type": "start", "messageId": "m"}),
    ("finish", {"type": "finish"}),
    ("abort", {"type": "abort"}),
    ("message-metadata", {"type": "message-metadata", "messageMetadata": {}}),
]
"""Message-level chunks: the edge maps them, the core refuses them."""

REFUSED: list[RefusedCase] = [
    RefusedCase(
        "text-delta with no text-start",
        [],
        {"type": "text-delta", "id": "t1", "delta": "x"},
        "unknown_part",
    ),
    RefusedCase(
        "text-end with no text-start",
        _text("t1", "a"),
        {"type": "text-end", "id": "t2"},
        "unknown_part",
    ),
    RefusedCase(
        "text-delta after its text-end",
        _text("t1", "a"),
        {"type": "text-delta", "id": "t1", "delta": "b"},
        "part_ended",
    ),
    RefusedCase(
        "reasoning-delta with no reasoning-start",
        _text("r1", "a", end=False),
        {"type": "reasoning-delta", "id": "r1", "delta": "x"},
        "unknown_part",
    ),
    RefusedCase(
        "reasoning-end after its reasoning-end",
        _reasoning("r1", "a"),
        {"type": "reasoning-end", "id": "r1"},
        "part_ended",
    ),
    RefusedCase(
        "tool-input-delta with no tool-input-start",
        [],
        {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": "{"},
        "unknown_part",
    ),
    RefusedCase(
        "tool-output-available for an unknown call",
        _tool_input("c1", "w", "{}"),
        _output("c2", 1),
        "unknown_part",
    ),
    RefusedCase(
        "tool-output-error for an unknown call",
        [],
        {"type": "tool-output-error", "toolCallId": "c", "errorText": "x"},
        "unknown_part",
    ),
    RefusedCase(
        "tool-output-denied for an unknown call",
        [delta("a")],
        {"type": "tool-output-denied", "toolCallId": "c"},
        "unknown_part",
    ),
    RefusedCase(
        "an unknown type", [delta("a")], {"type": "text-replace", "id": "t"}, "invalid_chunk"
    ),
    RefusedCase("no type", _text("t1", "a"), {"id": "t1", "delta": "b"}, "invalid_chunk"),
    RefusedCase("text-start without an id", [], {"type": "text-start"}, "invalid_chunk"),
    RefusedCase(
        "a text-delta whose delta is not a string",
        _text("t1", end=False),
        {"type": "text-delta", "id": "t1", "delta": 5},
        "invalid_chunk",
    ),
    RefusedCase(
        "a text-delta with no delta",
        _text("t1", end=False),
        {"type": "text-delta", "id": "t1"},
        "invalid_chunk",
    ),
    RefusedCase(
        "tool-input-start without a toolName",
        [],
        {"type": "tool-input-start", "toolCallId": "c"},
        "invalid_chunk",
    ),
    RefusedCase(
        "tool-input-available without an input",
        [],
        {"type": "tool-input-available", "toolCallId": "c", "toolName": "w"},
        "invalid_chunk",
    ),
    RefusedCase("a data part without data", [], {"type": "data-x", "id": "d"}, "invalid_chunk"),
    RefusedCase(
        "a data part whose id is not a string",
        [],
        {"type": "data-x", "id": 3, "data": 1},
        "invalid_chunk",
    ),
    RefusedCase(
        "a source-url without a url", [], {"type": "source-url", "sourceId": "s"}, "invalid_chunk"
    ),
    RefusedCase(
        "a citation not in ai's shape",
        _text("t1", "a", end=False),
        {"type": "text-end", "id": "t1", "citations": [{"type": "source", "sourceId": "s1"}]},
        "invalid_chunk",
        majors=("ai",),
    ),
    RefusedCase(
        "a citation with a negative index",
        _text("t1", "a", end=False),
        {"type": "text-end", "id": "t1", "citations": [{**CITATION, "startIndex": -1}]},
        "invalid_chunk",
        majors=("ai",),
    ),
    # An optional field is absent or of its type: null is neither.
    *(
        RefusedCase(f"{field} null on {chunk['type']}", [], {**chunk, field: None}, "invalid_chunk")
        for chunk, field in _NULLED
    ),
    RefusedCase(
        "provider metadata that is not an object of objects",
        [],
        {"type": "text-start", "id": "t", "providerMetadata": {"openai": 1}},
        "invalid_chunk",
    ),
    RefusedCase(
        "an inputEncoding ai does not know",
        [],
        {"type": "tool-input-start", "toolCallId": "c", "toolName": "w", "inputEncoding": "yaml"},
        "invalid_chunk",
        majors=("ai",),
    ),
    RefusedCase(
        "a preliminary flag that is not a boolean",
        [_available("c", "w", {})],
        _output("c", 1, preliminary="yes"),
        "invalid_chunk",
    ),
    RefusedCase(
        "approved that is not a boolean",
        [
            _available("c", "w", {}),
            {"type": "tool-approval-request", "approvalId": "a", "toolCallId": "c"},
        ],
        {"type": "tool-approval-response", "approvalId": "a", "approved": "yes"},
        "invalid_chunk",
        majors=("ai",),
    ),
    RefusedCase(
        "an approval response for an unknown approval",
        [_available("c", "w", {})],
        {"type": "tool-approval-response", "approvalId": "nope", "approved": True},
        "unknown_part",
        majors=("ai",),
    ),
    RefusedCase(
        "an approval request for an unknown call",
        [],
        {"type": "tool-approval-request", "approvalId": "a", "toolCallId": "c"},
        "unknown_part",
        majors=("ai",),
    ),
    # An error chunk fails the package's stream; the core leaves it to the edge.
    RefusedCase(
        "an error chunk", [delta("a")], {"type": "error", "errorText": "x"}, "invalid_chunk"
    ),
    RefusedCase(
        "a file without a mediaType",
        [],
        {"type": "file", "url": "https://example.com/f"},
        "invalid_chunk",
    ),
]


STRICTER: list[RefusedCase] = [
    # Chunks the package takes that the core refuses on purpose, changing nothing: a field
    # a data chunk does not have (the package would store it on the part), ...
    RefusedCase(
        "a data part with a field of its own",
        [{"type": "data-x", "id": "d", "data": 1}],
        {"type": "data-x", "id": "d", "data": 2, "label": "new"},
        "invalid_chunk",
    ),
    # ... a call's dynamic flag changed on the way (the package starts a second part) ...
    RefusedCase(
        "a dynamic tool whose input-available does not say dynamic",
        _tool_input("call-1", "lookup", "{}", dynamic=True),
        _available("call-1", "lookup", {}),
        "invalid_chunk",
    ),
    # ... a tool input that streams on into the next step (the package starts a second
    # part there), a second start for one call ...
    RefusedCase(
        "a tool input delta in the step after its start",
        [*_tool_input("call-1", "w", '{"a"'), {"type": "start-step"}],
        {"type": "tool-input-delta", "toolCallId": "call-1", "inputTextDelta": ": 1}"},
        "part_ended",
    ),
    RefusedCase(
        "a second tool-input-start for one call",
        _tool_input("call-1", "w", '{"a"'),
        {"type": "tool-input-start", "toolCallId": "call-1", "toolName": "w"},
        "part_exists",
    ),
    # ... an output before the input is whole (an output error may come then) ...
    RefusedCase(
        "an output while the input still streams",
        _tool_input("call-1", "search", '{"q": "re'),
        _output("call-1", ["relay"]),
        "invalid_chunk",
    ),
    # ... a second start for a live id (the package orphans the first part) ...
    RefusedCase(
        "a second text-start for a live id",
        _text("t1", "a", end=False),
        {"type": "text-start", "id": "t1"},
        "part_exists",
    ),
    RefusedCase(
        'text-start "text" while the implicit text part streams',
        [delta("a")],
        {"type": "text-start", "id": "text"},
        "part_exists",
    ),
    # ... a delta for a part its step's finish-step closed, as ai 5 and 6 refuse it ...
    RefusedCase(
        "a text-delta after finish-step",
        [{"type": "start-step"}, *_text("t1", "a", end=False), {"type": "finish-step"}],
        {"type": "text-delta", "id": "t1", "delta": "b"},
        "part_ended",
        majors=("ai",),
    ),
    # ... and the message-level chunks, which the edge maps, and the ai 7 chunks outside
    # the part vocabulary.
    *(
        RefusedCase(f"a {kind} chunk", [delta("a")], chunk, "invalid_chunk")
        for kind, chunk in _MESSAGE_LEVEL
    ),
    *(
        RefusedCase(f"a {kind} chunk", [delta("a")], chunk, "invalid_chunk", majors=("ai",))
        for kind, chunk in [
            ("reasoning-file", {"type": "reasoning-file", "url": "u", "mediaType": "image/png"}),
            ("custom", {"type": "custom", "kind": "acme.note"}),
            ("reset-step", {"type": "reset-step"}),
        ]
    ),
]


TOOL_INPUTS: list[str] = [
    '{"city": "Paris", "days": [1, 2.5, -3e2], "ok": true, "none": null}',
    '{"nested": {"list": [{"a": []}, {}], "s": "q\\"uote\\\\ \\u00e9\\n"}, "f": false}',
    '[1, "two", [3], {"four": 4}]',
    '"a plain string \\ud83d\\ude00"',
    "-12.5e-3",
    '{"emoji": "🧠", "combining": "e\u0301"}',
    '  {  "spaced" :  [ 1 , 2 ]  }  ',
    '{"__proto__": {"polluted": true}}',
    '{"a": 1, "a": 2}',
]
"""Tool inputs as JSON text, fed cut at every character: while it streams, a tool's
``input`` is the text so far repaired into JSON as ``ai`` repairs it."""


_PIECES = ["a", "bc", " ", "", "é", "e\u0301", "🙂", "日本", "\n", '"', "\\", "ok."]
"""Text pieces a random reply's deltas take; the astral one is sometimes sent split."""


_WEIGHTS = [3, 6, 6, 2, 4, 2, 8, 1, 1, 1, 1, 1, 1]
"""How often a random reply takes each of its 13 actions (see :func:`random_reply`)."""


def random_reply(seed: int, length: int = 40) -> list[Step]:
    """A reply of ``length`` steps, drawn from ``seed``: text, reasoning, the implicit part,
    tool calls (static and dynamic, streamed or not, with outputs, errors and denials),
    sources, files, data parts (some by id, some transient) and steps, interleaved. Every
    step is one that both the package and the core take (approvals and tool-input-error,
    where the majors differ, are left to the cases above)."""
    draw = random.Random(seed)
    steps: list[Step] = []
    texts: dict[str, str] = {}  # open text and reasoning parts by id: their kind
    tools: dict[str, tuple[str, str, bool, str, str]] = {}  # state, name, dynamic, to send, input
    implicit = "closed" if draw.random() < 0.3 else "unopened"
    counter = 0

    def new_id(prefix: str) -> str:
        nonlocal counter
        counter += 1
        return f"{prefix}{counter}"

    def piece() -> list[str]:
        text = draw.choice(_PIECES)
        if text == "🙂" and draw.random() < 0.5:
            return ["\ud83d", "\ude42"]  # one character, cut into its UTF-16 halves
        return [text]

    while len(steps) < length:
        action = draw.choices(range(13), weights=_WEIGHTS)[0]
        if action == 0:
            kind = draw.choice(["text", "reasoning"])
            part_id = new_id(kind[0])
            texts[part_id] = kind
            steps.append({"type": f"{kind}-start", "id": part_id})
        elif action in (1, 2) and texts:
            part_id = draw.choice(sorted(texts))
            for text in piece():
                steps.append({"type": f"{texts[part_id]}-delta", "id": part_id, "delta": text})
        elif action == 3 and texts:
            part_id = draw.choice(sorted(texts))
            steps.append({"type": f"{texts.pop(part_id)}-end", "id": part_id})
        elif action == 4 and implicit != "closed":
            implicit = "open"
            steps.extend(delta(text) for text in piece())
        elif action == 5:
            call, dynamic = new_id("call-"), draw.random() < 0.3
            text = json.dumps({"n": draw.randrange(100), "s": draw.choice(_PIECES)})
            name = draw.choice(["weather", "search"])
            streamed = draw.random() < 0.7
            if streamed:
                steps.append(
                    {
                        "type": "tool-input-start",
                        "toolCallId": call,
                        "toolName": name,
                        **({"dynamic": True} if dynamic else {}),
                    }
                )
            tools[call] = ("input-streaming", name, dynamic, text, text)
            if not streamed:
                flag = {"dynamic": True} if dynamic else {}
                steps.append(_available(call, name, json.loads(text), **flag))
                tools[call] = ("input-available", name, dynamic, "", text)
        elif action == 6 and tools:
            call = draw.choice(sorted(tools))
            state, name, dynamic, text, whole = tools[call]
            flag = {"dynamic": True} if dynamic else {}
            if state == "input-streaming" and text:
                cut = draw.randrange(1, len(text) + 1)
                steps.append(
                    {"type": "tool-input-delta", "toolCallId": call, "inputTextDelta": text[:cut]}
                )
                tools[call] = (state, name, dynamic, text[cut:], whole)
            elif state == "input-streaming":  # all of the input sent
                steps.append(_available(call, name, json.loads(whole), **flag))
                tools[call] = ("input-available", name, dynamic, "", whole)
            else:  # input-available, or a preliminary output given (then not denied)
                ending = draw.randrange(3 if state == "preliminary" else 4)
                if ending == 0:
                    steps.append(_output(call, {"r": draw.randrange(9)}, preliminary=True))
                    tools[call] = ("preliminary", name, dynamic, "", whole)
                elif ending == 1:
                    steps.append(_output(call, draw.choice([1, "x", None, [1]])))
                    del tools[call]
                elif ending == 2:
                    steps.append(
                        {"type": "tool-output-error", "toolCallId": call, "errorText": "failed"}
                    )
                    del tools[call]
                else:
                    steps.append({"type": "tool-output-denied", "toolCallId": call})
                    del tools[call]
        elif action == 7:
            steps.append(
                {
                    "type": "source-url",
                    "sourceId": new_id("s"),
                    "url": "https://example.com/" + draw.choice(_PIECES),
                }
            )
        elif action == 8:
            steps.append({"type": "file", "url": "https://example.com/f", "mediaType": "image/png"})
        elif action in (9, 10):
            chunk: Step = {"type": draw.choice(["data-a", "data-b"]), "data": draw.randrange(5)}
            if draw.random() < 0.6:
                chunk["id"] = draw.choice(["x", "y"])
            if draw.random() < 0.2:
                chunk["transient"] = True
            steps.append(chunk)
        elif action == 11 and not any(s[0] == "input-streaming" for s in tools.values()):
            if draw.random() < 0.7:
                steps.append({"type": "finish-step"})
                texts.clear()  # a finished step's open parts take no more deltas
                implicit = "closed" if implicit == "open" else implicit
            steps.append({"type": "start-step"})
        elif action == 12:
            steps.append(
                {
                    "type": "source-document",
                    "sourceId": new_id("s"),
                    "mediaType": "text/plain",
                    "title": draw.choice(_PIECES) or "t",
                }
            )
    return steps
