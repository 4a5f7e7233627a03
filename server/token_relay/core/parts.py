"""Assemble one message's parts from AI SDK chunks: text, reasoning, tools, sources, data.

Theory of operation
-------------------
A reply is not one text: it streams reasoning, tool calls, text, sources and data,
interleaved and in steps. A producer describes it with the chunks of the AI SDK's UI
message stream (``UIMessageChunk`` of the ``ai`` package, major 7), and
:class:`MessageParts` assembles them into the list of parts that ``ai``'s own
``readUIMessageStream`` would build from the same chunks (``message.parts``), key for
key and state for state. Keys that ``ai`` leaves ``undefined`` are absent, as they are
once the message is JSON.

Input, per part:

* ``text-start`` / ``text-delta`` / ``text-end`` and ``reasoning-start`` /
  ``reasoning-delta`` / ``reasoning-end`` (``id``; ``providerMetadata`` where ``ai``
  takes it; ``citations`` on ``text-end``). A start opens a part under its chunk id;
  deltas and the end find it by that id. An ended id may be started again: a new part.
* :meth:`MessageParts.delta`, a top-level delta naming no part, extends the message's
  *implicit* text part, chunk id ``"text"``. Its first delta (an empty one too) creates
  it where the message is then; ``text-start`` with id ``"text"`` opens it as well.
* Tool calls, by ``toolCallId`` (unique in the message). The part is
  ``tool-<toolName>`` (``dynamic-tool`` if ``dynamic``); its ``state`` follows::

      tool-input-start --> input-streaming --tool-input-delta--> input-streaming
      input-streaming, (none) --tool-input-available--> input-available
      input-streaming, (none) --tool-input-error--> output-error
      input-available --tool-approval-request--> approval-requested
      approval-requested --tool-approval-response--> approval-responded
      input-available, approval-*, output-available (preliminary)
          --tool-output-available--> output-available (final unless ``preliminary``)
      input-streaming, input-available, approval-*, output-available (preliminary)
          --tool-output-error--> output-error
      input-available, approval-* --tool-output-denied--> output-denied

  A final state takes nothing more (``part_ended``); another step out of order is
  ``invalid_chunk``. ``ai`` is looser; these are the steps whose compacted catch-up
  rebuilds the very same part. While the input streams (JSON text, or plain text if
  ``inputEncoding`` is ``"text"``), ``input`` is the text so far repaired into JSON
  as ``ai`` repairs it (``fixJson``, ported state for state; computed when the parts
  are read, not per delta), and ``rawInput`` the text itself.
* ``source-url``, ``source-document``, ``file``: a part each, as given.
* ``data-<name>``: a part as given; one with an ``id`` replaces the ``data`` of the
  part of the same type and id, in place. A ``transient`` one is not stored.
* ``start-step`` adds a ``step-start`` part. ``finish-step`` ends the text and
  reasoning parts still open (their state stays ``"streaming"``, as in ``ai``; later
  deltas for them are refused), as ``ai`` 5 and 6 do; ``ai`` 7 does nothing there, so
  both accept what this core accepts. A tool whose input still streams when the next
  step starts takes no more input chunks (``ai`` would add a second part for them).

One difference is ``ai``'s, not the parts': ``readUIMessageStream`` yields no new
message for ``start-step`` alone, so if nothing follows one, its last message lacks
the ``step-start`` part that its state (and :meth:`MessageParts.parts`) holds.

Message-level chunks (``start``, ``finish``, ``abort``, ``error``,
``message-metadata``) are not parts: the edge maps them. ``reasoning-file``,
``custom``, ``steering-message`` and ``reset-step`` (``ai`` 7 only) are refused too.

The seed's rules, for every part that carries text (text, reasoning, a tool's input
text): empty deltas count (the first creates the implicit part); a delta for an ended
part is refused (``part_ended``) and changes nothing; a UTF-16 surrogate pair split
across two deltas of one part is joined (:func:`~token_relay.core.streams.mend`), and
a half that never pairs becomes U+FFFD when the part ends.

Finalize (:meth:`MessageParts.finalize`, idempotent) completes the parts: every text
and reasoning part becomes ``"done"``; a tool whose input still streams gets its input
text parsed as JSON (``JSON.parse``'s rules, with ``ai``'s refusal of ``__proto__``),
as if ``tool-input-available`` came with it, or, when it is not JSON, fails as if
``tool-output-error`` came (the errorText says so; a static tool keeps the text in
``rawInput``, as ``ai`` does). Other parts stay as they are. After finalize, chunks
and deltas are ignored, as the seed ignores deltas for a finalized id. An aborted
message needs nothing here: its parts stay as they are, and the edge stops feeding it.

Compacted catch-up (:meth:`MessageParts.catch_up`): the chunks that rebuild
``parts()`` when fed after a ``start``: per part, in order, its start, ONE delta
holding its text so far, and its end if it has ended; a tool as its start, one input
delta, and one chunk per later stage it reached (the last output only); a step as
``start-step``; sources, files and data as themselves; a ``finish-step`` where one
closed parts. The chunks that arrive later then apply on top, so no part comes twice.

Errors and bounds. A chunk refused raises :class:`~token_relay.core.errors.PartRejected`
and changes nothing; its ``code`` is one of :data:`CODES`. Bounds (:class:`PartLimits`),
each refusing the chunk and keeping the part as it was:

* ``max_parts`` parts in the message (``too_many_parts``);
* ``max_part_chars`` characters in one text or reasoning part, and in any string
  field of a chunk (a url, a title, an errorText) (``part_too_large``);
* ``max_tool_input_chars`` characters of a tool's input text (``part_too_large``);
* ``max_data_bytes`` bytes of the compact UTF-8 JSON of any structured value: a data
  part's ``data``, a tool's ``input`` and ``output``, and the metadata objects
  (``providerMetadata``, ``toolMetadata``, ``citations``, approval values)
  (``part_too_large``).

The core keeps the values of the chunks it is given: the caller hands them over.
:meth:`MessageParts.parts` returns new dicts, whose nested values are shared.

This module is pure: no I/O, no asyncio, no clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .assembler import RUN
from .errors import ConfigError, PartRejected, UsageError
from .streams import REPLACEMENT, mend

__all__ = ["CODES", "MessageParts", "PartLimits", "PartRejected"]

INVALID_CHUNK: Final = "invalid_chunk"
UNKNOWN_PART: Final = "unknown_part"
PART_ENDED: Final = "part_ended"
PART_EXISTS: Final = "part_exists"
TOO_MANY_PARTS: Final = "too_many_parts"
PART_TOO_LARGE: Final = "part_too_large"
CODES: Final = frozenset(
    {INVALID_CHUNK, UNKNOWN_PART, PART_ENDED, PART_EXISTS, TOO_MANY_PARTS, PART_TOO_LARGE}
)
"""Every :attr:`PartRejected.code` this module raises."""

IMPLICIT: Final = "text"
"""Chunk id of the implicit text part, the one top-level deltas extend."""

MESSAGE_CHUNKS: Final = frozenset({"start", "finish", "abort", "error", "message-metadata"})
OUTPUT_STATES: Final = frozenset({"output-available", "output-error"})
TERMINAL: Final = frozenset({"output-error", "output-denied"})


@dataclass(frozen=True, slots=True)
class PartLimits:
    """Bounds on one message's parts; a chunk past one is refused and changes nothing."""

    max_parts: int = 256
    """Parts in the message, steps included (``too_many_parts``)."""
    max_part_chars: int = 1_048_576
    """Characters of one text or reasoning part, and of any string field (``part_too_large``)."""
    max_tool_input_chars: int = 262_144
    """Characters of one tool call's streamed input text (``part_too_large``)."""
    max_data_bytes: int = 65_536
    """Bytes of the compact JSON of one structured value: data, tool input or output,
    metadata (``part_too_large``)."""

    def __post_init__(self) -> None:
        if min(self.max_parts, self.max_part_chars, self.max_tool_input_chars) < 1:
            raise ConfigError("max_parts, max_part_chars and max_tool_input_chars must be >= 1")
        if self.max_data_bytes < 4:  # room for ``null``
            raise ConfigError("max_data_bytes must be at least 4")


