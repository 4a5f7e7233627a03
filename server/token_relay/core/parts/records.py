"""The records behind the parts (a part's text so far, text and reasoning parts, tool
calls): each renders its part as ``ai`` holds it.

A record changes only through the message (:class:`~token_relay.core.parts.MessageParts`),
which checks each chunk first; a record renders a new dict each time it is read.
"""

from __future__ import annotations

from typing import Any, Final

from ..assembler import RUN
from ..surrogates import REPLACEMENT, mend
from .fields import ABSENT, fallback, put
from .partialjson import partial_json
from .refusals import PART_TOO_LARGE, reject

OUTPUT_STATES: Final = frozenset({"output-available", "output-error"})
TERMINAL: Final = frozenset({"output-error", "output-denied"})


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
        self.buffer = TextBuffer()

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
        self.buffer = TextBuffer()
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
