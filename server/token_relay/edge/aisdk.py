"""The Vercel AI SDK's UI message stream, version 1: ``GET /ai-sdk/{channel}/stream``.

This is the resume endpoint of ``useChat({resume: true})`` and of
``DefaultChatTransport``, whose GET is ``${api}/${chatId}/stream``: the chat id is the
channel. The stream joins the channel as a deltas subscriber, with the same exactly-once
join as every other subscriber, and then serves one message:

* **204** when there is no message to serve (``?wait=S``, at most 30 s, first waits that
  long for one to start);
* otherwise the headers of the UI message stream and, for the newest message in progress
  (or the one ``?id=`` names): ``start`` with ``messageId`` set to the relay's id,
  ``text-start``, one ``text-delta`` holding the text so far, the live ``text-delta``\\ s,
  then ``text-end``, ``finish`` and ``data: [DONE]``. An aborted message ends with
  ``abort`` and its reason, then ``[DONE]``.

A message's ``meta`` is the stream's ``messageMetadata``, on ``finish`` (and on ``start``,
for a structured message), but for two keys, as the AI SDK's producer route
(:mod:`token_relay.edge.aisdkproduce`) keeps them: ``finishReason`` is ``finish``'s own
``finishReason``, and a message aborted for an ``error`` (reason ``error``) ends with
``{"type": "error", "errorText": ...}`` (its ``meta``'s ``errorText``) rather than
``abort``.

A reply that completed before the stream was asked for is served too, whole, from the
channel's history (the join's rewind): the one ``?id=`` names, as long as history holds it;
without ``?id=`` (nor ``?wait=``, which waits for a new one), the channel's newest reply, if
it completed at most ``--ai-sdk-replay-window`` seconds ago and nothing is in progress.

A structured message (its ``message`` or ``aborted`` frame carries ``parts``) is delivered
whole, so it is served once it ends, on the same three occasions (completed before, by
``?id=`` or within the replay window; completed while the stream waits): ``start`` (with
its ``meta`` as ``messageMetadata``), the chunks that rebuild exactly its ``parts``
(:func:`~token_relay.core.parts.chunks_of`), then ``finish``, or ``abort`` and its reason.
One that turned structured while its text was being served goes on in the text part
already sent, which is its implicit text part, the first.

A resume replays from ``start`` under the same ``messageId``, so it replaces the client's
partial message and never duplicates it. ``POST /ai-sdk/{channel}/stop`` is Stop (see
:mod:`token_relay.edge.relay`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11

from ..core.grants import Grant
from ..core.parts import chunks_of
from . import routes
from .broadcast import Fields
from .sse import SSE_HEADERS, SseStream
from .statuses import JOIN_CODES, status_of

__all__ = ["AI_SDK_HEADERS", "AiSdkStream"]

AI_SDK_HEADERS = (
    *SSE_HEADERS,
    ("Connection", "keep-alive"),
    ("x-vercel-ai-ui-message-stream", "v1"),
)
TEXT_PART = "text-1"
"""The id of the one text part of a message."""
FINISH_REASON = "finishReason"
"""The key of a message's ``meta`` that ``finish`` carries as its ``finishReason``."""
ERROR_TEXT = "errorText"
"""The key of the ``meta`` of a message aborted for an ``error`` that holds its text."""


def _metadata(frame: dict[str, Any]) -> dict[str, Any] | None:
    """A message's ``meta`` as the stream's ``messageMetadata``: without ``finishReason``
    (``finish`` carries it) and, for a message aborted for an error, ``errorText`` (its
    ``error`` chunk does); None if the message has none."""
    meta = frame.get("meta")
    if not isinstance(meta, dict):
        return None
    lifted = {FINISH_REASON}
    if frame.get("type") == "aborted" and frame.get("reason") == "error":
        lifted.add(ERROR_TEXT)
    if lifted.isdisjoint(meta):
        return meta
    rest = {key: value for key, value in meta.items() if key not in lifted}
    return rest or None