class _Absent:
    """JavaScript's ``undefined``: a key ``ai`` leaves undefined is absent from the part."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()


# -- chunk fields -----------------------------------------------------------------


def _reject(code: str, message: str, part_id: str | None = None) -> PartRejected:
    return PartRejected(code, message, part_id)


class _Fields:
    """Reads a chunk's fields, checking each type and bound before anything changes."""

    __slots__ = ("chunk", "kind", "limits")

    def __init__(self, chunk: Mapping[str, Any], kind: str, limits: PartLimits) -> None:
        self.chunk = chunk
        self.kind = kind
        self.limits = limits

    def bad(self, key: str, expected: str) -> PartRejected:
        return _reject(INVALID_CHUNK, f"'{self.kind}' chunk: '{key}' must be {expected}")

    def text(self, key: str) -> str:
        value = self.chunk.get(key)
        if not isinstance(value, str):
            raise self.bad(key, "a string")
        if len(value) > self.limits.max_part_chars:
            raise _reject(
                PART_TOO_LARGE,
                f"'{self.kind}' chunk: '{key}' is longer than {self.limits.max_part_chars} "
                "characters",
            )
        return value

    def optional_text(self, key: str) -> str | _Absent:
        return ABSENT if key not in self.chunk else self.text(key)

    def optional_bool(self, key: str) -> bool | _Absent:
        if key not in self.chunk:
            return ABSENT
        value = self.chunk[key]
        if not isinstance(value, bool):
            raise self.bad(key, "a boolean")
        return value

    def value(self, key: str, required: bool = False) -> Any:
        """A JSON value (``null`` included), sized against ``max_data_bytes``; ABSENT if
        missing, or if null where ``ai`` reads ``null`` as not given."""
        if key not in self.chunk:
            if required:
                raise self.bad(key, "present")
            return ABSENT
        value = self.chunk[key]
        if value is None and not required:
            return ABSENT
        self.size(key, value)
        return value

    def size(self, key: str, value: Any) -> int:
        try:
            encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            raise self.bad(key, "a JSON value") from None
        size = len(encoded.encode("utf-8", "surrogatepass"))
        if size > self.limits.max_data_bytes:
            raise _reject(
                PART_TOO_LARGE,
                f"'{self.kind}' chunk: '{key}' is {size} bytes of JSON, more than "
                f"{self.limits.max_data_bytes}",
            )
        return size

    def object(self, key: str) -> dict[str, Any] | _Absent:
        """An optional object; ``null`` is refused, as ``ai``'s chunk schema refuses it."""
        if key not in self.chunk:
            return ABSENT
        value = self.chunk[key]
        if not isinstance(value, dict):
            raise self.bad(key, "an object")
        self.size(key, value)
        return value

    def metadata(self) -> dict[str, Any] | _Absent:
        """``providerMetadata``: an object of objects, as ``ai``'s schema wants."""
        value = self.object("providerMetadata")
        if isinstance(value, dict) and not all(isinstance(v, dict) for v in value.values()):
            raise self.bad("providerMetadata", "an object of objects")
        return value


def _put(target: dict[str, Any], key: str, value: Any) -> None:
    """``target[key] = value`` as JavaScript does it: assigning ``undefined`` removes it."""
    if value is ABSENT:
        target.pop(key, None)
    else:
        target[key] = value


def _fallback(value: Any, current: Any) -> Any:
    """JavaScript's ``value ?? current``."""
    return current if value is ABSENT else value


# -- JSON as ai parses it ------------------------------------------------------------


_NOT_JSON: Final = object()
"""What Python's parser makes of ``NaN`` and ``Infinity``, which ``JSON.parse`` refuses."""


def _not_json(name: str) -> Any:
    return _NOT_JSON


def _double(literal: str) -> float | None:
    """A JSON number as JavaScript holds it; one past a double's range is ``Infinity``
    there, which JSON carries as ``null``."""
    value = float(literal)
    return None if math.isinf(value) else value


def _parse_json(text: str) -> Any:
    """``JSON.parse`` with ``secure-json-parse``'s refusals, as ``ai`` parses tool input:
    ABSENT when it fails."""
    try:
        value = json.loads(text, parse_constant=_not_json, parse_float=_double)
    except ValueError:
        return ABSENT
    nodes = [value]
    while nodes:
        node = nodes.pop()
        if node is _NOT_JSON:
            return ABSENT
        if isinstance(node, dict):
            if "__proto__" in node:
                return ABSENT
            constructor = node.get("constructor")
            if isinstance(constructor, dict) and "prototype" in constructor:
                return ABSENT
            nodes.extend(node.values())
        elif isinstance(node, list):
            nodes.extend(node)
    return value


