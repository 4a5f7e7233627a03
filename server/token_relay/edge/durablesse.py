"""A Durable Streams live read as Server-Sent Events (``GET /v1/stream/S?offset=O&live=sse``).

Unlike the relay's own SSE streams, its response head is not written when the request is
admitted: the stream must be looked up first, and a missing one gets a plain 404
(:meth:`DurableSse.refuse`). Once it exists, :meth:`DurableSse.begin` writes the head and
every event is a ``data`` or ``control`` event (:mod:`token_relay.edge.durable` writes them).
The server's comment line every ``--sse-heartbeat`` seconds keeps proxies from timing out
an idle one, as on every SSE stream.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import h11
from websockets import CloseCode

from .http import Reply
from .sse import SseStream

__all__ = ["DurableSse", "sse_event"]


def sse_event(kind: str, text: str) -> bytes:
    """One event: ``event: KIND``, then each line of ``text`` as a ``data:`` line (a line
    break of any kind, CR LF, CR or LF, starts a new one, as readers split them: a reader
    joins them with LF)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    # One space after the colon is not part of the data: it is written only before a line
    # that starts with one.
    body = "".join(f"data: {line}\n" if line[:1] == " " else f"data:{line}\n" for line in lines)
    return f"event: {kind}\n{body}\n".encode()


class DurableSse(SseStream):
    """One Durable Streams SSE response."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._quiet = False
        """The response ends normally: no comment after its last event."""

    def start(self) -> None:
        """Nothing yet: the head waits for the stream to be found (:meth:`begin`)."""

    def begin(self, headers: tuple[tuple[str, str], ...]) -> None:
        """The 200 head, with the stream's headers."""
        self._head(200, (*headers, ("Server", "token-relay")))

    def event(self, chunk: bytes) -> None:
        """Write one or more whole events."""
        if self.open:
            self._write(chunk)

    def start_close(self, code: int, reason: str = "") -> None:
        """End the response. A normal end (the stream closed, or the response's time is up)
        ends it after its last event, with no comment: the client reads the events only."""
        if code == CloseCode.NORMAL_CLOSURE and self.head_sent and not self._ended:
            self._quiet = True
        super().start_close(code, reason)

    def _write(self, body: bytes) -> None:
        if self._quiet and body.startswith(b": closed"):
            return
        super()._write(body)

    def refuse(self, reply: Reply) -> None:
        """Answer with a whole plain response instead (a refusal), then close."""
        if self.head_sent or not self.open:
            return
        headers = [
            *reply.headers,
            *self.headers,
            ("Server", "token-relay"),
            ("Content-Type", reply.content_type),
            ("Content-Length", str(len(reply.body))),
            ("Connection", "close"),
        ]
        phrase = HTTPStatus(reply.status).phrase.encode()
        data = self.http.send(
            h11.Response(status_code=reply.status, headers=headers, reason=phrase)
        )
        data = (data or b"") + (self.http.send(h11.Data(data=reply.body)) or b"")
        data += self.http.send(h11.EndOfMessage()) or b""
        self.transport.write(data)
        self.head_sent = True
        self._code = CloseCode.NORMAL_CLOSURE
        self._ended = True
        self.transport.close()
