"""The records behind the parts (a part's text so far, text and reasoning parts, tool
calls): each renders its part as ``ai`` holds it, and counts what it holds.

A record changes only through the message (:class:`~token_relay.core.parts.MessageParts`),
which checks each chunk first; a record renders a new dict each time it is read.

What a part holds, as :meth:`~token_relay.core.parts.MessageParts.chars` counts it: its
text (:class:`TextBuffer`, counted as it grows), and the rest of it by :func:`held_size`
(a part kept as a dict, a tool's object) or :meth:`TextRecord.count`.
"""

from __future__ import annotations

from typing import Any, Final

from ..assembler import RUN
from ..surrogates import REPLACEMENT, mend
from .fields import ABSENT, fallback, json_size, put
from .partialjson import partial_json
from .refusals import PART_TOO_LARGE, reject

OUTPUT_STATES: Final = frozenset({"output-available", "output-error"})
TERMINAL: Final = frozenset({"output-error", "output-denied"})

IMPLICIT: Final = "text"
"""Chunk id of the implicit text part, the one top-level deltas extend."""

JSON_FIELDS: Final = frozenset(
    {
        "data",
        "input",
        "output",
        "providerMetadata",
        "callProviderMetadata",
        "resultProviderMetadata",
        "toolMetadata",
        "citations",
        "approval",
    }
)
"""The keys of a part whose value is JSON, counted by the bytes of its JSON."""

_NOT_HELD: Final = frozenset({"type", "state", "rawInput"})
"""String keys of a part that count no characters: the type and state the core names
(the name in a type aside: :func:`held_size`), and ``rawInput``, which is the tool's input
text, counted once, as text."""

_NAMED: Final = ("data-", "tool-")
"""Types that carry a name the producer gave: ``data-<name>``, ``tool-<name>``."""


def held_size(part: dict[str, Any]) -> int:
    """What :meth:`~token_relay.core.parts.MessageParts.chars` counts of a part kept as
    an object (a source, a file, a step, a data part, a tool's object): the bytes of the
    JSON (:func:`~token_relay.core.parts.fields.json_size`) of each JSON value
    (:data:`JSON_FIELDS`), the characters of each other string but its type, state and
    ``rawInput``, and those of the name in a ``data-<name>`` or ``tool-<name>`` type.
    Booleans count nothing."""
    size = 0
    for key, value in part.items():
        if key in JSON_FIELDS:
            size += json_size(value)
        elif isinstance(value, str) and key not in _NOT_HELD:
            size += len(value)
    kind = part.get("type")
    if isinstance(kind, str) and kind.startswith(_NAMED):
        size += len(kind.partition("-")[2])
    return size


class TextBuffer:
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
            raise reject(
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


class TextRecord:
    """A ``text`` or ``reasoning`` part."""

    __slots__ = (
        "buffer",
        "chunk_id",
        "citations",
        "counted",
        "index",
        "kind",
        "metadata",
        "open",
        "state",
    )

    def __init__(self, kind: str, chunk_id: str, metadata: Any, index: int) -> None:
        self.index = index
        self.kind = kind
        self.chunk_id = chunk_id
        self.metadata = metadata
        self.citations: Any = ABSENT
        self.state = "streaming"
        self.open = True
        """Whether deltas and the end may still come (not ended, no finish-step since)."""
        self.buffer = TextBuffer()
        self.counted = 0
        """What the message's chars count of this record beside its text: :meth:`count`
        when it last changed."""

    def count(self) -> int:
        """What the part holds beside its text: the characters of its chunk id (none for
        the implicit text part's, which no producer names), and the bytes of the JSON of
        its ``providerMetadata`` and ``citations``."""
        implicit = self.kind == "text" and self.chunk_id == IMPLICIT
        size = 0 if implicit else len(self.chunk_id)
        if self.metadata is not ABSENT:
            size += json_size(self.metadata)
        if self.citations is not ABSENT:
            size += json_size(self.citations)
        return size

    def render(self) -> dict[str, Any]:
        part: dict[str, Any] = {"type": self.kind}
        if self.kind == "reasoning":
            part["id"] = self.chunk_id
        part["text"] = self.buffer.text()
        put(part, "providerMetadata", self.metadata)
        part["state"] = self.state
        put(part, "citations", self.citations)
        return part


class ToolRecord:
    """A ``tool-<name>`` or ``dynamic-tool`` part: ``part`` is ``ai``'s object, but for
    ``input`` and ``rawInput`` while the input streams, which are rendered from the text."""

    __slots__ = (
        "buffer",
        "counted",
        "dynamic",
        "encoding",
        "had_delta",
        "index",
        "input_end",
        "name",
        "open",
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
        self.buffer = TextBuffer()
        self.had_delta = False
        self.open = False
        """Whether input deltas may still come: streaming, in the current step."""
        self.input_end: str | None = None
        """How the input ended: ``tool-input-available`` or ``tool-input-error``."""
        self.counted = 0
        """What the message's chars count of this record beside its input text:
        :meth:`count` when it last changed."""

    @property
    def state(self) -> str:
        return str(self.part["state"])

    def count(self) -> int:
        """What the part holds beside its input text: :func:`held_size` of its object
        (``input`` and ``rawInput`` while the input streams are read from the text)."""
        return held_size(self.part)

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
        return (raw if self.encoding == "text" else partial_json(raw)), raw

    def update(self, state: str, **options: Any) -> None:
        """``updateToolPart`` / ``updateDynamicToolPart`` of ``ai`` on this part; an option
        not given is ``undefined``."""
        part = self.part
        part["state"] = state
        for key in ("input", "output", "errorText", "rawInput", "inputEncoding", "preliminary"):
            put(part, key, options.get(key, ABSENT))
        for key in ("title", "toolMetadata"):
            if options.get(key, ABSENT) is not ABSENT:
                part[key] = options[key]
        executed = fallback(options.get("providerExecuted", ABSENT), part.get("providerExecuted"))
        put(part, "providerExecuted", ABSENT if executed is None else executed)
        metadata = options.get("providerMetadata", ABSENT)
        if metadata is not ABSENT:
            key = "resultProviderMetadata" if state in OUTPUT_STATES else "callProviderMetadata"
            part[key] = metadata

    def render(self) -> dict[str, Any]:
        part = dict(self.part)
        if self.state == "input-streaming" and self.had_delta:
            value, raw = self.streamed_input()
            put(part, "input", value)
            part["rawInput"] = raw
        if "approval" in part:
            part["approval"] = dict(part["approval"])
        return part


Part = TextRecord | ToolRecord | dict[str, Any]