def _partial_json(text: str) -> Any:
    """``parsePartialJson`` of ``ai``: the text as JSON, or repaired, or ABSENT."""
    value = _parse_json(text)
    return _parse_json(_repair_json(text)) if value is ABSENT else value


_VALUE_START: Final = frozenset('"ftn-0123456789{[')
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_CLOSERS: Final = {
    "INSIDE_STRING": '"',
    "INSIDE_OBJECT_KEY": "}",
    "INSIDE_OBJECT_AFTER_KEY": "}",
    "INSIDE_OBJECT_AFTER_COMMA": "}",
    "INSIDE_OBJECT_START": "}",
    "INSIDE_OBJECT_BEFORE_VALUE": "}",
    "INSIDE_OBJECT_AFTER_VALUE": "}",
    "INSIDE_ARRAY_START": "]",
    "INSIDE_ARRAY_AFTER_COMMA": "]",
    "INSIDE_ARRAY_AFTER_VALUE": "]",
}


def _repair_json(text: str) -> str:
    """``fixJson`` of ``ai``, state for state: close what a truncated JSON text left open."""
    stack = ["ROOT"]
    last_valid = -1
    literal_start = 0
    hex_digits = 0

    def value_start(char: str, i: int, swap: str) -> None:
        nonlocal last_valid, literal_start
        if char not in _VALUE_START:
            return
        if char != "-":
            last_valid = i
        stack[-1] = swap
        if char == '"':
            stack.append("INSIDE_STRING")
        elif char in "ftn":
            literal_start = i
            stack.append("INSIDE_LITERAL")
        elif char == "{":
            stack.append("INSIDE_OBJECT_START")
        elif char == "[":
            stack.append("INSIDE_ARRAY_START")
        else:
            stack.append("INSIDE_NUMBER")

    def after_value(char: str, i: int, comma_state: str, closer: str) -> None:
        nonlocal last_valid
        if char == ",":
            stack[-1] = comma_state
        elif char == closer:
            last_valid = i
            stack.pop()

    for i, char in enumerate(text):
        top = stack[-1]
        if top == "ROOT":
            value_start(char, i, "FINISH")
        elif top == "INSIDE_OBJECT_START":
            if char == '"':
                stack[-1] = "INSIDE_OBJECT_KEY"
            elif char == "}":
                last_valid = i
                stack.pop()
        elif top == "INSIDE_OBJECT_AFTER_COMMA":
            if char == '"':
                stack[-1] = "INSIDE_OBJECT_KEY"
        elif top == "INSIDE_OBJECT_KEY":
            if char == '"':
                stack[-1] = "INSIDE_OBJECT_AFTER_KEY"
        elif top == "INSIDE_OBJECT_AFTER_KEY":
            if char == ":":
                stack[-1] = "INSIDE_OBJECT_BEFORE_VALUE"
        elif top == "INSIDE_OBJECT_BEFORE_VALUE":
            value_start(char, i, "INSIDE_OBJECT_AFTER_VALUE")
        elif top == "INSIDE_OBJECT_AFTER_VALUE":
            after_value(char, i, "INSIDE_OBJECT_AFTER_COMMA", "}")
        elif top == "INSIDE_STRING":
            if char == '"':
                stack.pop()
                last_valid = i
            elif char == "\\":
                stack.append("INSIDE_STRING_ESCAPE")
            else:
                last_valid = i
        elif top == "INSIDE_ARRAY_START":
            if char == "]":
                last_valid = i
                stack.pop()
            else:
                value_start(char, i, "INSIDE_ARRAY_AFTER_VALUE")
        elif top == "INSIDE_ARRAY_AFTER_VALUE":
            if char == ",":
                stack[-1] = "INSIDE_ARRAY_AFTER_COMMA"
            elif char == "]":
                last_valid = i
                stack.pop()
            else:
                last_valid = i
        elif top == "INSIDE_ARRAY_AFTER_COMMA":
            value_start(char, i, "INSIDE_ARRAY_AFTER_VALUE")
        elif top == "INSIDE_STRING_ESCAPE":
            stack.pop()
            if char == "u":
                hex_digits = 0
                stack.append("INSIDE_STRING_UNICODE_ESCAPE")
            else:
                last_valid = i
        elif top == "INSIDE_STRING_UNICODE_ESCAPE":
            if char in _HEX:
                hex_digits += 1
                if hex_digits == 4:
                    stack.pop()
                    last_valid = i
        elif top == "INSIDE_NUMBER":
            if char in "0123456789":
                last_valid = i
            elif char in "eE-.":
                pass
            elif char in ",}]":
                stack.pop()
                if stack[-1] == "INSIDE_ARRAY_AFTER_VALUE" and char != "}":
                    after_value(char, i, "INSIDE_ARRAY_AFTER_COMMA", "]")
                if stack[-1] == "INSIDE_OBJECT_AFTER_VALUE" and char != "]":
                    after_value(char, i, "INSIDE_OBJECT_AFTER_COMMA", "}")
            else:
                stack.pop()
        elif top == "INSIDE_LITERAL":
            partial = text[literal_start : i + 1]
            if not any(word.startswith(partial) for word in ("false", "true", "null")):
                stack.pop()
                if stack[-1] == "INSIDE_OBJECT_AFTER_VALUE":
                    after_value(char, i, "INSIDE_OBJECT_AFTER_COMMA", "}")
                elif stack[-1] == "INSIDE_ARRAY_AFTER_VALUE":
                    after_value(char, i, "INSIDE_ARRAY_AFTER_COMMA", "]")
            else:
                last_valid = i

    result = text[: last_valid + 1]
    for state in reversed(stack):
        if state == "INSIDE_LITERAL":
            partial = text[literal_start:]
            for word in ("true", "false", "null"):
                if word.startswith(partial):
                    result += word[len(partial) :]
                    break
        else:
            result += _CLOSERS.get(state, "")
    return result


# -- the records behind the parts --------------------------------------------------


