"""A minimal Server-Sent Events client over one real socket (h11), that can cut its
connection with no goodbye."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import h11


@dataclasses.dataclass(frozen=True)
class SseEvent:
    """One Server-Sent Event: its ``event:``, ``id:`` (or None) and ``data:``."""

    event: str
    id: str | None
    data: str

    def json(self) -> Any:
        """The data, decoded."""
        return json.loads(self.data)


class SseReader:
    """``GET path`` as an SSE stream on ``port``: the response head, then events one by one.

    Comment lines are counted in :attr:`comments`; ``retry:`` is kept in :attr:`retry`.
    """

    def __init__(self, port: int, path: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        self.port, self.path, self.headers = port, path, list(headers)
        self.status = 0
        self.response_headers: dict[str, str] = {}
        self.comments = 0
        self.retry: int | None = None
        self.ended = False
        self._http = h11.Connection(h11.CLIENT)
        self._buffer = ""
        self._events: collections.deque[SseEvent] = collections.deque()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> SseReader:
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        request = h11.Request(
            method="GET",
            target=self.path,
            headers=[("Host", "relay"), ("Accept", "text/event-stream"), *self.headers],
        )
        self._writer.write(self._http.send(request) + self._http.send(h11.EndOfMessage()))
        while self.status == 0:
            event = await self._next_http()
            if isinstance(event, h11.Response):
                self.status = event.status_code
                self.response_headers = {k.decode().lower(): v.decode() for k, v in event.headers}
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()

    def cut(self) -> None:
        """Drop the connection at once, as a network would."""
        if self._writer is not None:
            self._writer.transport.abort()

    async def _next_http(self) -> Any:
        assert self._reader is not None
        while True:
            event = self._http.next_event()
            if event is not h11.NEED_DATA:
                return event
            self._http.receive_data(await self._reader.read(65536))

    async def next(self, timeout: float = 5.0) -> SseEvent:  # noqa: ASYNC109
        """The next event; raises ``EOFError`` once the stream has ended."""
        async with asyncio.timeout(timeout):
            while not self._events:
                if self.ended:
                    raise EOFError("the stream ended")
                event = await self._next_http()
                if isinstance(event, h11.Data):
                    self._feed(bytes(event.data).decode())
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    self.ended = True
            return self._events.popleft()

    def _feed(self, text: str) -> None:
        self._buffer += text
        while "\n\n" in self._buffer:
            block, self._buffer = self._buffer.split("\n\n", 1)
            fields: dict[str, str] = {}
            data: list[str] = []
            for line in block.split("\n"):
                if line.startswith(":"):
                    self.comments += 1
                    continue
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "data":
                    data.append(value)
                elif name == "retry":
                    self.retry = int(value)
                else:
                    fields[name] = value
            if data:
                event = SseEvent(fields.get("event", "message"), fields.get("id"), "\n".join(data))
                self._events.append(event)
