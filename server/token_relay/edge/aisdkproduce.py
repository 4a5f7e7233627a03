"""The AI SDK's producer: ``POST /ai-sdk/{channel}/produce[?id=M]``, one reply per request.

Theory of operation
-------------------
An app's chat route sends its model's reply to the relay in one call: the request's body
is the UI message stream that the ``ai`` package itself writes
(``createUIMessageStreamResponse``, ``result.toUIMessageStreamResponse()``): server-sent
events, each ``data: {chunk}`` and a blank line, ending in ``data: [DONE]``.

:class:`AiSdkProducer` is an :class:`~token_relay.edge.httpproducer.HttpProducer`: the
body is read once, as it arrives, in bounded lines, with the same backpressure, and its
events are applied by the producer endpoint as ``POST /produce``'s are, one by one as
they arrive, with the same rate limit, grants and error frames. What differs is the
framing, and that the body is one message:

* **SSE.** A ``data:`` line adds to the event arriving (several are joined by ``\\n``, as
  SSE has it); a blank line ends it. ``event:``, ``id:`` and ``retry:`` lines and ``:``
  comments (keep-alives) are skipped; any other line is refused (``invalid_sse``, with its
  ``line``). An event's data is bounded as a line is (``line_too_long``), and the last
  event needs no blank line after it.
* **One message.** Every chunk is an event of one message id: ``start``'s ``messageId``,
  else ``?id=``, else one the relay makes. Part chunks (and ``start-step`` /
  ``finish-step``) become ``{"id", "chunk"}``; the message-level ones map so:

  =====================  ==========================================================
  ``start``              opens the message; ``messageMetadata`` merges into ``meta``
  ``message-metadata``   merges into ``meta``
  ``finish``             completes it; ``messageMetadata`` and ``finishReason`` merge
                         into ``meta`` (``finishReason`` under that key)
  ``[DONE]``             completes it, if nothing ended it before
  ``abort``              aborts it, reason ``cancelled``
  ``error``              keeps ``errorText`` in ``meta``; the message goes on taking
                         chunks (``ai`` goes on after an error), and however it ends
                         then, it ends aborted, reason ``error``
  =====================  ==========================================================

  Once the message has ended, a later ``finish``, ``abort``, ``error`` or ``[DONE]``
  changes nothing. A body that ends before the message did aborts it
  (``producer_disconnected``, or ``error`` after an ``error`` chunk), as a producer that
  goes away does.
* **Stop.** A ``cancel`` for the message (``POST /ai-sdk/{channel}/stop``, a subscriber's
  Stop) while the body still streams aborts it at once (reason ``cancelled``) and ends the
  request: the events still waiting are dropped, nothing more of the body is read, and the
  answer goes out before the body ends, so that the app aborts its model.
* **Bounded.** The answer is bounded as ``POST /produce``'s is
  (:data:`~token_relay.edge.httpproducer.MAX_ANSWER_ERRORS` errors,
  :data:`~token_relay.edge.httpproducer.MAX_ANSWER_BYTES` of frames): past it the events
  still waiting are dropped, nothing more of the body is applied, and the request ends as
  one over ``--max-body-bytes`` does: ``body_too_large`` (naming the first ``line`` not
  applied), and the message aborts as at the end of a body.

The answer (:meth:`AiSdkProducer.answer`) is an
:class:`~token_relay.core.protocol.AiSdkProduced`: the message's id, its outcome, its
offset (from the ``message`` or ``aborted`` frame the producer endpoint reports through
:meth:`AiSdkProducer.ended`) and the errors.
"""

from __future__ import annotations

import asyncio
import collections
import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from ..core.errors import ErrorCode, FrameRejected
from ..core.grants import Grant
from ..core.protocol import (
    AbortReason,
    AiSdkProduced,
    ErrorFrame,
    may_nest_too_deep,
    nested_too_deep,
)
from ..core.surrogates import has_surrogate
from .httpproducer import AbortMessage, HttpProducer, Item

__all__ = ["DONE", "AiSdkProducer"]

DONE = "[DONE]"
"""The data of the UI message stream's last event."""

_SKIPPED_FIELDS = frozenset({b"event", b"id", b"retry"})
"""SSE fields the body may carry and the relay has no use for."""

Outcome = Literal["completed", "aborted", "stopped", "none"]


