"""A TCP proxy for tests: forwards bytes to the relay and can cut every connection at once."""

from __future__ import annotations

import asyncio
import contextlib


class Proxy:
    """Listens on a free port and pipes each connection to ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """The WebSocket base URL to give clients instead of the relay's."""
        return f"ws://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def cut(self) -> int:
        """Drop every connection abruptly (no close frame, as a network failure would)."""
        pairs = list(self._pairs)
        for client, upstream in pairs:
            for writer in (client, upstream):
                writer.transport.abort()
        self._pairs.clear()
        self.cuts += 1
        return len(pairs)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        pair = (writer, up_writer)
        self._pairs.add(pair)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink, pair))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        self._pairs.discard(pair)
        with contextlib.suppress(Exception):
            sink.close()


class Balancer(Proxy):
    """A load balancer for tests: each new connection goes to the next backend that answers.

    ``backends`` may be changed at any time (a rolling restart replaces them one by one);
    :meth:`cut` is inherited, so it can also drop every connection at once.
    """

    def __init__(self, backends: list[int]) -> None:
        super().__init__(backends[0])
        self.backends = list(backends)
        self._next = 0

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        start = self._next
        self._next += 1  # before any await: connections arriving together spread out
        for attempt in range(len(self.backends) * 2):
            port = self.backends[(start + attempt) % len(self.backends)]
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            pair = (writer, up_writer)
            self._pairs.add(pair)
            for source, sink in ((reader, up_writer), (up_reader, writer)):
                task = asyncio.create_task(self._pipe(source, sink, pair))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return
        writer.transport.abort()
