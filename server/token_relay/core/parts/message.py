"""The message: :class:`MessageParts`, which applies each chunk by its kind, finalizes,
and reads the parts, their text and their catch-up.

A chunk goes to its handler, one method per type, in this module (sources, files, steps,
data) or in the mixin of its kind (``texts``, ``tools``). A plain delta for an open part
takes a shorter way first (:meth:`MessageParts.extend`): it is most of a reply.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from ..assembler import RUN
from .compaction import ToolHistory, compacted
from .fields import ABSENT, Fields, put
from .partialjson import parse_json
from .records import TextRecord, ToolRecord
from .refusals import INVALID_CHUNK, reject
from .texts import TextChunks
from .tools import ToolChunks

MESSAGE_CHUNKS: Final = frozenset({"start", "finish", "abort", "error", "message-metadata"})


class MessageParts(TextChunks, ToolChunks):
    """One message's parts, assembled from AI SDK chunks and top-level deltas."""

    __slots__ = ()

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
            if isinstance(record, TextRecord) and record.kind == "text"
        )

    def chars(self) -> int:
        """What the message holds, the size the relay bounds (``--max-message-chars``) and
        counts (``--max-memory-bytes``): the characters of every string a part keeps (its
        text, a tool's input text, ids, names, urls, titles, media types, filenames, error
        texts) plus the bytes of the compact UTF-8 JSON of every JSON value it keeps (data,
        a tool's input and output, provider and tool metadata, citations, a tool's
        approval). A part's type (but the name in ``tool-<name>`` or ``data-<name>``) and
        state, its booleans, ``rawInput`` (the input text, counted once) and the implicit
        text part's id count nothing. A value replaced counts as it is now: the count
        depends on the parts held, not on how their chunks came. The package's docstring
        lists each field."""
        return self._chars

    def catch_up(self) -> list[dict[str, Any]]:
        """The compacted chunks that rebuild :meth:`parts` after a ``start``; the chunks
        applied after this call then apply on top of them, so no part comes twice. The
        same chunks as :func:`~token_relay.core.parts.chunks_of` makes of the parts, but
        under the chunk ids the producer gave, and with its ``finish-step``\\ s."""
        views: list[dict[str, Any]] = []
        text_ids: list[str | None] = []
        histories: list[ToolHistory | None] = []
        for record in self._parts:
            if isinstance(record, TextRecord):
                view = record.render()
                if record.buffer.held:
                    # Half a surrogate pair waits for its other half, which a live delta
                    # brings: it goes in the one delta, so the two join where it arrives.
                    view["text"] += record.buffer.held
                views.append(view)
                text_ids.append(record.chunk_id)
                histories.append(None)
            elif isinstance(record, ToolRecord):
                # The part as ai holds it, but for the repair of a streaming input, which
                # the catch-up does not carry: its text goes as it came, in one delta.
                views.append(record.part)
                text_ids.append(None)
                text = record.buffer.text() + record.buffer.held if record.had_delta else None
                histories.append((text, record.input_end, record.encoding))
            else:
                views.append(record)
                text_ids.append(None)
                histories.append(None)
        return compacted(views, text_ids, self._finish_marks, histories)

    def step_ends(self) -> list[dict[str, Any]]:
        """End every open text and reasoning part (as ``*-end`` chunks would), and return
        those chunks: what a reader is sent before a ``finish-step`` that would leave them
        ``"streaming"``, so that it holds them ``"done"``, as a completed message does."""
        records = sorted((*self._texts.values(), *self._reasonings.values()), key=_index)
        chunks = [{"type": f"{record.kind}-end", "id": record.chunk_id} for record in records]
        for chunk in chunks:
            self.apply(chunk)
        return chunks

    def finalizing(self) -> list[dict[str, Any]]:
        """Finalize, and return the chunks that take a reader holding this message's chunks
        so far to the parts finalize made: the end of each text or reasoning part still
        open, and each streaming tool input's outcome (``tool-input-available`` with the
        parsed input, or the failure). A reader can't learn more: a part a ``finish-step``
        closed stays ``"streaming"`` there, and half a surrogate pair it holds stays half."""
        open_ids = {(record.kind, record.chunk_id) for record in self._texts.values()}
        open_ids.update((record.kind, record.chunk_id) for record in self._reasonings.values())
        before = self.catch_up()
        self.finalize()
        chunks: list[dict[str, Any]] = []
        index = 0
        for chunk in self.catch_up():
            if index < len(before) and chunk == before[index]:
                index += 1
                continue
            kind = chunk.get("type")
            if kind in ("text-end", "reasoning-end"):
                if (kind.partition("-")[0], chunk.get("id")) in open_ids:
                    chunks.append(chunk)
            elif kind in _OUTCOMES:
                chunks.append(chunk)
        return chunks

    # -- writing

    def apply(self, chunk: Mapping[str, Any]) -> int | None:
        """Apply one UI message chunk of ``ai`` 7. Returns the index of the part it
        created or changed, or ``None`` if it changed none (``finish-step``, a transient
        data part, anything once the message is finalized). Raises
        :class:`~token_relay.core.errors.PartRejected`, having changed nothing."""
        if self._finalized:
            return None
        if self.extend(chunk, _UNBOUNDED) >= 0:
            return self._extended(chunk)
        kind = chunk.get("type") if isinstance(chunk, Mapping) else None
        if not isinstance(kind, str):
            raise reject(INVALID_CHUNK, "a chunk must be an object with a string 'type'")
        handler = _HANDLERS.get(kind)
        if handler is not None:
            return handler(self, Fields(chunk, kind, self.limits))
        if kind.startswith("data-"):
            return self._apply_data(Fields(chunk, kind, self.limits))
        if kind in MESSAGE_CHUNKS:
            raise reject(INVALID_CHUNK, f"'{kind}' is a message-level chunk, not a part")
        raise reject(INVALID_CHUNK, f"unknown chunk type '{kind}'")

    def extend(self, chunk: Mapping[str, Any], budget: int) -> int:
        """The hot path: apply a plain delta (``text-delta``, ``reasoning-delta`` or
        ``tool-input-delta``: ASCII, no ``providerMetadata``) to an open part, if it keeps
        the part within its bound and the message within ``budget`` characters. Returns
        :meth:`chars` after it; -1 if it did nothing, for :meth:`apply` to take the chunk
        the checked way, which also words any refusal. Nothing it does differs from
        :meth:`apply`: it only skips checks the chunk does not need."""
        if type(chunk) is not dict:
            return -1
        kind = chunk.get("type")
        record: TextRecord | ToolRecord | None
        try:
            if kind == "text-delta":
                if "providerMetadata" in chunk:
                    return -1
                record = self._texts.get(chunk.get("id"))  # type: ignore[arg-type]
                delta = chunk.get("delta")
                limit = self.limits.max_part_chars
            elif kind == "tool-input-delta":
                if "delta" in chunk:
                    # The streams size an event by its 'delta' first: the checked way
                    # sizes this one as they do.
                    return -1
                record = self._open_tools.get(chunk.get("toolCallId"))  # type: ignore[arg-type]
                delta = chunk.get("inputTextDelta")
                limit = self.limits.max_tool_input_chars
            elif kind == "reasoning-delta":
                if "providerMetadata" in chunk:
                    return -1
                record = self._reasonings.get(chunk.get("id"))  # type: ignore[arg-type]
                delta = chunk.get("delta")
                limit = self.limits.max_part_chars
            else:
                return -1
        except TypeError:  # an id that is no string, nor hashable: the checked way refuses it
            return -1
        # Only a string equals a string key: a record found was named by a string id.
        if record is None or type(delta) is not str or not delta.isascii():
            return -1
        buffer = record.buffer
        size = len(delta)
        chars = self._chars + size
        if buffer.held or buffer.chars + size > limit or chars > budget:
            return -1
        if size:
            # TextBuffer.commit, inlined: this runs once per delta.
            pieces = buffer.pieces
            pieces.append(delta)
            buffer.chars += size
            if len(pieces) - buffer.joined >= RUN:
                pieces[buffer.joined :] = ["".join(pieces[buffer.joined :])]
                buffer.joined += 1
            self._chars = chars
        if type(record) is ToolRecord:
            record.had_delta = True
        return chars

    def _extended(self, chunk: Mapping[str, Any]) -> int:
        """The index of the part :meth:`extend` just extended with ``chunk``."""
        kind = chunk["type"]
        if kind == "tool-input-delta":
            return self._open_tools[chunk["toolCallId"]].index
        return (self._texts if kind == "text-delta" else self._reasonings)[chunk["id"]].index

    def finalize(self) -> None:
        """Complete the parts (see the module's docstring); idempotent."""
        if self._finalized:
            return
        for record in self._parts:
            if isinstance(record, TextRecord):
                self._chars += record.buffer.flush()
                record.state = "done"
                record.open = False
            elif isinstance(record, ToolRecord) and record.state == "input-streaming":
                self._chars += record.buffer.flush()
                raw = record.buffer.text()
                value = raw if record.encoding == "text" else parse_json(raw)
                if value is ABSENT:
                    self._fail_input(
                        record, "the message ended before this tool call's input was valid JSON"
                    )
                else:
                    record.update("input-available", input=value)
                    self._recount(record)
                    record.input_end = "tool-input-available"
                record.open = False
        self._texts.clear()
        self._reasonings.clear()
        self._open_tools.clear()
        self._finalized = True

    # -- sources, files, steps and data

    def _source_url(self, fields: Fields) -> int:
        part: dict[str, Any] = {"type": "source-url", "sourceId": fields.text("sourceId")}
        part["url"] = fields.text("url")
        put(part, "title", fields.optional_text("title"))
        put(part, "providerMetadata", fields.metadata())
        return self._append(part)

    def _source_document(self, fields: Fields) -> int:
        part: dict[str, Any] = {"type": "source-document", "sourceId": fields.text("sourceId")}
        part["mediaType"] = fields.text("mediaType")
        part["title"] = fields.text("title")
        put(part, "filename", fields.optional_text("filename"))
        put(part, "providerMetadata", fields.metadata())
        return self._append(part)

    def _file(self, fields: Fields) -> int:
        part: dict[str, Any] = {"type": "file", "mediaType": fields.text("mediaType")}
        part["url"] = fields.text("url")
        put(part, "providerMetadata", fields.metadata())
        return self._append(part)

    def _start_step(self, fields: Fields) -> int:
        index = self._append({"type": "step-start"})
        for tool in self._open_tools.values():
            # ai looks a streaming tool up in the current step only: input chunks for it
            # from now on would make a second part, so they are refused.
            self._chars += tool.buffer.flush()
            tool.open = False
        self._open_tools.clear()
        return index

    def _finish_step(self, fields: Fields) -> None:
        if not (self._texts or self._reasonings):
            return None
        for record in (*self._texts.values(), *self._reasonings.values()):
            self._chars += record.buffer.flush()
            record.open = False
        self._texts.clear()
        self._reasonings.clear()
        self._finish_marks.append(len(self._parts))
        return None

    def _apply_data(self, fields: Fields) -> int | None:
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
            # Only its data changes: the count of the part, its data's bytes aside, stays.
            index, old = found
            part = self._parts[index]
            assert isinstance(part, dict)
            part["data"] = chunk["data"]
            self._chars += size - old
        else:
            index = self._append(dict(chunk))
        if key is not None:
            self._data[key] = (index, size)
        return index


def _index(record: TextRecord) -> int:
    return record.index


_OUTCOMES: Final = frozenset({"tool-input-available", "tool-input-error", "tool-output-error"})
"""What finalizing a tool whose input still streams may make of it."""

_UNBOUNDED: Final = sys.maxsize
"""No budget but the parts' own bounds: :meth:`MessageParts.apply` has none."""

_HANDLERS: Final[dict[str, Callable[[MessageParts, Fields], int | None]]] = {
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
