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

The chunks are :class:`~token_relay.core.uistream.ReplyChunks`' (shared with the WebSocket
chat transport, :mod:`token_relay.edge.aisdkws`); this module frames them as ``data:``
lines. A resume replays from ``start`` under the same ``messageId``, so it replaces the client's
partial message and never duplicates it. ``POST /ai-sdk/{channel}/stop`` is Stop (see
:mod:`token_relay.edge.relay`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ..core.grants import Grant
from ..core.uistream import ReplyChunks
from . import routes
from .broadcast import Broadcast, Fields
from .http11 import Http11
from .sse import SSE_HEADERS, SseStream
from .statuses import JOIN_CODES, status_of

__all__ = ["AI_SDK_HEADERS", "AiSdkStream", "ui_message"]

AI_SDK_HEADERS = (
    *SSE_HEADERS,
    ("Connection", "keep-alive"),
    ("x-vercel-ai-ui-message-stream", "v1"),
)


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
        http: Http11,
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
        self.done = False
        self.replay_window: float | None = None
        """Without ``?id=``: how recent a completed reply must be to be served."""
        self.reply = ReplyChunks(self.wanted, self._emit, on_serve=self._serving, on_end=self._end)
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ frames in

    def take(self, broadcast: Broadcast) -> None:
        """A frame sent to many peers, as :meth:`write_event` takes one."""
        self.write_event(broadcast.data())

    def write_event(self, data: bytes, fields: Fields | None = None) -> Fields | None:
        """Turn one frame of the channel into chunks, for the message being served."""
        if self.done:
            return fields
        frame: dict[str, Any] = json.loads(data)
        if frame.get("type") == "error" and not self.head_sent:
            self._refuse(frame)
        else:
            self.reply.frame(frame)
        return fields

    async def __anext__(self) -> str | bytes:
        """Called once the join is done: decide, then wait until the stream ends."""
        if not self.reply.joined:
            self._decide()
        return await super().__anext__()

    def _decide(self) -> None:
        if self.done or self.reply.decide():
            return
        if self.wait > 0:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.wait, self._nothing)
        else:
            self._nothing()

    def _nothing(self) -> None:
        """No message to serve: 204, and the end."""
        if self.reply.target is None and not self.done:
            self.done = True
            self.reply.stop()
            self.start_close(1000, "no message in progress")

    def _refuse(self, frame: dict[str, Any]) -> None:
        """The join itself was refused (a channel the token does not grant, Redis down)."""
        self.done = True
        self.reply.stop()
        status = status_of(str(frame.get("code")), JOIN_CODES)
        body = json.dumps(frame).encode()
        self._head(status, (("Content-Type", "application/json"), ("Server", "token-relay")))
        self._write(body)
        self.start_close(1000, "refused")

    # ------------------------------------------------------------------ parts out

    def _serving(self, message_id: str) -> None:
        """A reply was chosen: the response's head, before its first chunk."""
        if self._timer is not None:
            self._timer.cancel()
        self._head(200, AI_SDK_HEADERS)

    def _emit(self, part: dict[str, Any]) -> None:
        if self.open:
            line = json.dumps(part, ensure_ascii=False, separators=(",", ":"))
            self._write(b"data: " + line.encode() + b"\n\n")

    def _end(self) -> None:
        if self.open:
            self._write(b"data: [DONE]\n\n")
        self.done = True
        self.start_close(1000, "done")

    def start_close(self, code: int, reason: str = "") -> None:
        """End the stream. One whose reply is not over yet, ended by the relay (a shutdown's
        1001 or 1012, a slow reader's 1013), is cut, not ended: a UI message stream that
        ends cleanly reads to the AI SDK as a reply that is over, and the page would keep
        a partial reply as if whole; a cut reads as the network's, which the SDK marks
        resumable (``useChat`` resumes it, as ``resumeStream()`` does)."""
        if code != 1000 and not self.done and not self._ended:
            self.done = True
            self.reply.stop()
            if self._timer is not None:
                self._timer.cancel()
            self._code, self._ended = code, True
            self.transport.abort()
            return
        super().start_close(code, reason)
