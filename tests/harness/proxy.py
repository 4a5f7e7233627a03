"""Proxies for fault tests: :class:`Proxy` (TCP) can cut every connection at once, with no
close frame, as a network failure would, or freeze them; :class:`Balancer` spreads
connections over backends that may change (a rolling restart); :class:`FrameLimitProxy`
(WebSocket) refuses frames past a limit of its own with 1009."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from websockets import CloseCode
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed


class Proxy:
    """Listens on a free port and pipes each connection to ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.cuts = 0
        self.delay = 0.0
        """Seconds each chunk of bytes waits before it is passed on (latency; order kept)."""
        self.lose_answers = False
        """While set, every byte from the backend to its client is lost on the way (the
        requests still pass): an answer that never arrives."""
        self.drop_requests = 0
        """The next connections to drop once their first bytes (an HTTP request, a WebSocket
        handshake) arrive, before anything is answered."""
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._frozen: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
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
        self._frozen.clear()
        self.cuts += 1
        return len(pairs)

    def freeze(self) -> int:
        """Stop every open connection's bytes both ways, leaving it open: a network path
        that went dead without a reset. New connections pass as before."""
        self._frozen |= self._pairs
        return len(self._pairs)

    def _ports(self) -> list[int]:
        """The ports to try for a new connection, in order."""
        return [self.target_port]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.drop_requests:
            self.drop_requests -= 1
            with contextlib.suppress(ConnectionError, OSError):
                await reader.read(1)
            writer.transport.abort()
            return
        for port in self._ports():
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
        writer.transport.abort()  # no backend answers

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await source.read(65536):
                if self.delay:
                    await asyncio.sleep(self.delay)
                if pair in self._frozen or (self.lose_answers and sink is pair[0]):
                    continue  # lost on the way
                sink.write(data)
                await sink.drain()
        self._pairs.discard(pair)
        self._frozen.discard(pair)
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

    def _ports(self) -> list[int]:
        start = self._next
        self._next += 1  # before any await: connections arriving together spread out
        count = len(self.backends)
        return [self.backends[(start + attempt) % count] for attempt in range(count * 2)]


class FrameLimitProxy:
    """A WebSocket proxy with a frame limit of its own, as some gateways and load balancers
    have: a client's frame past ``max_size`` bytes closes that connection with 1009, and
    nothing at the handshake says so (the relay's ``Relay-Max-Frame-Bytes`` is not passed
    on). Each connection is forwarded to the same path and query on ``target_port``,
    message by message both ways; pings are answered by the proxy itself, once it read
    every frame before them. When either side ends, the other is dropped."""

    def __init__(self, target_port: int, max_size: int) -> None:
        self.target_port = target_port
        self.max_size = max_size
        self.port = 0
        self.refused = 0
        """Connections closed with 1009 for a frame past the limit."""
        self._server: Server | None = None

    @property
    def url(self) -> str:
        """The WebSocket base URL to give clients instead of the relay's."""
        return f"ws://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FrameLimitProxy:
        self._server = await serve(
            self._forward, "127.0.0.1", 0, max_size=self.max_size, compression=None
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _forward(self, client: ServerConnection) -> None:
        assert client.request is not None
        target = f"ws://127.0.0.1:{self.target_port}{client.request.path}"
        async with connect(target, compression=None, max_size=None) as upstream:
            pumps = {
                asyncio.create_task(_pump(client, upstream)),
                asyncio.create_task(_pump(upstream, client)),
            }
            _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            # As a proxy failing a connection: the relay's side is dropped, no close frame
            # (a producer that vanished, whose session waits for it to come back).
            upstream.transport.abort()
        sent = client.protocol.close_sent
        if sent is not None and sent.code == CloseCode.MESSAGE_TOO_BIG:
            self.refused += 1
        await client.close()


async def _pump(source: ServerConnection | ClientConnection, sink: Any) -> None:
    """Pass ``source``'s messages to ``sink`` until either closes."""
    with contextlib.suppress(ConnectionClosed):
        async for message in source:
            await sink.send(message)
