"""A Durable Streams live read as Server-Sent Events (``GET /v1/stream/S?offset=O&live=sse``).

Unlike the relay's own SSE streams, its response head is not written when the request is
admitted: the stream must be looked up first, and a missing one gets a plain 404
(:meth:`DurableSse.refuse`). Once it exists, :meth:`DurableSse.begin` writes the head and
every event is a ``data`` or ``control`` event (:func:`follow` writes them).
The server's comment line every ``--sse-heartbeat`` seconds keeps proxies from timing out
an idle one, as on every SSE stream.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, Protocol

from websockets import CloseCode

from ..core.durable import Chunk, DurableStream, media_type, offset_text
from ..core.durablejson import json_array
from ..core.errors import StreamRefused
from .http import Reply
from .routes import StreamRequest
from .sse import SseStream

__all__ = ["SSE_LIFETIME", "DurableSse", "Live", "follow", "sse_event"]

SSE_LIFETIME = 60.0
"""Seconds an SSE response lasts before it ends (its client reconnects from its offset), so
that a proxy's cache can gather its readers."""

Headers = tuple[tuple[str, str], ...]


class Live(Protocol):
    """What following a stream asks of the service that holds it."""

    @property
    def stopping(self) -> bool:
        """The relay is shutting down: the response ends."""

    def listen(self, path: str) -> asyncio.Future[None]:
        """A waiter for the next change at ``path``, registered before the read it follows."""

    def discard(self, path: str, waiter: asyncio.Future[None]) -> None:
        """Forget ``waiter``."""

    async def wait(
        self,
        path: str,
        waiter: asyncio.Future[None],
        timeout: float,  # noqa: ASYNC109
        gone: asyncio.Future[None] | None = None,
    ) -> None:
        """Wait until the stream at ``path`` changes after the read ``waiter`` was
        registered before, ``timeout`` seconds pass, or the reader is ``gone``; the waiter
        is done with."""

    async def same(self, path: str, stream: DurableStream) -> DurableStream:
        """The stream, still at its path (:class:`StreamRefused` once it is not)."""

    async def read(self, stream: DurableStream, position: int) -> Chunk:
        """What ``stream`` holds from ``position``."""

    def cursor(self, route: StreamRequest) -> str:
        """A live response's cursor."""


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
        data = self.http.respond(reply.status, headers)
        data += self.http.body(reply.body) + self.http.end()
        self.transport.write(data)
        self.head_sent = True
        self._code = CloseCode.NORMAL_CLOSURE
        self._ended = True
        self.transport.close()


async def follow(
    sse: DurableSse,
    live: Live,
    route: StreamRequest,
    stream: DurableStream,
    position: int,
    waiter: asyncio.Future[None],
) -> None:
    """Send what there is from ``position``, each batch a ``data`` event and a ``control``
    event, then new data as it comes, until the stream closes (or is deleted), the client
    goes, the relay stops, or :data:`SSE_LIFETIME` passes.

    ``waiter`` was registered (:meth:`Live.listen`) before ``stream`` was read, and another
    is before each read of it again: a change made while a read is under way wakes the
    next wait, which would otherwise sleep through it (up to the response's lifetime)."""
    text = stream.json or media_type(stream.content_type).startswith("text/")
    headers: Headers = (
        ("Content-Type", "text/event-stream"),
        ("Cache-Control", "no-cache"),
        ("X-Accel-Buffering", "no"),
    )
    if not text:
        headers += (("Stream-SSE-Data-Encoding", "base64"),)
    sse.begin(headers)
    loop = asyncio.get_running_loop()
    ends = loop.time() + SSE_LIFETIME
    told = False
    try:
        while sse.open:
            try:
                chunk = (
                    await live.read(stream, position)
                    if position < stream.tail
                    else Chunk((), position)
                )
            except StreamRefused:
                return  # its store is out of reach: the client reconnects from its offset
            if text and not stream.json and chunk.next < stream.tail:
                chunk = _whole_characters(chunk, position)
            at_tail = chunk.next >= stream.tail
            if chunk.entries or not told or (at_tail and stream.closed):
                events = b""
                if chunk.entries:
                    events += sse_event("data", _sse_data(stream, chunk, text))
                control: dict[str, object] = {"streamNextOffset": offset_text(chunk.next)}
                if at_tail and stream.closed:
                    control["streamClosed"] = True
                    control["upToDate"] = True
                else:
                    control["streamCursor"] = live.cursor(route)
                    if at_tail:
                        control["upToDate"] = True
                events += sse_event("control", json.dumps(control, separators=(",", ":")))
                sse.event(events)
                told = True
                position = chunk.next
                await sse.drain()
                if at_tail and stream.closed:
                    return
                if not at_tail:
                    continue
            if stream.tail > position or stream.closed:
                continue  # it changed while the events were written
            left = ends - loop.time()
            if left <= 0 or live.stopping:
                return
            await live.wait(route.stream, waiter, left, sse.until_gone)
            waiter = live.listen(route.stream)  # before the read: no change falls between
            try:
                stream = await live.same(route.stream, stream)
            except StreamRefused:
                return
    finally:
        live.discard(route.stream, waiter)


def _whole_characters(chunk: Chunk, position: int) -> Chunk:
    """A text read the read budget cut: without the start of a character its next bytes
    complete, so that each event is whole UTF-8 (the next read starts at that character)."""
    data = b"".join(chunk.entries)
    end = len(data)
    for back in range(1, min(4, len(data)) + 1):
        byte = data[end - back]
        if byte & 0xC0 != 0x80:  # the last character's first byte
            length = 1 if byte < 0x80 else 2 if byte >> 5 == 6 else 3 if byte >> 4 == 14 else 4
            if length > back:
                end -= back
            break
    if end == len(data) or end == 0:
        return chunk
    return Chunk((data[:end],), position + end)


def _sse_data(stream: DurableStream, chunk: Chunk, text: bool) -> str:
    if stream.json:
        return json_array(list(chunk.entries)).decode()
    joined = b"".join(chunk.entries)
    if text:
        return joined.decode(errors="replace")
    return base64.b64encode(joined).decode()