class _Buffer:
    """A part's text so far: joined runs of deltas (as the assembler keeps them), and
    a high surrogate held back for its low half."""

    __slots__ = ("chars", "held", "joined", "pieces")

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.joined = 0
        self.chars = 0
        self.held = ""

    def prepare(self, delta: str, limit: int, what: str, part_id: str) -> tuple[str, str]:
        """What ``delta`` appends and holds back; raises if it would pass ``limit``."""
        if self.held or not delta.isascii():
            appended, held = mend(self.held, delta, False)
        else:
            appended, held = delta, ""
        if self.chars + len(appended) + len(held) > limit:
            raise _reject(
                PART_TOO_LARGE, f"{what} '{part_id}' would pass {limit} characters", part_id
            )
        return appended, held

    def commit(self, appended: str, held: str) -> int:
        self.held = held
        if appended:
            pieces = self.pieces
            pieces.append(appended)
            self.chars += len(appended)
            if len(pieces) - self.joined >= RUN:
                pieces[self.joined :] = ["".join(pieces[self.joined :])]
                self.joined += 1
        return len(appended)

    def flush(self) -> int:
        """The part ends: a half still held becomes U+FFFD. Returns the characters added."""
        if not self.held:
            return 0
        self.held = ""
        return self.commit(REPLACEMENT, "")

    def text(self) -> str:
        if len(self.pieces) > 1:
            self.pieces[:] = ["".join(self.pieces)]
            self.joined = 1
        return self.pieces[0] if self.pieces else ""


class _Text:
    """A ``text`` or ``reasoning`` part."""

    __slots__ = ("buffer", "chunk_id", "citations", "index", "kind", "metadata", "open", "state")

    def __init__(self, kind: str, chunk_id: str, metadata: Any, index: int) -> None:
        self.index = index
        self.kind = kind
        self.chunk_id = chunk_id
        self.metadata = metadata
        self.citations: Any = ABSENT
        self.state = "streaming"
        self.open = True
        """Whether deltas and the end may still come (not ended, no finish-step since)."""
        self.buffer = _Buffer()

    def render(self) -> dict[str, Any]:
        part: dict[str, Any] = {"type": self.kind}
        if self.kind == "reasoning":
            part["id"] = self.chunk_id
        part["text"] = self.buffer.text()
        _put(part, "providerMetadata", self.metadata)
        part["state"] = self.state
        _put(part, "citations", self.citations)
        return part

    def replay(self) -> list[dict[str, Any]]:
        start: dict[str, Any] = {"type": f"{self.kind}-start", "id": self.chunk_id}
        _put(start, "providerMetadata", self.metadata)
        chunks = [start]
        text = self.buffer.text()
        if text:
            chunks.append({"type": f"{self.kind}-delta", "id": self.chunk_id, "delta": text})
        if self.state == "done":
            end: dict[str, Any] = {"type": f"{self.kind}-end", "id": self.chunk_id}
            _put(end, "citations", self.citations)
            chunks.append(end)
        return chunks


class _Tool:
    """A ``tool-<name>`` or ``dynamic-tool`` part: ``part`` is ``ai``'s object, but for
    ``input`` and ``rawInput`` while the input streams, which are rendered from the text."""

    __slots__ = (
        "buffer",
        "dynamic",
        "encoding",
        "had_delta",
        "index",
        "input_end",
        "name",
        "open",
        "output_bytes",
        "part",
        "tool_call_id",
    )

    def __init__(self, tool_call_id: str, name: str, dynamic: bool, index: int) -> None:
        self.index = index
        self.tool_call_id = tool_call_id
        self.name = name
        self.dynamic = dynamic
        self.encoding: Any = ABSENT
        self.part: dict[str, Any] = (
            {"type": "dynamic-tool", "toolName": name, "toolCallId": tool_call_id}
            if dynamic
            else {"type": f"tool-{name}", "toolCallId": tool_call_id}
        )
        self.buffer = _Buffer()
        self.had_delta = False
        self.open = False
        """Whether input deltas may still come: streaming, in the current step."""
        self.input_end: str | None = None
        """How the input ended: ``tool-input-available`` or ``tool-input-error``."""
        self.output_bytes = 0

    @property
    def state(self) -> str:
        return str(self.part["state"])

    def final(self) -> bool:
        """No chunk may change the part any more."""
        state = self.state
        return state in TERMINAL or (
            state == "output-available" and self.part.get("preliminary") is not True
        )

    def streamed_input(self) -> tuple[Any, Any]:
        """``(input, rawInput)`` as ``ai`` holds them while the input streams."""
        if self.state != "input-streaming" or not self.had_delta:
            return self.part.get("input", ABSENT), self.part.get("rawInput", ABSENT)
        raw = self.buffer.text()
        return (raw if self.encoding == "text" else _partial_json(raw)), raw

    def update(self, state: str, **options: Any) -> None:
        """``updateToolPart`` / ``updateDynamicToolPart`` of ``ai`` on this part; an option
        not given is ``undefined``."""
        part = self.part
        part["state"] = state
        for key in ("input", "output", "errorText", "rawInput", "inputEncoding", "preliminary"):
            _put(part, key, options.get(key, ABSENT))
        for key in ("title", "toolMetadata"):
            if options.get(key, ABSENT) is not ABSENT:
                part[key] = options[key]
        executed = _fallback(options.get("providerExecuted", ABSENT), part.get("providerExecuted"))
        _put(part, "providerExecuted", ABSENT if executed is None else executed)
        metadata = options.get("providerMetadata", ABSENT)
        if metadata is not ABSENT:
            key = "resultProviderMetadata" if state in OUTPUT_STATES else "callProviderMetadata"
            part[key] = metadata

    def render(self) -> dict[str, Any]:
        part = dict(self.part)
        if self.state == "input-streaming" and self.had_delta:
            value, raw = self.streamed_input()
            _put(part, "input", value)
            part["rawInput"] = raw
        if "approval" in part:
            part["approval"] = dict(part["approval"])
        return part

    def replay(self) -> list[dict[str, Any]]:
        part = self.part
        ids = {"toolCallId": self.tool_call_id}
        named = {**ids, "toolName": self.name, **({"dynamic": True} if self.dynamic else {})}
        start: dict[str, Any] = {"type": "tool-input-start", **named}
        for key in ("title", "toolMetadata", "providerExecuted"):
            if key in part:
                start[key] = part[key]
        _put(start, "providerMetadata", part.get("callProviderMetadata", ABSENT))
        _put(start, "inputEncoding", self.encoding)
        chunks = [start]
        if self.had_delta:
            text = self.buffer.text()
            chunks.append({"type": "tool-input-delta", **ids, "inputTextDelta": text})
        result = part.get("resultProviderMetadata", ABSENT)
        if self.input_end == "tool-input-available":
            chunks.append({"type": self.input_end, **named, "input": part["input"]})
        elif self.input_end == "tool-input-error":
            error = {"type": self.input_end, **named, "input": part["input"]}
            error["errorText"] = part["errorText"]
            _put(error, "providerMetadata", result)
            return [*chunks, error]
        approval = part.get("approval")
        if approval is not None:
            request = {"type": "tool-approval-request", **ids, "approvalId": approval["id"]}
            for key, chunk_key in _APPROVAL_REQUEST.items():
                if key in approval:
                    request[chunk_key] = approval[key]
            chunks.append(request)
            if "approved" in approval:
                response = {"type": "tool-approval-response", "approvalId": approval["id"]}
                response["approved"] = approval["approved"]
                _put(response, "reason", approval.get("reason", ABSENT))
                chunks.append(response)
        state = self.state
        if state == "output-available":
            output = {"type": "tool-output-available", **ids, "output": part["output"]}
            _put(output, "preliminary", part.get("preliminary", ABSENT))
            _put(output, "providerMetadata", result)
            chunks.append(output)
        elif state == "output-error":
            error = {"type": "tool-output-error", **ids, "errorText": part["errorText"]}
            _put(error, "providerMetadata", result)
            chunks.append(error)
        elif state == "output-denied":
            chunks.append({"type": "tool-output-denied", **ids})
        return chunks


