"""One reply of a channel as the AI SDK's UI message chunks, for every surface that serves one.

Theory of operation
-------------------
A :class:`ReplyChunks` is fed the frames a deltas subscriber of the channel gets (as
dicts: ``snapshot``, ``delta``, ``chunks``, ``message``, ``aborted``), first those of its
join, then the live ones, and hands out, through ``emit``, the ``UIMessageChunk``\\ s of
one reply: ``start`` (``messageId``, the relay's id), the reply so far compacted, the
reply live, and its end. The SSE stream of ``GET /ai-sdk/{channel}/stream`` and the
WebSocket chat transport of ``/ai-sdk/ws`` both serve replies with it; each frames the
chunks its own way (``data:`` lines, or ``chunk`` frames with a ``sequence``).

* While the join runs (:meth:`ReplyChunks.frame` before :meth:`ReplyChunks.decide`), the
  snapshots of messages in progress and the reply that completed before the join are
  kept; :meth:`~ReplyChunks.decide` then serves the one wanted (the newest in progress,
  else the completed one) and says whether there was one.
* A plain message's text is its implicit text part, chunk id ``text``: ``text-start``,
  one ``text-delta`` holding the text so far, then the live ``text-delta`` chunks. A
  structured one's reply so far is its snapshot's compacted chunks, then its live
  ``chunks`` as they come (a ``finish-step`` preceded by the end of each text and
  reasoning part it would leave open, which a completed message holds ``done``).
* The end is ``text-end`` (a plain message) or the chunks that finalizing made of its
  parts, then ``finish`` (with ``finishReason`` if its ``meta`` names one of ``ai`` 7's,
  and ``meta`` as ``messageMetadata``); an aborted message ends with ``abort`` and its
  reason, one aborted for an ``error`` its producer reported with ``error`` and its text.
* A reply that completed before the join is served whole: ``start`` (with its ``meta``),
  the chunks that rebuild exactly its ``parts`` (:func:`~token_relay.core.parts.chunks_of`),
  then its end.

Every chunk sent also builds a mirror of what the reader holds, so that the end sends
only what the reader lacks. A reader that already holds part of the reply (a WebSocket
transport's ``resume`` with ``lastSequence``) hands its state in as ``held``: then
nothing is sent again, neither ``start`` nor what it holds, and the catch-up is only what
changed since (:func:`catch_up_from`: the rest of each text, the parts and ends it lacks).

This module is pure: no I/O, no asyncio, no clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from .errors import ErrorCode, FrameRejected, PartRejected
from .parts import IMPLICIT, MessageParts, chunks_of

__all__ = ["ERROR_TEXT", "FINISH_REASONS", "ReplyChunks", "catch_up_from", "reader_state"]

FINISH_REASONS: Final = frozenset(
    {"stop", "length", "content-filter", "tool-calls", "error", "interrupted", "other"}
)
"""The ``finishReason`` values of ``ai`` 7's ``finish`` chunk: a message's ``meta`` naming one
has it on its ``finish``."""
ERROR_TEXT: Final = "errorText"
"""The key of the ``meta`` of a message aborted for an ``error`` (reason ``error``) that
holds its text."""

_DELTA_FIELDS: Final = {
    "text-delta": "delta",
    "reasoning-delta": "delta",
    "tool-input-delta": "inputTextDelta",
}
"""The compacted chunks that hold a part's text so far, and the field that holds it."""

Emit = Callable[[dict[str, Any]], None]