class AiSdkStream(SseStream):
    """One UI message stream: one message of a channel, as the AI SDK's parts."""

    def __init__(
        self,
        transport: asyncio.Transport,
        http: h11.Connection,
        route: routes.AiSdkStream,
        *,
        path: str,
        client: str,
        grant: Grant,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(
            transport, http, path=path, client=client, grant=grant, positions={}, headers=headers
        )
        self.channel = route.channel
        """The chat id, which is the channel."""
        self.wanted = route.wanted
        self.wait = route.wait

    def start(self) -> None:
        """Nothing is sent until the join says whether there is a message to serve."""
        self.target: str | None = None
        self.joined = False
        self.done = False
        self.replay_window: float | None = None
        """Without ``?id=``: how recent a completed reply must be to be served."""
        self._snapshots: dict[str, str] = {}
        self._sent = 0
        """Characters of text sent so far in the text part, for a message that turns
        structured."""
        self._completed: dict[str, Any] | None = None
        """The reply that completed before the join was done (the one wanted, or the newest)."""
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ frames in

    def write_event(self, data: bytes, fields: Fields | None = None) -> Fields | None:
        """Turn one frame of the channel into parts, for the message being served."""
        if self.done:
            return fields
        frame: dict[str, Any] = json.loads(data)
        kind, message_id = frame.get("type"), frame.get("id")
        if kind == "error" and not self.head_sent:
            self._refuse(frame)
        elif not self.joined:
            if kind == "snapshot":
                self._snapshots[str(message_id)] = str(frame["text"])
            elif kind in ("message", "aborted") and self.wanted in (None, message_id):
                self._snapshots.pop(str(message_id), None)
                self._completed = frame
        elif self.target is None:
            wanted = self.wanted in (None, message_id)
            if kind in ("message", "aborted") and "parts" in frame and wanted:
                # A structured message is delivered whole, and sends nothing before: all
                # of it comes now, aborted or not.
                self._serve_structured(frame)
            elif kind in ("delta", "message") and wanted:
                # A message that started after the join: all of it is still to come (a
                # one-shot one comes whole, as its message frame).
                self._serve(str(message_id), str(frame["text"]) if kind == "message" else "")
                self._part(frame)
        elif message_id == self.target:
            self._part(frame)
        return fields

    async def __anext__(self) -> str | bytes:
        """Called once the join is done: decide, then wait until the stream ends."""
        if not self.joined:
            self._decide()
        return await super().__anext__()

    def _decide(self) -> None:
        self.joined = True
        snapshots, self._snapshots = self._snapshots, {}
        completed, self._completed = self._completed, None
        if self.done:
            return
        if self.wanted is not None and self.wanted in snapshots:
            self._serve(self.wanted, snapshots[self.wanted])
        elif self.wanted is None and snapshots:
            newest = list(snapshots)[-1]
            self._serve(newest, snapshots[newest])
        elif completed is not None and "parts" in completed:
            self._serve_structured(completed)
        elif completed is not None:
            # Whole at once: its text, then its end (finish, or abort).
            self._serve(str(completed["id"]), str(completed["text"]))
            self._part(completed)
        elif self.wait > 0:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.wait, self._nothing)
        else:
            self._nothing()

    def _nothing(self) -> None:
        """No message to serve: 204, and the end."""
        if self.target is None and not self.done:
            self.done = True
            self.start_close(1000, "no message in progress")

    def _refuse(self, frame: dict[str, Any]) -> None:
        """The join itself was refused (a channel the token does not grant, Redis down)."""
        self.done = True
        status = status_of(str(frame.get("code")), JOIN_CODES)
        body = json.dumps(frame).encode()
        self._head(status, (("Content-Type", "application/json"), ("Server", "token-relay")))
        self._write(body)
        self.start_close(1000, "refused")

    # ------------------------------------------------------------------ parts out

    def _serve(self, message_id: str, text: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.target = message_id
        self._head(200, AI_SDK_HEADERS)
        self._emit({"type": "start", "messageId": message_id})
        self._emit({"type": "text-start", "id": TEXT_PART})
        if text:
            self._sent += len(text)
            self._emit({"type": "text-delta", "id": TEXT_PART, "delta": text})

    def _serve_structured(self, frame: dict[str, Any]) -> None:
        """A structured message, whole: ``start`` (with the message's ``meta`` as its
        ``messageMetadata``), the chunks that rebuild its ``parts``, and its end."""
        if self._timer is not None:
            self._timer.cancel()
        self.target = str(frame["id"])
        self._head(200, AI_SDK_HEADERS)
        start: dict[str, Any] = {"type": "start", "messageId": self.target}
        metadata = _metadata(frame)
        if metadata is not None:
            start["messageMetadata"] = metadata
        self._emit(start)
        for chunk in chunks_of(frame["parts"]):
            self._emit(chunk)
        self._finish(frame)

    def _turned_structured(self, frame: dict[str, Any]) -> None:
        """The message being served as text ends with parts: it turned structured after the
        text sent so far, which is the start of its first part (its implicit text part).
        That part goes on under the id it was sent with, and the others follow it."""
        chunks = chunks_of(frame["parts"])
        first = chunks[0] if chunks else {}
        if first.get("type") == "text-start" and first.get("id") == TEXT_PART:
            # chunks_of names the first text part TEXT_PART: it is the one already started.
            chunks = chunks[1:]
            if chunks and chunks[0].get("type") == "text-delta" and chunks[0]["id"] == TEXT_PART:
                rest = str(chunks[0]["delta"])[self._sent :]
                chunks = ([{**chunks[0], "delta": rest}] if rest else []) + chunks[1:]
        else:
            # Nothing of it was text before the chunks (a snapshot of ""): end the part.
            self._emit({"type": "text-end", "id": TEXT_PART})
        for chunk in chunks:
            self._emit(chunk)
        self._finish(frame)

    def _finish(self, frame: dict[str, Any]) -> None:
        """The message's end: ``finish`` (with its ``finishReason`` and ``messageMetadata``),
        ``error`` (aborted for the error its producer reported) or ``abort``."""
        meta = frame.get("meta") or {}
        if frame.get("type") == "aborted" and frame.get("reason") == "error":
            error_text = meta.get(ERROR_TEXT)
            error_text = error_text if isinstance(error_text, str) else "error"
            self._emit({"type": "error", "errorText": error_text})
        elif frame.get("type") == "aborted":
            self._emit({"type": "abort", "reason": frame.get("reason", "")})
        else:
            finish: dict[str, Any] = {"type": "finish"}
            reason = meta.get(FINISH_REASON)
            if isinstance(reason, str):
                finish[FINISH_REASON] = reason
            metadata = _metadata(frame)
            if metadata is not None:
                finish["messageMetadata"] = metadata
            self._emit(finish)
        self._end()

    def _part(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "delta":
            self._sent += len(frame["delta"])
            self._emit({"type": "text-delta", "id": TEXT_PART, "delta": frame["delta"]})
        elif "parts" in frame and kind in ("message", "aborted"):
            self._turned_structured(frame)
        elif kind == "message":
            self._emit({"type": "text-end", "id": TEXT_PART})
            self._finish(frame)
        elif kind == "aborted":
            self._finish(frame)

    def _emit(self, part: dict[str, Any]) -> None:
        if self.open:
            line = json.dumps(part, ensure_ascii=False, separators=(",", ":"))
            self._write(b"data: " + line.encode() + b"\n\n")

    def _end(self) -> None:
        if self.open:
            self._write(b"data: [DONE]\n\n")
        self.done = True
        self.start_close(1000, "done")
