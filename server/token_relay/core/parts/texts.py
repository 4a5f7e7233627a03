"""Text and reasoning parts: their chunks, and the implicit text part that top-level deltas
extend.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from .fields import ABSENT, Fields, fallback
from .records import IMPLICIT as IMPLICIT
from .records import TextBuffer, TextRecord
from .refusals import PART_ENDED, PART_EXISTS, UNKNOWN_PART, reject
from .state import PartsState


class TextChunks(PartsState):
    """The text and reasoning chunks of :class:`~token_relay.core.parts.MessageParts`, and
    its top-level deltas."""

    __slots__ = ()

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
            raise reject(PART_ENDED, "the message's text part has ended", IMPLICIT)
        self._room()
        probe = TextBuffer()
        appended, held = probe.prepare(text, self.limits.max_part_chars, "text", IMPLICIT)
        index = self._open_text("text", IMPLICIT, ABSENT)
        self._chars += self._texts[IMPLICIT].buffer.commit(appended, held)
        return index

    def opens_implicit(self) -> bool:
        """Whether a top-level delta would open the implicit text part now (none is open)."""
        return IMPLICIT not in self._texts

    def _open_text(self, kind: str, chunk_id: str, metadata: Any) -> int:
        record = TextRecord(kind, chunk_id, metadata, len(self._parts))
        (self._texts if kind == "text" else self._reasonings)[chunk_id] = record
        self._text_ids.add((kind, chunk_id))
        self._parts.append(record)
        self._recount(record)
        return len(self._parts) - 1

    def _extend(self, record: TextRecord, delta: str, metadata: Any = ABSENT) -> None:
        limit = self.limits.max_part_chars
        appended, held = record.buffer.prepare(delta, limit, record.kind, record.chunk_id)
        self._chars += record.buffer.commit(appended, held)
        if metadata is not ABSENT:
            record.metadata = metadata
            self._recount(record)

    def _open_record(self, fields: Fields, kind: str) -> TextRecord:
        chunk_id = fields.text("id")
        record = (self._texts if kind == "text" else self._reasonings).get(chunk_id)
        if record is None:
            code = PART_ENDED if (kind, chunk_id) in self._text_ids else UNKNOWN_PART
            raise reject(code, f"no open {kind} part '{chunk_id}'", chunk_id)
        return record

    def _start_text(self, fields: Fields) -> int:
        kind = fields.kind.partition("-")[0]
        chunk_id = fields.text("id")
        metadata = fields.metadata()
        if chunk_id in (self._texts if kind == "text" else self._reasonings):
            raise reject(PART_EXISTS, f"{kind} part '{chunk_id}' is already open", chunk_id)
        self._room()
        return self._open_text(kind, chunk_id, metadata)

    def _text_delta(self, fields: Fields) -> int:
        record = self._open_record(fields, fields.kind.partition("-")[0])
        self._extend(record, fields.text("delta"), fields.metadata())
        return record.index

    def _end_text(self, fields: Fields) -> int:
        record = self._open_record(fields, fields.kind.partition("-")[0])
        metadata = fields.metadata()
        citations = ABSENT if fields.kind == "reasoning-end" else fields.citations()
        self._chars += record.buffer.flush()
        record.metadata = fallback(metadata, record.metadata)
        if citations is not ABSENT:
            record.citations = citations
        record.state = "done"
        record.open = False
        self._recount(record)
        del (self._texts if record.kind == "text" else self._reasonings)[record.chunk_id]
        return record.index