class ReplyChunks:
    """One reply of a channel, served as UI message chunks through ``emit``.

    ``wanted`` names the reply (None: the newest). ``on_serve(message_id)`` is called when
    a reply is chosen, before its first chunk; ``on_end()`` after its last.
    """

    def __init__(
        self,
        wanted: str | None,
        emit: Emit,
        *,
        on_serve: Callable[[str], None] | None = None,
        on_end: Callable[[], None] | None = None,
        held: MessageParts | None = None,
    ) -> None:
        self.wanted = wanted
        self.target: str | None = None
        """The id of the reply being served, once chosen."""
        self.joined = False
        self.done = False
        self._emit = emit
        self._on_serve = on_serve
        self._on_end = on_end
        self._held = held is not None
        self._mirror = held if held is not None else MessageParts()
        """What the reader holds of the reply being served, as the chunks sent build it."""
        self._snapshots: dict[str, dict[str, Any]] = {}
        self._completed: dict[str, Any] | None = None
        """The reply that completed before the join was done (the one wanted, or the newest)."""
        self._pending: list[Mapping[str, Any]] = []
        """Live frames that followed the join's cut before the join was done, in order: they
        apply once it is (bounded by the router's join buffer)."""

    def frame(self, frame: Mapping[str, Any]) -> None:
        """One frame of the channel, as a deltas subscriber gets it."""
        if self.done:
            return
        kind, message_id = frame.get("type"), frame.get("id")
        if not self.joined:
            if kind == "snapshot":
                self._snapshots[str(message_id)] = dict(frame)
            elif kind in ("message", "aborted") and self.wanted in (None, message_id):
                self._snapshots.pop(str(message_id), None)
                self._completed = dict(frame)
                self._pending = [f for f in self._pending if f.get("id") != message_id]
            elif kind in ("delta", "chunks"):
                self._pending.append(frame)
        elif self.target is None:
            wanted = self.wanted in (None, message_id)
            if kind in ("message", "aborted") and wanted:
                # A message that ended before anything of it reached this reader (one that
                # opened and ended in one event, or sent no text before it ended): whole.
                self._serve_whole(frame)
            elif kind in ("delta", "chunks") and wanted:
                # A message that started after the join: all of it is still to come.
                self._serve(str(message_id), None)
                self._part(frame)
        elif message_id == self.target:
            self._part(frame)

    def decide(self) -> bool:
        """The join is done: serve what it found. False if there is nothing to serve yet
        (a reply that starts later is served as it comes)."""
        self.joined = True
        snapshots, self._snapshots = self._snapshots, {}
        completed, self._completed = self._completed, None
        pending, self._pending = self._pending, []
        if self.done:
            return True
        served = self._choose(snapshots, completed)
        for frame in pending:  # what followed the cut, on top of what was chosen
            self.frame(frame)
        return served or self.target is not None

    def _choose(
        self, snapshots: dict[str, dict[str, Any]], completed: dict[str, Any] | None
    ) -> bool:
        """Serve what the join found; False if it found nothing."""
        if self.wanted is not None and self.wanted in snapshots:
            self._serve(self.wanted, snapshots[self.wanted])
        elif self.wanted is None and snapshots:
            newest = list(snapshots)[-1]
            self._serve(newest, snapshots[newest])
        elif completed is not None and "parts" not in completed and self._held:
            # A plain one whose reader holds its start: the rest of its text, its end.
            self._serve(str(completed["id"]), {"text": completed["text"]})
            self._part(completed)
        elif completed is not None:
            self._serve_whole(completed)
        else:
            return False
        return True

    def _serve_whole(self, frame: Mapping[str, Any]) -> None:
        """A message that ended, at once: a structured one's chunks, or a plain one's text,
        then its end (finish, or abort)."""
        if "parts" in frame:
            self._serve_structured(frame)
            return
        self._serve(str(frame["id"]), None)
        if frame["text"]:
            self._part({"type": "delta", "delta": frame["text"]})
        self._part(frame)

    def stop(self) -> None:
        """Serve nothing more."""
        self.done = True

    # ------------------------------------------------------------------ parts out

    def _chosen(self, message_id: str) -> None:
        self.target = message_id
        if self._on_serve is not None:
            self._on_serve(message_id)

    def _serve(self, message_id: str, snapshot: Mapping[str, Any] | None) -> None:
        """Start serving a message in progress: ``start``, then what its ``snapshot`` holds
        (a structured one's compacted chunks; a plain one's text, its implicit text part)."""
        self._chosen(message_id)
        if self._held:
            now: list[dict[str, Any]] = []
            if snapshot is not None and "chunks" in snapshot:
                now = list(snapshot["chunks"])
            elif snapshot is not None and snapshot["text"]:
                now = _plain(snapshot["text"])
            self._catch_up(now)
            return
        self._emit({"type": "start", "messageId": message_id})
        if snapshot is None:
            return
        if "chunks" in snapshot:
            self._part({"type": "chunks", "chunks": snapshot["chunks"]})
        elif snapshot["text"]:
            self._part({"type": "delta", "delta": snapshot["text"]})

    def _serve_structured(self, frame: Mapping[str, Any]) -> None:
        """A structured message, whole: ``start`` (with the message's ``meta`` as its
        ``messageMetadata``), the chunks that rebuild its ``parts``, and its end."""
        self._chosen(str(frame["id"]))
        if self._held:
            self._catch_up(chunks_of(frame["parts"]), by_order=True)
            self._finish(frame)
            return
        start: dict[str, Any] = {"type": "start", "messageId": self.target}
        if "meta" in frame:
            start["messageMetadata"] = frame["meta"]
        self._emit(start)
        for chunk in chunks_of(frame["parts"]):
            self._emit(chunk)
        self._finish(frame)

    def _catch_up(self, now: Sequence[Mapping[str, Any]], *, by_order: bool = False) -> None:
        """A reader that holds part of the reply: only what it lacks of ``now``."""
        for chunk in catch_up_from(self._mirror.catch_up(), now, by_order=by_order):
            with contextlib.suppress(PartRejected):
                self._mirror.apply(chunk)
            self._emit(chunk)

    def _finish(self, frame: Mapping[str, Any]) -> None:
        """The message's end: ``finish`` (with its ``finishReason`` and ``messageMetadata``),
        ``error`` (aborted for the error its producer reported) or ``abort``."""
        if frame.get("type") == "aborted" and frame.get("reason") == "error":
            error_text = (frame.get("meta") or {}).get(ERROR_TEXT)
            error_text = error_text if isinstance(error_text, str) else "error"
            self._emit({"type": "error", "errorText": error_text})
        elif frame.get("type") == "aborted":
            self._emit({"type": "abort", "reason": frame.get("reason", "")})
        else:
            finish: dict[str, Any] = {"type": "finish"}
            meta = frame.get("meta")
            if isinstance(meta, dict) and meta.get("finishReason") in FINISH_REASONS:
                finish["finishReason"] = meta["finishReason"]
            if meta is not None:
                finish["messageMetadata"] = meta
            self._emit(finish)
        self.done = True
        if self._on_end is not None:
            self._on_end()

    def _part(self, frame: Mapping[str, Any]) -> None:
        """One frame of the message being served, as the chunks it amounts to."""
        kind = frame.get("type")
        mirror = self._mirror
        if kind == "delta":
            if mirror.opens_implicit():
                self._emit({"type": "text-start", "id": IMPLICIT})
            mirror.delta(frame["delta"])
            self._emit({"type": "text-delta", "id": IMPLICIT, "delta": frame["delta"]})
        elif kind == "chunks":
            for chunk in frame["chunks"]:
                if chunk.get("type") == "finish-step":
                    # The step's open text and reasoning parts are done once the message
                    # is; a reader of ai 5 or 6 can't be told later, so it is told now.
                    for end in mirror.step_ends():
                        self._emit(end)
                with contextlib.suppress(PartRejected):  # the relay's parts took it
                    mirror.apply(chunk)
                self._emit(chunk)
        elif kind == "message" and "parts" not in frame:
            if mirror.opens_implicit():  # a plain message of no text at all
                self._emit({"type": "text-start", "id": IMPLICIT})
            self._emit({"type": "text-end", "id": IMPLICIT})
            self._finish(frame)
        elif kind == "message":
            for chunk in mirror.finalizing():
                self._emit(chunk)
            self._finish(frame)
        elif kind == "aborted":
            self._finish(frame)