_APPROVAL_REQUEST: Final = {
    "descriptor": "approvalDescriptor",
    "inputSchemaInput": "inputSchemaInput",
    "requestReason": "reason",
    "isAutomatic": "isAutomatic",
    "signature": "signature",
}
"""A part's ``approval`` key → the ``tool-approval-request`` field it came from."""

_Part = _Text | _Tool | dict[str, Any]


# -- the message ---------------------------------------------------------------------


class MessageParts:
    """One message's parts, assembled from AI SDK chunks and top-level deltas."""

    __slots__ = (
        "_approvals",
        "_chars",
        "_data",
        "_finalized",
        "_finish_marks",
        "_open_tools",
        "_parts",
        "_reasonings",
        "_text_ids",
        "_texts",
        "_tools",
        "limits",
    )

    def __init__(self, limits: PartLimits = PartLimits()) -> None:
        self.limits = limits
        self._parts: list[_Part] = []
        self._texts: dict[str, _Text] = {}
        """Open text parts by chunk id."""
        self._reasonings: dict[str, _Text] = {}
        """Open reasoning parts by chunk id."""
        self._text_ids: set[tuple[str, str]] = set()
        """(kind, chunk id) of every text and reasoning part, to tell ended from unknown."""
        self._tools: dict[str, _Tool] = {}
        """Every tool part, by tool call id."""
        self._open_tools: dict[str, _Tool] = {}
        """Tool parts whose input may still stream: started in the current step."""
        self._approvals: dict[str, _Tool] = {}
        """Tool parts by the approval id asked for them."""
        self._data: dict[tuple[str, str], tuple[int, int]] = {}
        """(type, id) of a data part → (its index, the bytes of its data)."""
        self._finish_marks: list[int] = []
        """The number of parts at each ``finish-step`` that ended open parts."""
        self._chars = 0
        self._finalized = False

    # -- reading

    @property
    def finalized(self) -> bool:
        """Whether :meth:`finalize` ran: nothing applies any more."""
        return self._finalized

    def parts(self) -> list[dict[str, Any]]:
        """The parts, as ``readUIMessageStream`` of ``ai`` 7 assembles them: new dicts."""
        return [
            dict(record) if isinstance(record, dict) else record.render() for record in self._parts
        ]

    def text(self) -> str:
        """The concatenation of the text parts' texts, in order."""
        return "".join(
            record.buffer.text()
            for record in self._parts
            if isinstance(record, _Text) and record.kind == "text"
        )

    def chars(self) -> int:
        """What the message holds, for the relay's memory accounting: characters of text
        (text, reasoning, tool input text) plus bytes of the JSON values given (data,
        tool input and output)."""
        return self._chars

    def catch_up(self) -> list[dict[str, Any]]:
        """The compacted chunks that rebuild :meth:`parts` after a ``start``; the chunks
        applied after this call then apply on top of them, so no part comes twice."""
        chunks: list[dict[str, Any]] = []
        marks = iter(self._finish_marks)
        mark = next(marks, None)
        for index, record in enumerate(self._parts):
            while mark is not None and mark <= index:
                chunks.append({"type": "finish-step"})
                mark = next(marks, None)
            if isinstance(record, dict):
                chunks.append(
                    {"type": "start-step"} if record["type"] == "step-start" else dict(record)
                )
            else:
                chunks.extend(record.replay())
        while mark is not None:
            chunks.append({"type": "finish-step"})
            mark = next(marks, None)
        return chunks

    # -- writing

    def delta(self, text: str) -> int | None:
        """Extend the implicit text part (chunk id ``"text"``), creating it at the end of
        the message on its first delta, an empty one included. Returns its index, or
        ``None`` once the message is finalized (the delta is ignored)."""
        if not isinstance(text, str):
            raise UsageError("a delta must be a string")
        if self._finalized:
            return None
        record = self._texts.get(IMPLICIT)
        if record is not None:
            self._extend(record, text)
            return record.index
        if ("text", IMPLICIT) in self._text_ids:
            raise _reject(PART_ENDED, "the message's text part has ended", IMPLICIT)
        self._room()
        probe = _Buffer()
        appended, held = probe.prepare(text, self.limits.max_part_chars, "text", IMPLICIT)
        index = self._open_text("text", IMPLICIT, ABSENT)
        self._chars += self._texts[IMPLICIT].buffer.commit(appended, held)
        return index

    def apply(self, chunk: Mapping[str, Any]) -> int | None:
        """Apply one UI message chunk of ``ai`` 7. Returns the index of the part it
        created or changed, or ``None`` if it changed none (``finish-step``, a transient
        data part, anything once the message is finalized). Raises
        :class:`~token_relay.core.errors.PartRejected`, having changed nothing."""
        if self._finalized:
            return None
        if type(chunk) is dict:
            kind = chunk.get("type")
            if kind in _DELTAS:
                index = self._plain_delta(chunk, kind)
                if index is not None:
                    return index
        else:
            kind = chunk.get("type") if isinstance(chunk, Mapping) else None
        if not isinstance(kind, str):
            raise _reject(INVALID_CHUNK, "a chunk must be an object with a string 'type'")
        handler = _HANDLERS.get(kind)
        if handler is not None:
            return handler(self, _Fields(chunk, kind, self.limits))
        if kind.startswith("data-"):
            return self._apply_data(_Fields(chunk, kind, self.limits))
        if kind in MESSAGE_CHUNKS:
            raise _reject(INVALID_CHUNK, f"'{kind}' is a message-level chunk, not a part")
        raise _reject(INVALID_CHUNK, f"unknown chunk type '{kind}'")

    def _plain_delta(self, chunk: dict[str, Any], kind: str) -> int | None:
        """The hot path: an ASCII delta, no metadata, for an open part, within bounds.
        ``None`` sends the chunk the checked way, which also words any refusal."""
        if kind == "tool-input-delta":
            delta = chunk.get("inputTextDelta")
            part_id = chunk.get("toolCallId")
            found = self._open_tools.get(part_id) if type(part_id) is str else None
            if found is None:
                return None
            record: _Text | _Tool = found
            limit = self.limits.max_tool_input_chars
        else:
            delta = chunk.get("delta")
            texts = self._texts if kind == "text-delta" else self._reasonings
            part_id = chunk.get("id")
            found_text = texts.get(part_id) if type(part_id) is str else None
            if found_text is None or "providerMetadata" in chunk:
                return None
            record = found_text
            limit = self.limits.max_part_chars
        buffer = record.buffer
        if (
            type(delta) is not str
            or buffer.held
            or not delta.isascii()
            or buffer.chars + len(delta) > limit
        ):
            return None
        self._chars += buffer.commit(delta, "")
        if type(record) is _Tool:
            record.had_delta = True
        return record.index

    def finalize(self) -> None:
        """Complete the parts (see the module's docstring); idempotent."""
        if self._finalized:
            return
        for record in self._parts:
            if isinstance(record, _Text):
                self._chars += record.buffer.flush()
                record.state = "done"
                record.open = False
            elif isinstance(record, _Tool) and record.state == "input-streaming":
                self._chars += record.buffer.flush()
                raw = record.buffer.text()
                value = raw if record.encoding == "text" else _parse_json(raw)
                if value is ABSENT:
                    self._fail_input(
                        record, "the message ended before this tool call's input was valid JSON"
                    )
                else:
                    record.update("input-available", input=value)
                    record.input_end = "tool-input-available"
                record.open = False
        self._texts.clear()
        self._reasonings.clear()
        self._open_tools.clear()
        self._finalized = True

    # -- helpers

    def _room(self) -> None:
        if len(self._parts) >= self.limits.max_parts:
            raise _reject(TOO_MANY_PARTS, f"the message already has {self.limits.max_parts} parts")

    def _open_text(self, kind: str, chunk_id: str, metadata: Any) -> int:
        record = _Text(kind, chunk_id, metadata, len(self._parts))
        (self._texts if kind == "text" else self._reasonings)[chunk_id] = record
        self._text_ids.add((kind, chunk_id))
        self._parts.append(record)
        return len(self._parts) - 1

    def _extend(self, record: _Text, delta: str, metadata: Any = ABSENT) -> None:
        limit = self.limits.max_part_chars
        appended, held = record.buffer.prepare(delta, limit, record.kind, record.chunk_id)
        self._chars += record.buffer.commit(appended, held)
        if metadata is not ABSENT:
            record.metadata = metadata

    def _open_record(self, fields: _Fields, kind: str) -> _Text:
        chunk_id = fields.text("id")
        record = (self._texts if kind == "text" else self._reasonings).get(chunk_id)
        if record is None:
            code = PART_ENDED if (kind, chunk_id) in self._text_ids else UNKNOWN_PART
            raise _reject(code, f"no open {kind} part '{chunk_id}'", chunk_id)
        return record

    def _append(self, part: dict[str, Any]) -> int:
        self._room()
        self._parts.append(part)
        return len(self._parts) - 1

    def _fail_input(self, tool: _Tool, error_text: str) -> None:
        """The tool failed while its input streamed: ``tool-output-error`` on it."""
        value, raw = tool.streamed_input()
        tool.update(
            "output-error",
            input=value,
            errorText=error_text,
            rawInput=ABSENT if tool.dynamic else raw,
            title=tool.part.get("title", ABSENT),
        )

    # -- chunks, one method per type

    def _start_text(self, fields: _Fields) -> int:
        kind = fields.kind.partition("-")[0]
        chunk_id = fields.text("id")
        metadata = fields.metadata()
        if chunk_id in (self._texts if kind == "text" else self._reasonings):
            raise _reject(PART_EXISTS, f"{kind} part '{chunk_id}' is already open", chunk_id)
        self._room()
        return self._open_text(kind, chunk_id, metadata)

    def _text_delta(self, fields: _Fields) -> int:
        record = self._open_record(fields, fields.kind.partition("-")[0])
        self._extend(record, fields.text("delta"), fields.metadata())
        return record.index

    def _end_text(self, fields: _Fields) -> int:
        record = self._open_record(fields, fields.kind.partition("-")[0])
        metadata = fields.metadata()
        citations = ABSENT if fields.kind == "reasoning-end" else fields.value("citations")
        if citations is not ABSENT and not isinstance(citations, list):
            raise fields.bad("citations", "an array")
        self._chars += record.buffer.flush()
        record.metadata = _fallback(metadata, record.metadata)
        if citations is not ABSENT:
            record.citations = citations
        record.state = "done"
        record.open = False
        del (self._texts if record.kind == "text" else self._reasonings)[record.chunk_id]
        return record.index

    def _tool_fields(self, fields: _Fields) -> dict[str, Any]:
        """The options every tool chunk that names its tool may carry."""
        return {
            "providerExecuted": fields.optional_bool("providerExecuted"),
            "providerMetadata": fields.metadata(),
            "toolMetadata": fields.object("toolMetadata"),
        }

    def _new_tool(self, tool_call_id: str, name: str, dynamic: bool) -> _Tool:
        self._room()
        tool = _Tool(tool_call_id, name, dynamic, len(self._parts))
        self._parts.append(tool)
        self._tools[tool_call_id] = tool
        return tool

    def _tool(self, fields: _Fields) -> _Tool:
        tool_call_id = fields.text("toolCallId")
        found = self._tools.get(tool_call_id)
        if found is None:
            raise _reject(UNKNOWN_PART, f"no tool call '{tool_call_id}'", tool_call_id)
        return found

    def _tool_input_start(self, fields: _Fields) -> int:
        tool_call_id = fields.text("toolCallId")
        name = fields.text("toolName")
        encoding = fields.optional_text("inputEncoding")
        if encoding not in (ABSENT, "json", "text"):
            raise fields.bad("inputEncoding", "'json' or 'text'")
        options = self._tool_fields(fields)
        title = fields.optional_text("title")
        dynamic = fields.optional_bool("dynamic") is True
        if tool_call_id in self._tools:
            raise _reject(PART_EXISTS, f"tool call '{tool_call_id}' exists", tool_call_id)
        tool = self._new_tool(tool_call_id, name, dynamic)
        tool.encoding = encoding
        tool.open = True
        tool.update("input-streaming", inputEncoding=encoding, title=title, **options)
        self._open_tools[tool_call_id] = tool
        return tool.index

    def _tool_input_delta(self, fields: _Fields) -> int:
        tool = self._tool(fields)
        delta = fields.text("inputTextDelta")
        if not tool.open:
            raise _reject(
                PART_ENDED,
                f"tool call '{tool.tool_call_id}' takes no more input",
                tool.tool_call_id,
            )
        limit = self.limits.max_tool_input_chars
        appended, held = tool.buffer.prepare(delta, limit, "tool input", tool.tool_call_id)
        self._chars += tool.buffer.commit(appended, held)
        tool.had_delta = True
        return tool.index

    def _input_end(self, fields: _Fields) -> tuple[_Tool | None, str, bool, Any]:
        """Checks common to ``tool-input-available`` and ``tool-input-error``: the tool
        (None if it is new), its name, whether it is dynamic, and the input."""
        tool_call_id = fields.text("toolCallId")
        name = fields.text("toolName")
        dynamic = fields.optional_bool("dynamic") is True
        value = fields.value("input", required=True)
        found = self._tools.get(tool_call_id)
        if found is None:
            return None, name, dynamic, value
        tool = found
        if not tool.open:
            raise _reject(
                PART_ENDED, f"tool call '{tool_call_id}' has no input streaming", tool_call_id
            )
        if name != tool.name:
            raise _reject(
                INVALID_CHUNK, f"tool call '{tool_call_id}' is of tool '{tool.name}'", tool_call_id
            )
        return tool, name, dynamic, value

    def _close_input(self, tool: _Tool, how: str, value: Any, fields: _Fields) -> None:
        self._chars += tool.buffer.flush() + fields.size("input", value)
        tool.open = False
        tool.input_end = how
        self._open_tools.pop(tool.tool_call_id, None)

    def _tool_input_available(self, fields: _Fields) -> int:
        tool, name, dynamic, value = self._input_end(fields)
        options = self._tool_fields(fields)
        title = fields.optional_text("title")
        if tool is not None and dynamic != tool.dynamic:
            raise _reject(
                INVALID_CHUNK,
                f"tool call '{tool.tool_call_id}' was started "
                f"{'dynamic' if tool.dynamic else 'static'}",
                tool.tool_call_id,
            )
        if tool is None:
            tool = self._new_tool(fields.text("toolCallId"), name, dynamic)
        tool.update("input-available", input=value, title=title, **options)
        self._close_input(tool, "tool-input-available", value, fields)
        return tool.index

    def _tool_input_error(self, fields: _Fields) -> int:
        tool, name, dynamic, value = self._input_end(fields)
        error_text = fields.text("errorText")
        options = self._tool_fields(fields)
        if tool is None:
            tool = self._new_tool(fields.text("toolCallId"), name, dynamic)
        tool.update("output-error", input=value, errorText=error_text, **options)
        self._close_input(tool, "tool-input-error", value, fields)
        return tool.index

    def _tool_approval_request(self, fields: _Fields) -> int:
        tool = self._tool(fields)
        approval_id = fields.text("approvalId")
        approval: dict[str, Any] = {"id": approval_id}
        descriptor = fields.value("approvalDescriptor")
        if descriptor is not ABSENT:
            approval["descriptor"] = descriptor
        if "inputSchemaInput" in fields.chunk:
            approval["inputSchemaInput"] = fields.value("inputSchemaInput", required=True)
        reason = fields.optional_text("reason")
        if reason is not ABSENT:
            approval["requestReason"] = reason
        if fields.optional_bool("isAutomatic") is True:
            approval["isAutomatic"] = True
        signature = fields.optional_text("signature")
        if signature is not ABSENT:
            approval["signature"] = signature
        self._tool_stage(tool, ("input-available",), "tool-approval-request")
        if approval_id in self._approvals:
            raise _reject(PART_EXISTS, f"approval '{approval_id}' exists", approval_id)
        tool.part["state"] = "approval-requested"
        tool.part["approval"] = approval
        self._approvals[approval_id] = tool
        return tool.index

    def _tool_approval_response(self, fields: _Fields) -> int:
        approval_id = fields.text("approvalId")
        approved = fields.chunk.get("approved")
        if not isinstance(approved, bool):
            raise fields.bad("approved", "a boolean")
        reason = fields.optional_text("reason")
        executed = fields.optional_bool("providerExecuted")
        metadata = fields.metadata()
        found = self._approvals.get(approval_id)
        if found is None:
            raise _reject(UNKNOWN_PART, f"no approval '{approval_id}'", approval_id)
        tool = found
        self._tool_stage(tool, ("approval-requested",), "tool-approval-response")
        approval = {**tool.part["approval"], "id": approval_id, "approved": approved}
        _put(approval, "reason", reason)
        tool.part["state"] = "approval-responded"
        tool.part["approval"] = approval
        if executed is not ABSENT:
            tool.part["providerExecuted"] = executed
        if metadata is not ABSENT:
            tool.part["callProviderMetadata"] = metadata
        return tool.index

    def _tool_stage(self, tool: _Tool, allowed: tuple[str, ...], kind: str) -> None:
        """Refuse ``kind`` unless the tool's state is one of ``allowed``."""
        if tool.state in allowed and not (tool.state == "output-available" and tool.final()):
            return
        code = PART_ENDED if tool.final() else INVALID_CHUNK
        raise _reject(
            code,
            f"'{kind}' for tool call '{tool.tool_call_id}' in state '{tool.state}'",
            tool.tool_call_id,
        )

    def _output(self, fields: _Fields) -> tuple[_Tool, dict[str, Any]]:
        tool = self._tool(fields)
        options = {
            "providerExecuted": fields.optional_bool("providerExecuted"),
            "providerMetadata": fields.metadata(),
            "toolMetadata": fields.object("toolMetadata"),
            "input": tool.part.get("input", ABSENT),
            "title": tool.part.get("title", ABSENT),
        }
        return tool, options

    def _tool_output_available(self, fields: _Fields) -> int:
        tool, options = self._output(fields)
        output = fields.value("output", required=True)
        size = fields.size("output", output)
        preliminary = fields.optional_bool("preliminary")
        self._tool_stage(tool, _OUTPUT_FROM, fields.kind)
        tool.update("output-available", output=output, preliminary=preliminary, **options)
        self._chars += size - tool.output_bytes
        tool.output_bytes = size
        return tool.index

    def _tool_output_error(self, fields: _Fields) -> int:
        tool, options = self._output(fields)
        error_text = fields.text("errorText")
        self._tool_stage(tool, ("input-streaming", *_OUTPUT_FROM), fields.kind)
        if tool.state == "input-streaming":
            self._chars += tool.buffer.flush()
            self._open_tools.pop(tool.tool_call_id, None)
            tool.open = False
            options["input"], raw = tool.streamed_input()
            options["rawInput"] = ABSENT if tool.dynamic else raw
        elif not tool.dynamic:
            options["rawInput"] = tool.part.get("rawInput", ABSENT)
        tool.update("output-error", errorText=error_text, **options)
        self._chars -= tool.output_bytes
        tool.output_bytes = 0
        return tool.index

    def _tool_output_denied(self, fields: _Fields) -> int:
        tool = self._tool(fields)
        allowed = ("input-available", "approval-requested", "approval-responded")
        self._tool_stage(tool, allowed, fields.kind)
        tool.part["state"] = "output-denied"
        return tool.index

    def _source_url(self, fields: _Fields) -> int:
        part: dict[str, Any] = {"type": "source-url", "sourceId": fields.text("sourceId")}
        part["url"] = fields.text("url")
        _put(part, "title", fields.optional_text("title"))
        _put(part, "providerMetadata", fields.metadata())
        return self._append(part)

    def _source_document(self, fields: _Fields) -> int:
        part: dict[str, Any] = {"type": "source-document", "sourceId": fields.text("sourceId")}
        part["mediaType"] = fields.text("mediaType")
        part["title"] = fields.text("title")
        _put(part, "filename", fields.optional_text("filename"))
        _put(part, "providerMetadata", fields.metadata())
        return self._append(part)

    def _file(self, fields: _Fields) -> int:
        part: dict[str, Any] = {"type": "file", "mediaType": fields.text("mediaType")}
        part["url"] = fields.text("url")
        _put(part, "providerMetadata", fields.metadata())
        return self._append(part)

    def _start_step(self, fields: _Fields) -> int:
        index = self._append({"type": "step-start"})
        for tool in self._open_tools.values():
            # ai looks a streaming tool up in the current step only: input chunks for it
            # from now on would make a second part, so they are refused.
            self._chars += tool.buffer.flush()
            tool.open = False
        self._open_tools.clear()
        return index

    def _finish_step(self, fields: _Fields) -> None:
        if not (self._texts or self._reasonings):
            return None
        for record in (*self._texts.values(), *self._reasonings.values()):
            self._chars += record.buffer.flush()
            record.open = False
        self._texts.clear()
        self._reasonings.clear()
        self._finish_marks.append(len(self._parts))
        return None

    def _apply_data(self, fields: _Fields) -> int | None:
        chunk = fields.chunk
        extra = set(chunk) - {"type", "id", "data", "transient"}
        if extra:
            raise fields.bad(sorted(extra)[0], "absent: a data chunk carries id, data, transient")
        data_id = fields.optional_text("id")
        size = fields.size("data", fields.value("data", required=True))
        if fields.optional_bool("transient") is True:
            return None
        key = (fields.kind, data_id) if isinstance(data_id, str) else None
        found = None if key is None else self._data.get(key)
        if found is not None:
            index, old = found
            part = self._parts[index]
            assert isinstance(part, dict)
            part["data"] = chunk["data"]
        else:
            index = self._append(dict(chunk))
            old = 0
        if key is not None:
            self._data[key] = (index, size)
        self._chars += size - old
        return index


