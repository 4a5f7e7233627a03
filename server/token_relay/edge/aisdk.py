"""The Vercel AI SDK's UI message stream, version 1: ``GET /ai-sdk/{channel}/stream``.

This is the resume endpoint of ``useChat({resume: true})`` and of
``DefaultChatTransport``, whose GET is ``${api}/${chatId}/stream``: the chat id is the
channel. The stream joins the channel as a deltas subscriber, with the same exactly-once
join as every other subscriber, and then serves one message:

* **204** when there is no message to serve (``?wait=S``, at most 30 s, first waits that
  long for one to start);
* otherwise the headers of the UI message stream and, for the newest message in progress
  (or the one ``?id=`` names): ``start`` with ``messageId`` set to the relay's id, the
  reply so far, then the reply live, then its end and ``data: [DONE]``. A plain message's
  text is its implicit text part, chunk id ``text``: ``text-start`` (with its first text),
  one ``text-delta`` holding the text so far, then the live ``text-delta`` chunks. A structured
  one's reply so far is its snapshot's compacted chunks, then its live ``chunks`` as they
  come (a ``finish-step`` preceded by the end of each text and reasoning part it would
  leave open, which a completed message holds ``done``: a reader of ``ai`` 5 or 6 can't be
  told so later). The end is ``text-end`` (a plain message) or the chunks that finalizing
  made of its parts (the end of each open part, each streaming tool input's outcome), then
  ``finish`` (with ``finishReason`` if its ``meta`` names one of ``ai`` 7's, and ``meta`` as
  ``messageMetadata``); an aborted message ends with ``abort`` and its reason.

A message aborted for an ``error`` its producer reported (reason ``error``, from the AI
SDK's producer route, :mod:`token_relay.edge.aisdkproduce`) ends with ``{"type": "error",
"errorText": ...}`` (its ``meta``'s ``errorText``) rather than ``abort``.

A reply that completed before the stream was asked for is served too, whole, from the
channel's history (the join's rewind): the one ``?id=`` names, as long as history holds it;
without ``?id=`` (nor ``?wait=``, which waits for a new one), the channel's newest reply, if
it completed at most ``--ai-sdk-replay-window`` seconds ago and nothing is in progress. A
structured one is ``start`` (with its ``meta`` as ``messageMetadata``), the chunks that
rebuild exactly its ``parts`` (:func:`~token_relay.core.parts.chunks_of`), then ``finish``,
or ``abort`` and its reason.

A resume replays from ``start`` under the same ``messageId``, so it replaces the client's
partial message and never duplicates it. ``POST /ai-sdk/{channel}/stop`` is Stop (see
:mod:`token_relay.edge.relay`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import h11

from ..core.errors import PartRejected
from ..core.grants import Grant
from ..core.parts import IMPLICIT, MessageParts, chunks_of
from . import routes
from .broadcast import Fields
from .sse import SSE_HEADERS, SseStream
from .statuses import JOIN_CODES, status_of

__all__ = ["AI_SDK_HEADERS", "AiSdkStream", "ui_message"]

AI_SDK_HEADERS = (
    *SSE_HEADERS,
    ("Connection", "keep-alive"),
    ("x-vercel-ai-ui-message-stream", "v1"),
)


FINISH_REASONS = frozenset(
    {"stop", "length", "content-filter", "tool-calls", "error", "interrupted", "other"}
)
"""The ``finishReason`` values of ``ai`` 7's ``finish`` chunk: a message's ``meta`` naming one
has it on its ``finish``."""
ERROR_TEXT = "errorText"
"""The key of the ``meta`` of a message aborted for an ``error`` (reason ``error``) that
holds its text."""


def ui_message(frame: dict[str, Any]) -> dict[str, Any]:
    """A ``message`` or ``aborted`` frame as the AI SDK's ``UIMessage`` (``role``
    ``assistant``): a structured reply's ``parts`` as they are; a plain one's text as one
    text part, ``done`` if it completed, ``streaming`` as it was if it was aborted; its
    ``meta`` as ``metadata``."""
    parts = frame.get("parts")
    if parts is None:
        state = "done" if frame.get("type") == "message" else "streaming"
        parts = [{"type": "text", "text": frame["text"], "state": state}]
    message: dict[str, Any] = {"id": frame["id"], "role": "assistant", "parts": parts}
    if "meta" in frame:
        message["metadata"] = frame["meta"]
    return message


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
        self._snapshots: dict[str, dict[str, Any]] = {}
        self._mirror = MessageParts()
        """What the client holds of the message being served, as the chunks sent build it."""
        self._completed: dict[str, Any] | None = None
        """The reply that completed before the join was done (the one wanted, or the newest)."""
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ frames in

    def write_event(self, data: bytes, fields: Fields | None = None) -> Fields | None:
        """Turn one frame of the channel into chunks, for the message being served."""
        if self.done:
            return fields
        frame: dict[str, Any] = json.loads(data)
        kind, message_id = frame.get("type"), frame.get("id")
        if kind == "error" and not self.head_sent:
            self._refuse(frame)
        elif not self.joined:
            if kind == "snapshot":
                self._snapshots[str(message_id)] = frame
            elif kind in ("message", "aborted") and self.wanted in (None, message_id):
                self._snapshots.pop(str(message_id), None)
                self._completed = frame
        elif self.target is None:
            wanted = self.wanted in (None, message_id)
            if kind in ("message", "aborted") and "parts" in frame and wanted:
                # A structured message that opened and ended in one event: whole, now.
                self._serve_structured(frame)
            elif kind in ("delta", "chunks", "message") and wanted:
                # A message that started after the join: all of it is still to come (a
                # one-shot one comes whole, as its message frame).
                self._serve(str(message_id), None)
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
            self._serve(str(completed["id"]), None)
            self._part({"type": "delta", "delta": completed["text"]})
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

    def _serve(self, message_id: str, snapshot: dict[str, Any] | None) -> None:
        """Start serving a message in progress: ``start``, then what its ``snapshot`` holds
        (a structured one's compacted chunks; a plain one's text, its implicit text part)."""
        if self._timer is not None:
            self._timer.cancel()
        self.target = message_id
        self._head(200, AI_SDK_HEADERS)
        self._emit({"type": "start", "messageId": message_id})
        if snapshot is None:
            return
        if "chunks" in snapshot:
            self._part({"type": "chunks", "chunks": snapshot["chunks"]})
        elif snapshot["text"]:
            self._part({"type": "delta", "delta": snapshot["text"]})

    def _serve_structured(self, frame: dict[str, Any]) -> None:
        """A structured message, whole: ``start`` (with the message's ``meta`` as its
        ``messageMetadata``), the chunks that rebuild its ``parts``, and its end."""
        if self._timer is not None:
            self._timer.cancel()
        self.target = str(frame["id"])
        self._head(200, AI_SDK_HEADERS)
        start: dict[str, Any] = {"type": "start", "messageId": self.target}
        if "meta" in frame:
            start["messageMetadata"] = frame["meta"]
        self._emit(start)
        for chunk in chunks_of(frame["parts"]):
            self._emit(chunk)
        self._finish(frame)

    def _finish(self, frame: dict[str, Any]) -> None:
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
        self._end()

    def _part(self, frame: dict[str, Any]) -> None:
        """One frame of the message being served, as the chunks it amounts to. Each chunk
        sent also builds the mirror of what the client holds, so that the end sends only
        what the client lacks of the final parts."""
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

    def _emit(self, part: dict[str, Any]) -> None:
        if self.open:
            line = json.dumps(part, ensure_ascii=False, separators=(",", ":"))
            self._write(b"data: " + line.encode() + b"\n\n")

    def _end(self) -> None:
        if self.open:
            self._write(b"data: [DONE]\n\n")
        self.done = True
        self.start_close(1000, "done")
