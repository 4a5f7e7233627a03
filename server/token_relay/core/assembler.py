"""Assemble streamed text deltas into completed messages.

Theory of operation
-------------------
A message is identified by a string id. Its state lives in one of two maps:

* ``_parts``: messages still streaming, as a list of delta strings. Appending is
  amortized O(1). Every :data:`RUN` deltas are joined into one string (each character
  is copied once more, never again), so a long message costs about a byte a character
  rather than a string object per delta; the rest is joined when it is finalized.
* ``_completed``: finalized messages, as the joined text. The text is joined
  exactly once, at finalize, and cached; the parts list is released then.

The rules are those of the streaming token assembler spec, word for word:
every event creates its message (text ``""``), empty deltas are kept, deltas
for a finalized id are ignored, finalizing is idempotent, and finalizing an
unseen id returns ``""``. Repeated non-final events append again: only a
sequence number could tell a duplicate delivery from a real repeat.

This module is pure: no I/O, no asyncio.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from .errors import UsageError

__all__ = ["RUN", "TokenAssembler"]

RUN = 64
"""Deltas of a streaming message joined into one string at a time."""


class _Parts(list[str]):
    """A streaming message's text: ``joined`` runs of deltas, then the deltas since."""

    __slots__ = ("joined",)
    joined: int


class TokenAssembler:
    """Assemble interleaved streams of deltas into completed message texts."""

    __slots__ = ("_completed", "_parts")

    def __init__(self) -> None:
        self._parts: dict[str, _Parts] = {}
        self._completed: dict[str, str] = {}

    def apply(self, event: Mapping[str, object]) -> str | None:
        """Apply one event ``{"id", "delta"?, "final"?}``.

        Returns the completed text when ``final`` is true (every time, since
        finalizing is idempotent), and ``None`` otherwise.
        """
        message_id = event["id"]
        if not isinstance(message_id, str):
            raise UsageError("event id must be a string")
        delta = event.get("delta")
        if delta is not None and not isinstance(delta, str):
            raise UsageError("event delta must be a string when present")
        return self.feed(message_id, delta, bool(event.get("final", False)))

    def feed(self, message_id: str, delta: str | None, final: bool = False) -> str | None:
        """Typed form of :meth:`apply`: ``delta=None`` means the key was absent."""
        completed = self._completed.get(message_id)
        if completed is not None:
            return completed if final else None
        parts = self._parts.get(message_id)
        if parts is None:
            parts = self._parts[message_id] = _Parts()
            parts.joined = 0
        if delta is not None:
            parts.append(delta)
            joined = parts.joined
            if len(parts) - joined >= RUN:
                parts[joined:] = ["".join(parts[joined:])]
                parts.joined = joined + 1
        if not final:
            return None
        text = "".join(parts)
        del self._parts[message_id]
        self._completed[message_id] = text
        return text

    def append(self, message_id: str, delta: str) -> bool:
        """The hot path of :meth:`feed` for a non-final delta: append it to a streaming
        message, as ``feed(message_id, delta)`` does; False, changing nothing, if the
        message is not streaming (then :meth:`feed` decides)."""
        parts = self._parts.get(message_id)
        if parts is None:
            return False
        parts.append(delta)
        joined = parts.joined
        if len(parts) - joined >= RUN:
            parts[joined:] = ["".join(parts[joined:])]
            parts.joined = joined + 1
        return True

    def extend(self, message_id: str, deltas: Sequence[str]) -> bool:
        """:meth:`append` for several deltas at once: the same text as appending each in
        turn; False, changing nothing, if the message is not streaming."""
        parts = self._parts.get(message_id)
        if parts is None:
            return False
        joined = parts.joined
        if len(parts) + len(deltas) - joined < RUN:
            parts.extend(deltas)
        else:  # a run's worth: joined into one string, as append joins them
            parts[joined:] = ["".join((*parts[joined:], *deltas))]
            parts.joined = joined + 1
        return True

    def get(self, message_id: str) -> str | None:
        """Current text of a message: cached if completed, joined if streaming, else None."""
        completed = self._completed.get(message_id)
        if completed is not None:
            return completed
        parts = self._parts.get(message_id)
        return None if parts is None else "".join(parts)

    def has_deltas(self, message_id: str) -> bool:
        """Whether a streaming message was fed a delta, an empty one included."""
        return bool(self._parts.get(message_id))

    def is_completed(self, message_id: str) -> bool:
        """Whether ``message_id`` has been finalized (and not forgotten)."""
        return message_id in self._completed

    def is_streaming(self, message_id: str) -> bool:
        """Whether ``message_id`` has state and is not yet finalized."""
        return message_id in self._parts

    def streaming_ids(self) -> Iterator[str]:
        """Ids of messages that have state and are not finalized, oldest first."""
        return iter(self._parts)

    def discard(self, message_id: str) -> str | None:
        """Drop an unfinished message and return its partial text (None if not streaming)."""
        parts = self._parts.pop(message_id, None)
        return None if parts is None else "".join(parts)

    def forget(self, message_id: str) -> None:
        """Release a completed message's cached text. Later events for it start afresh."""
        self._completed.pop(message_id, None)

    @property
    def streaming_count(self) -> int:
        """Number of unfinished messages."""
        return len(self._parts)

    @property
    def completed_count(self) -> int:
        """Number of finalized messages still remembered."""
        return len(self._completed)