_DELTAS: Final = frozenset({"text-delta", "reasoning-delta", "tool-input-delta"})

_OUTPUT_FROM: Final = (
    "input-available",
    "approval-requested",
    "approval-responded",
    "output-available",
)
"""States a tool output may follow (``output-available`` only while ``preliminary``)."""

_HANDLERS: Final[dict[str, Callable[[MessageParts, _Fields], int | None]]] = {
    "text-start": MessageParts._start_text,
    "text-delta": MessageParts._text_delta,
    "text-end": MessageParts._end_text,
    "reasoning-start": MessageParts._start_text,
    "reasoning-delta": MessageParts._text_delta,
    "reasoning-end": MessageParts._end_text,
    "tool-input-start": MessageParts._tool_input_start,
    "tool-input-delta": MessageParts._tool_input_delta,
    "tool-input-available": MessageParts._tool_input_available,
    "tool-input-error": MessageParts._tool_input_error,
    "tool-approval-request": MessageParts._tool_approval_request,
    "tool-approval-response": MessageParts._tool_approval_response,
    "tool-output-available": MessageParts._tool_output_available,
    "tool-output-error": MessageParts._tool_output_error,
    "tool-output-denied": MessageParts._tool_output_denied,
    "source-url": MessageParts._source_url,
    "source-document": MessageParts._source_document,
    "file": MessageParts._file,
    "start-step": MessageParts._start_step,
    "finish-step": MessageParts._finish_step,
}
"""Chunk type → what applies it (``data-<name>`` aside)."""