def reader_state(chunks: Sequence[Mapping[str, Any]]) -> MessageParts:
    """What a reader holds after ``chunks`` (a reply's chunks from its ``start``, as
    served): the message-level chunks (``start``, ``finish``...) change no part."""
    state = MessageParts()
    for chunk in chunks:
        with contextlib.suppress(PartRejected):
            state.apply(chunk)
    return state


def catch_up_from(
    held: Sequence[Mapping[str, Any]],
    now: Sequence[Mapping[str, Any]],
    *,
    by_order: bool = False,
) -> list[dict[str, Any]]:
    """The chunks that take a reader holding ``held`` to ``now``, both compacted catch-ups
    of one reply (``held`` the older): a chunk it holds is not sent again, a text it holds
    the start of gets only the rest, and what it lacks comes in order.

    ``by_order`` matches text and reasoning parts by their order rather than their chunk
    id (``now`` made by :func:`~token_relay.core.parts.chunks_of`, which names them anew):
    each is sent under the id the reader knows it by. Raises :class:`FrameRejected`
    (``unknown_sequence``) if ``held`` is not a beginning of ``now`` (a reader of another
    reply).
    """
    if by_order:
        now = _renamed(held, now)
    sent: list[dict[str, Any]] = []
    index = 0
    for chunk in now:
        mine = held[index] if index < len(held) else None
        if mine is not None and mine == chunk:
            index += 1
            continue
        field = _DELTA_FIELDS.get(str(chunk.get("type")))
        if mine is not None and field is not None and _same_part(mine, chunk):
            have, want = str(mine.get(field, "")), str(chunk.get(field, ""))
            if not want.startswith(have):
                raise _mismatch("the reader's text is not a beginning of the reply's")
            index += 1
            if want != have:
                sent.append({**chunk, field: want[len(have) :]})
            continue
        sent.append(dict(chunk))
    if index != len(held):
        raise _mismatch("the reader holds chunks the reply does not have")
    return sent


