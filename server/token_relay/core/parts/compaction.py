"""The compacted chunks that rebuild a list of assembled parts (:func:`chunks_of`), one
implementation that a message's catch-up shares.

Fed to ``readUIMessageStream`` after a ``start``, the chunks give back exactly the parts,
one part at a time, in order:

* ``text`` / ``reasoning``: its start (with ``providerMetadata``), ONE delta holding its
  text (none if the text is empty: the start alone makes the part), and its end (with
  ``citations``) if its state is ``"done"``;
* a tool part: ``tool-input-start`` (``title``, ``toolMetadata``, ``providerExecuted``,
  ``callProviderMetadata`` as ``providerMetadata``), ONE ``tool-input-delta`` holding the
  input text that streamed, the chunk that ended the input (``tool-input-available`` or
  ``-error``), the approval's request and response if it has one, and its output, error
  or denial. A message knows how each tool's input came; a list of parts tells it where
  ``ai`` keeps the text (``rawInput``, while the input streams or after it failed before
  it was whole) and otherwise replays a whole ``input`` as ``tool-input-available``,
  which makes the same part as a ``tool-input-error`` would;
* ``step-start`` as ``start-step``; sources, files and data parts as themselves.

A ``finish-step`` goes where one ended open parts: :meth:`MessageParts.catch_up` knows
where; :func:`chunks_of`, which has the parts only, puts one before each ``start-step``
after the first part, as a model's stream does, and before a reasoning part whose id is
still open (two parts under one id, the first ended by a step's finish). Text parts carry
no id in ``message.parts``: :func:`chunks_of` names them ``text-1``, ``text-2``, … in
order.

This module is pure: no I/O, no asyncio, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from .fields import ABSENT, put

__all__ = ["chunks_of", "compacted", "text_chunks", "tool_chunks"]

APPROVAL_REQUEST: Final = {
    "descriptor": "approvalDescriptor",
    "inputSchemaInput": "inputSchemaInput",
    "requestReason": "reason",
    "isAutomatic": "isAutomatic",
    "signature": "signature",
}
"""A part's ``approval`` key → the ``tool-approval-request`` field it came from."""

_TEXTS: Final = frozenset({"text", "reasoning"})

ToolHistory = tuple[str | None, str | None, Any]
"""How a tool's input came: ``(input_text, input_end, encoding)``, as :func:`tool_chunks`
takes them."""