class AiSdkProducer(HttpProducer):
    """One request's UI message stream in, one message's events out (see the module's
    docstring)."""

    takes_runs = False
    """Its events come translated from the stream's chunks, one by one (:meth:`dispatch`)."""

    def __init__(
        self,
        transport: asyncio.Transport,
        *,
        path: str,
        client: str,
        grant: Grant,
        channel: str,
        wanted: str | None,
        max_line: int,
    ) -> None:
        super().__init__(
            transport,
            path=path,
            client=client,
            grant=grant,
            ndjson=True,
            named=False,
            max_line=max_line,
        )
        self.channel = channel
        self.wanted = wanted
        self.message_id: str | None = None
        """Decided by the first chunk: its ``messageId`` (a ``start``), ``?id=``, or new."""
        self.errored = False
        """An ``error`` chunk came: the message ends aborted, reason ``error``."""
        self.stopped = False
        """A Stop came for the message while the body streamed."""
        self._data: list[str] = []
        """The data lines of the event arriving."""
        self._data_size = 0
        self._data_line = 0
        """The number of the event's first data line."""
        self._dropping_event = False
        """The event arriving was refused for its size: drop it up to its blank line."""
        self._event_lines: collections.deque[int] = collections.deque()
        """The first line of each event queued, in order."""
        self._pending: collections.deque[Item] = collections.deque()
        """What the events taken so far amount to, still to hand on."""
        self._end_sent = False
        """The message's end (its final, or its abort) was handed on."""
        self._closed = False
        """Nothing more is handed on once :attr:`_pending` is empty."""
        self._ended_frame: dict[str, Any] | None = None

    # ------------------------------------------------------------------ SSE lines in

    def _queue(self, line: bytes) -> None:
        """One line of the body: a field of the event arriving, or the blank line that
        ends it."""
        if line.endswith(b"\r"):
            line = line[:-1]
        number = self._lines
        if not line:
            self._dispatch()
            return
        if line.startswith(b":") or self._dropping_event:
            return  # a comment (a keep-alive), or the rest of a refused event
        field, colon, value = line.partition(b":")
        if field != b"data":
            if not colon or field not in _SKIPPED_FIELDS:
                shown = line[:40].decode(errors="replace")
                self._refuse(
                    FrameRejected(
                        ErrorCode.INVALID_SSE,
                        f"line {number} is not a server-sent event field (data:, event:, "
                        f"id:, retry: or a ':' comment): {shown!r}",
                        line=number,
                    )
                )
            return
        if value.startswith(b" "):
            value = value[1:]
        try:
            text = value.decode()
        except UnicodeDecodeError:
            self._drop_event(FrameRejected(ErrorCode.INVALID_JSON, f"line {number} is not UTF-8"))
            return
        if not self._data:
            self._data_line = number
        self._data.append(text)
        self._data_size += len(value) + 1
        if self._data_size > self.max_line:
            self._drop_event(
                FrameRejected(
                    ErrorCode.LINE_TOO_LONG,
                    f"the event from line {self._data_line} is over {self.max_line} bytes; "
                    "none of it was applied",
                    line=self._data_line,
                )
            )

    def _too_long(self, number: int) -> None:
        """A line over the limit: the event it is in is refused whole."""
        super()._too_long(number)
        self._dropping_event = True
        self._data, self._data_size = [], 0

    def _drop_event(self, refusal: FrameRejected) -> None:
        refusal.line = refusal.line or self._lines
        self._refuse(refusal)
        self._dropping_event = True
        self._data, self._data_size = [], 0

    def _refuse(self, refusal: FrameRejected) -> None:
        self._refuse_line(refusal)

    def _left(self) -> bool:
        """Whether some of the body is still to apply: nothing is after a Stop, or once the
        iteration has ended (the message's end, if it waits, is applied still)."""
        return not self._closed and super()._left()

    def _drop_waiting(self) -> None:
        super()._drop_waiting()
        self._event_lines.clear()

    def _cut_refusal(self, bound: str, ahead: bool) -> FrameRejected:
        """The refusal that ends a body cut at the answer's ``bound``, naming the first of
        its lines not applied."""
        first = None if ahead or not self._items else self._items[0][0]
        if isinstance(first, FrameRejected) and first.line is not None:
            line = first.line
        elif isinstance(first, str):
            line = self._event_lines[0]
        elif self._data:
            line = self._data_line  # the event arriving
        else:
            line = self._lines + 1
        return FrameRejected(
            ErrorCode.BODY_TOO_LARGE,
            f"the answer to this request reached {bound}: its events from line {line} on "
            "were not applied, and the rest of the body was not read",
            line=line,
        )

    def _dispatch(self) -> None:
        """A blank line: the event arriving is complete."""
        if self._dropping_event:
            self._dropping_event = False
            return
        if not self._data:
            return
        data, size = "\n".join(self._data), self._data_size
        self._data, self._data_size = [], 0
        self._items.append((data, size))
        self._event_lines.append(self._data_line)
        self._queued += size

    def end(self) -> None:
        """The body is complete: its last line and event too, blank line or not."""
        if self._ended:
            return
        if self._arriving and not self._skipping:
            self._lines += 1
            self._queue(bytes(self._arriving))
        self._arriving = bytearray()
        self._dispatch()
        super().end()

    # ------------------------------------------------------------------ events out

    async def dispatch(
        self,
        handle: Callable[[Item], Awaitable[None] | None],
        settle: Callable[[], None] | None = None,
    ) -> None:
        """Hand every event (or refusal, or abort) to ``handle``, in order, waiting for what
        it returns before the next. Its events are applied one by one, never as runs of
        deltas, so nothing is put off: ``settle`` is not taken."""
        assert settle is None, "an AI SDK body's events are applied one by one"
        async for item in self:
            later = handle(item)
            if later is not None:
                await later

    async def __anext__(self) -> Item:
        """The next event to apply (or refusal, or abort); the iteration ends with the
        body, or at once after a Stop."""
        while not self._pending:
            if self._closed:
                raise StopAsyncIteration
            try:
                item = await super().__anext__()
            except StopAsyncIteration:
                self._closed = True
                self._body_ended()
                continue
            if isinstance(item, str):
                self._translate(item, self._event_lines.popleft())
            else:
                self._pending.append(item)
        return self._pending.popleft()

    def _translate(self, data: str, line: int) -> None:
        """One event's data: the events (or refusal) its chunk amounts to."""
        if data == DONE:
            self._finish_message({})
            return
        why = ""
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError) as exc:
            why = str(exc) or "arrays and objects nested too deep"
        else:
            if may_nest_too_deep(data) and nested_too_deep(chunk):
                why = "arrays and objects nested too deep"
        if why:
            why = f"the event at line {line} is not JSON: {why}"
            self._pending.append(FrameRejected(ErrorCode.INVALID_JSON, why, line=line))
            return
        kind = chunk.get("type") if isinstance(chunk, dict) else None
        if not isinstance(kind, str):
            self._invalid(line, "a chunk is a JSON object with a string 'type'")
        elif kind == "start":
            self._start(chunk, line)
        elif kind == "message-metadata":
            metadata = chunk.get("messageMetadata")
            if not isinstance(metadata, dict):
                self._invalid(line, "'message-metadata' needs a 'messageMetadata' object")
            else:
                self._event({"meta": metadata})
        elif kind == "finish":
            self._finish_chunk(chunk, line)
        elif kind == "abort":
            self._end(AbortReason.CANCELLED)
        elif kind == "error":
            error_text = chunk.get("errorText")
            if not isinstance(error_text, str):
                self._invalid(line, "'error' needs an 'errorText' string")
            elif not self._end_sent:
                self.errored = True
                self._event({"meta": {"errorText": error_text}})
        else:
            # A part's chunk, passed on as it came: the parts check it.
            message_id = json.dumps(self._message())
            self._pending.append(f'{{"id":{message_id},"chunk":{data}}}')

    def _start(self, chunk: dict[str, Any], line: int) -> None:
        named, metadata = chunk.get("messageId"), chunk.get("messageMetadata")
        if named is not None and not isinstance(named, str):
            self._invalid(line, "'start' has a 'messageId' that is not a string")
        elif named is not None and has_surrogate(named):
            self._invalid(line, "'start' has a 'messageId' with half a surrogate pair")
        elif metadata is not None and not isinstance(metadata, dict):
            self._invalid(line, "'start' has a 'messageMetadata' that is not an object")
        elif named is not None and self._message(named) != named:
            self._invalid(
                line,
                f"this body's message is '{self.message_id}', not '{named}': a body carries "
                "one message",
            )
        else:
            self._event({"meta": metadata} if metadata else {})

    def _finish_chunk(self, chunk: dict[str, Any], line: int) -> None:
        metadata, reason = chunk.get("messageMetadata"), chunk.get("finishReason")
        if metadata is not None and not isinstance(metadata, dict):
            self._invalid(line, "'finish' has a 'messageMetadata' that is not an object")
        elif reason is not None and not isinstance(reason, str):
            self._invalid(line, "'finish' has a 'finishReason' that is not a string")
        else:
            meta = dict(metadata or {})
            if reason is not None:
                meta["finishReason"] = reason
            self._finish_message(meta)

    def _finish_message(self, meta: dict[str, Any]) -> None:
        """``finish`` or ``[DONE]``: complete the message (abort it, after an ``error``)."""
        if self._end_sent or self.message_id is None:
            return  # ended already, or no chunk came before: no message to end
        if self.errored:
            if meta:
                self._event({"meta": meta})
            self._end(AbortReason.ERROR)
            return
        if meta:
            # Its own event: metadata refused (half a surrogate pair, over --max-meta-bytes)
            # gets its error, and the message still completes.
            self._event({"meta": meta})
        self._event({"final": True})
        self._end_sent = True

    def _end(self, reason: AbortReason) -> None:
        if not self._end_sent:
            self._end_sent = True
            self._pending.append(AbortMessage(self._message(), reason))

    def _body_ended(self) -> None:
        """The body ended: a message it left unfinished aborts, as its producer is gone."""
        if self.message_id is not None and not self.stopped:
            # Also after a final that was refused (rate_limited...): it aborts here, where
            # the answer says so; after one applied, this changes nothing.
            reason = AbortReason.ERROR if self.errored else AbortReason.PRODUCER_DISCONNECTED
            self._pending.append(AbortMessage(self._message(), reason))

    def _event(self, fields: dict[str, Any]) -> None:
        """A producer event of the message (JSON escapes any lone surrogate, which the
        event's decoder takes)."""
        self._pending.append(json.dumps({"id": self._message(), **fields}))

    def _invalid(self, line: int, reason: str) -> None:
        self._pending.append(
            FrameRejected(
                ErrorCode.INVALID_CHUNK,
                f"the chunk at line {line} was refused: {reason}",
                self.message_id,
                line=line,
            )
        )

    def _message(self, named: str | None = None) -> str:
        """The message's id, decided the first time it is asked for."""
        if self.message_id is None:
            self.message_id = named or self.wanted or "m-" + secrets.token_hex(8)
        return self.message_id

    # ------------------------------------------------------------------ Stop and the end

    def collect(self, data: bytes) -> None:
        """A frame for this producer; a ``cancel`` of its message is Stop."""
        cancels = len(self.cancels)
        super().collect(data)
        if len(self.cancels) > cancels and not self._closed:
            frame = json.loads(data)
            if frame.get("id") == self.message_id and frame.get("channel") == self.channel:
                self._stop()

    def _stop(self) -> None:
        """Abort the message now, and end the request: nothing more is applied."""
        self.stopped = self._end_sent = self._closed = True
        self._pending.clear()
        self._items.clear()
        self._event_lines.clear()
        self._queued = 0
        self._pending.append(AbortMessage(self._message(), AbortReason.CANCELLED))
        self._finish()  # what still comes of the body is read and dropped

    def ended(self, message_id: str, frame: str) -> None:
        """The message's ``message`` or ``aborted`` frame, as published."""
        if message_id == self.message_id:
            self._ended_frame = json.loads(frame)

    def outcome(self) -> AiSdkProduced:
        """What became of the message, and the errors."""
        errors = [ErrorFrame.model_validate_json(error) for error in self.errors]
        frame = self._ended_frame
        fields: dict[str, Any] = {}
        outcome: Outcome = "none"
        if frame is not None and frame.get("type") == "message":
            outcome = "completed"
        elif frame is not None:
            reason = AbortReason(frame["reason"])
            stopped = self.stopped and reason is AbortReason.CANCELLED
            outcome = "stopped" if stopped else "aborted"
            fields["reason"] = reason
        if frame is not None:
            fields["offset"], fields["epoch"] = frame["offset"], frame["epoch"]
        return AiSdkProduced(
            id=self._message(),
            channel=self.channel,
            outcome=outcome,
            stopped=outcome == "stopped",
            errors=errors,
            **fields,
        )

    def answer(self) -> bytes:
        """The response's body: :meth:`outcome`, as JSON."""
        return self.outcome().model_dump_json().encode()