def _mismatch(reason: str) -> FrameRejected:
    return FrameRejected(ErrorCode.UNKNOWN_SEQUENCE, f"{reason}: resume without lastSequence")


def _same_part(mine: Mapping[str, Any], chunk: Mapping[str, Any]) -> bool:
    return (
        mine.get("type") == chunk.get("type")
        and mine.get("id") == chunk.get("id")
        and mine.get("toolCallId") == chunk.get("toolCallId")
    )


def _renamed(
    held: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``now`` with its text and reasoning parts under the ids ``held`` gives them, in
    order of their starts."""
    names: dict[str, list[str]] = {"text": [], "reasoning": []}
    for chunk in held:
        kind = str(chunk.get("type"))
        if kind in ("text-start", "reasoning-start"):
            names[kind.partition("-")[0]].append(str(chunk.get("id")))
    seen: dict[str, int] = {"text": 0, "reasoning": 0}
    mapping: dict[tuple[str, str], str] = {}
    renamed: list[dict[str, Any]] = []
    for chunk in now:
        kind, _, stage = str(chunk.get("type")).partition("-")
        copy = dict(chunk)
        if kind in names and stage in ("start", "delta", "end"):
            key = (kind, str(chunk.get("id")))
            if stage == "start":
                order = seen[kind]
                seen[kind] += 1
                if order < len(names[kind]):
                    mapping[key] = names[kind][order]
            copy["id"] = mapping.get(key, copy["id"])
        renamed.append(copy)
    return renamed


def _plain(text: str) -> list[dict[str, Any]]:
    """A plain message's text so far, as the compacted chunks of its implicit part."""
    return [
        {"type": "text-start", "id": IMPLICIT},
        {"type": "text-delta", "id": IMPLICIT, "delta": text},
    ]