def chunks_of(parts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The compacted chunks that rebuild ``parts`` (``message.parts`` as
    ``readUIMessageStream`` of ``ai`` 7 assembles them) when fed after a ``start``: per
    part one start, one delta with its text and its end, tools per state, steps as
    ``start-step``. A ``finish-step`` goes before each step after the first part."""
    text_ids: list[str | None] = []
    finish_marks: list[int] = []
    texts = 0
    open_reasoning: set[str] = set()
    for index, part in enumerate(parts):
        kind = part.get("type")
        if kind == "step-start" and index > 0:
            finish_marks.append(index)
            open_reasoning.clear()
        if kind == "text":
            texts += 1
            text_ids.append(f"text-{texts}")
        elif kind == "reasoning":
            reasoning_id = str(part.get("id", "reasoning"))
            if reasoning_id in open_reasoning:
                finish_marks.append(index)
                open_reasoning.clear()
            if part.get("state") != "done":
                open_reasoning.add(reasoning_id)
            text_ids.append(reasoning_id)
        else:
            text_ids.append(None)
    return compacted(parts, text_ids, finish_marks)


def compacted(
    parts: Sequence[Mapping[str, Any]],
    text_ids: Sequence[str | None],
    finish_marks: Iterable[int],
    tool_histories: Sequence[ToolHistory | None] = (),
) -> list[dict[str, Any]]:
    """The compacted chunks of ``parts``: ``text_ids[i]`` is the chunk id of part ``i`` if
    it is a text or reasoning part; a ``finish-step`` goes before part ``i`` for each ``i``
    in ``finish_marks`` (ascending; one equal to ``len(parts)`` goes last);
    ``tool_histories[i]``, if given, is how the input of tool part ``i`` came (see
    :func:`tool_chunks`), else :func:`tool_history` reads it from the part."""
    chunks: list[dict[str, Any]] = []
    marks = iter(finish_marks)
    mark = next(marks, None)
    for index, part in enumerate(parts):
        while mark is not None and mark <= index:
            chunks.append({"type": "finish-step"})
            mark = next(marks, None)
        kind = part["type"]
        if kind in _TEXTS:
            chunk_id = text_ids[index]
            assert chunk_id is not None, "a text or reasoning part needs its chunk id"
            chunks.extend(text_chunks(part, chunk_id))
        elif kind == "dynamic-tool" or kind.startswith("tool-"):
            history = tool_histories[index] if tool_histories else None
            chunks.extend(tool_chunks(part, *(history or tool_history(part))))
        elif kind == "step-start":
            chunks.append({"type": "start-step"})
        else:
            chunks.append(dict(part))
    while mark is not None:
        chunks.append({"type": "finish-step"})
        mark = next(marks, None)
    return chunks


def text_chunks(part: Mapping[str, Any], chunk_id: str) -> list[dict[str, Any]]:
    """A text or reasoning part as its start, one delta, and its end if it has ended."""
    kind = part["type"]
    start: dict[str, Any] = {"type": f"{kind}-start", "id": chunk_id}
    if "providerMetadata" in part:
        start["providerMetadata"] = part["providerMetadata"]
    chunks = [start]
    text = part["text"]
    if text:
        chunks.append({"type": f"{kind}-delta", "id": chunk_id, "delta": text})
    if part["state"] == "done":
        end: dict[str, Any] = {"type": f"{kind}-end", "id": chunk_id}
        if "citations" in part:
            end["citations"] = part["citations"]
        chunks.append(end)
    return chunks


def tool_chunks(
    part: Mapping[str, Any],
    input_text: str | None,
    input_end: str | None,
    encoding: Any = ABSENT,
) -> list[dict[str, Any]]:
    """A tool part as the chunks of its stages, from its start to the state it is in:
    ``input_text`` is the input text that streamed (one delta), ``input_end`` the chunk
    that ended the input (``tool-input-available``, ``tool-input-error``, or ``None`` if
    none did), ``encoding`` the start's ``inputEncoding``."""
    kind = part["type"]
    dynamic = kind == "dynamic-tool"
    ids = {"toolCallId": part["toolCallId"]}
    name = part["toolName"] if dynamic else kind.removeprefix("tool-")
    named = {**ids, "toolName": name, **({"dynamic": True} if dynamic else {})}
    start: dict[str, Any] = {"type": "tool-input-start", **named}
    for key in ("title", "toolMetadata", "providerExecuted"):
        if key in part:
            start[key] = part[key]
    put(start, "providerMetadata", part.get("callProviderMetadata", ABSENT))
    put(start, "inputEncoding", encoding)
    chunks = [start]
    if input_text is not None:
        chunks.append({"type": "tool-input-delta", **ids, "inputTextDelta": input_text})
    result = part.get("resultProviderMetadata", ABSENT)
    if input_end == "tool-input-available":
        chunks.append({"type": input_end, **named, "input": part["input"]})
    elif input_end == "tool-input-error":
        error = {"type": input_end, **named, "input": part["input"]}
        error["errorText"] = part["errorText"]
        put(error, "providerMetadata", result)
        return [*chunks, error]
    approval = part.get("approval")
    if approval is not None:
        request = {"type": "tool-approval-request", **ids, "approvalId": approval["id"]}
        for key, chunk_key in APPROVAL_REQUEST.items():
            if key in approval:
                request[chunk_key] = approval[key]
        chunks.append(request)
        if "approved" in approval:
            response = {"type": "tool-approval-response", "approvalId": approval["id"]}
            response["approved"] = approval["approved"]
            put(response, "reason", approval.get("reason", ABSENT))
            chunks.append(response)
    state = part["state"]
    if state == "output-available":
        output = {"type": "tool-output-available", **ids, "output": part["output"]}
        put(output, "preliminary", part.get("preliminary", ABSENT))
        put(output, "providerMetadata", result)
        chunks.append(output)
    elif state == "output-error":
        error = {"type": "tool-output-error", **ids, "errorText": part["errorText"]}
        put(error, "providerMetadata", result)
        chunks.append(error)
    elif state == "output-denied":
        chunks.append({"type": "tool-output-denied", **ids})
    return chunks


def tool_history(part: Mapping[str, Any]) -> ToolHistory:
    """What :func:`tool_chunks` needs beyond an assembled tool part, read from the part:
    the input text while it streams, or after it failed before it was whole (``ai`` keeps
    it as ``rawInput``); the input's end (``tool-input-available`` once there is a whole
    ``input``: ``tool-input-error`` makes the same part); and ``inputEncoding``."""
    state = part["state"]
    raw = part.get("rawInput") if state in ("input-streaming", "output-error") else None
    if state == "input-streaming":
        return raw, None, part.get("inputEncoding", ABSENT)
    if raw is not None:
        text = isinstance(part.get("input"), str) and part["input"] == raw
        return raw, None, "text" if text else ABSENT
    if "input" not in part:
        return None, None, ABSENT
    return None, "tool-input-available", ABSENT
