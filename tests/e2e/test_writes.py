"""A WebSocket's writes over a real socket: straight to it while the transport holds
nothing, behind what it holds otherwise, and never out of order.

The server side is the relay's :class:`WebSocket` over asyncio's own transport of a real
loopback TCP connection; the client side is a plain socket that reads when the test says.
Small socket buffers make the kernel refuse most of a burst, so frames go to the socket,
then to the transport's buffer, then to the socket again once it drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import uvloop
from token_relay.core.grants import OPEN
from token_relay.edge.websocket import Cork, WebSocket, text_frame
from websockets.frames import Frame
from websockets.protocol import CLIENT, Protocol

SMALL_BUFFER = 4096


def _subscriber(transport: asyncio.Transport) -> WebSocket:
    """A subscriber's WebSocket over ``transport``, as the edge makes one after a handshake."""
    return WebSocket(
        transport,
        path="/subscribe",
        client="127.0.0.1",
        grant=OPEN,
        max_size=1 << 20,
        max_unsent=0,
        cork=Cork(asyncio.get_running_loop()),
    )


class _Edge(asyncio.Protocol):
    """What the relay's HTTP edge does for an upgraded socket, and no more."""

    def __init__(self, counting: bool = True) -> None:
        self.counting = counting
        self.ws: WebSocket | None = None
        self.made: asyncio.Future[WebSocket] = asyncio.get_running_loop().create_future()
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.through_transport = 0
        """Bytes handed to the transport's own ``write`` (the rest went straight out)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's are not its subclasses
        self.ws = _subscriber(transport)
        self.made.set_result(self.ws)
        if not self.counting:
            return  # uvloop's transports take no wrapper
        write = transport.write

        def counted(data: Any) -> None:
            self.through_transport += len(data)
            write(data)

        transport.write = counted  # type: ignore[method-assign]

    def data_received(self, data: bytes) -> None:
        assert self.ws is not None
        self.ws.receive(data)

    def connection_lost(self, exc: Exception | None) -> None:
        assert self.ws is not None
        self.ws.lost()
        self.lost.set_result(exc)

    def pause_writing(self) -> None:
        assert self.ws is not None
        self.ws.pause_writing()

    def resume_writing(self) -> None:
        assert self.ws is not None
        self.ws.resume_writing()


@contextlib.asynccontextmanager
async def _pair(edge: _Edge) -> AsyncIterator[tuple[_Edge, socket.socket]]:
    """The relay's side of a loopback connection, and the client's plain socket."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: edge, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
    client.setblocking(False)
    await loop.sock_connect(client, ("127.0.0.1", port))
    ws = await asyncio.wait_for(edge.made, 5)
    sock = ws.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
    try:
        yield edge, client
    finally:
        client.close()
        server.close()
        await server.wait_closed()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[_Edge, socket.socket]]:
    async with _pair(_Edge()) as made:
        yield made


async def _read(client: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    received = bytearray()
    async with asyncio.timeout(10):
        while len(received) < size:
            chunk = await loop.sock_recv(client, 1 << 16)
            assert chunk, "the relay closed the connection"
            received += chunk
    return bytes(received)


async def _burst(ws: WebSocket, client: socket.socket) -> tuple[list[bytes], bytes, int]:
    """Bursts of frames, some passes of the loop one frame, some many (held by the cork),
    the client reading a little now and then; the frames, what the client read, and how
    often it read while the transport held bytes."""
    draw = random.Random(20261202)
    frames: list[bytes] = []
    wire = b""
    partly_drained = 0
    for burst in range(40):
        for _ in range(draw.choice([1, 1, 3, 20])):
            payload = f"{burst}:{len(frames)}:".encode() + b"x" * draw.randrange(0, 3000)
            frames.append(text_frame(payload))
            ws.write_frame(frames[-1])
        await asyncio.sleep(0)
        held = ws.transport.get_write_buffer_size()
        if held and burst % 7 == 0:
            # The client reads a little: the transport drains some, not all, of its bytes.
            wire += await _read(client, 1)
            partly_drained += 1
    wire += await _read(client, sum(map(len, frames)) - len(wire))
    return frames, wire, partly_drained


async def test_a_burst_too_big_for_the_socket_arrives_whole_and_in_order(
    pair: tuple[_Edge, socket.socket],
) -> None:
    edge, client = pair
    frames, wire, partly_drained = await _burst(edge.made.result(), client)
    total = sum(map(len, frames))
    assert 0 < edge.through_transport < total, "both ways were taken"
    assert partly_drained, "frames were written while the transport held bytes"
    assert wire == b"".join(frames)
    reader = Protocol(CLIENT, max_size=None)
    reader.receive_data(wire)
    got = [event.data for event in reader.events_received() if isinstance(event, Frame)]
    assert got == [frame[2 + {126: 2, 127: 8}.get(frame[1], 0) :] for frame in frames]


def test_on_uvloop_a_burst_too_big_for_the_socket_arrives_whole_and_in_order() -> None:
    # uvloop's transports buffer in C (and count it in get_write_buffer_size): the same.
    async def run() -> tuple[list[bytes], bytes, int]:
        async with _pair(_Edge(counting=False)) as (edge, client):
            return await _burst(edge.made.result(), client)

    frames, wire, partly_drained = uvloop.run(run())
    assert partly_drained, "frames were written while the transport held bytes"
    assert wire == b"".join(frames)


async def test_a_lone_frame_to_an_idle_socket_goes_straight_to_it(
    pair: tuple[_Edge, socket.socket],
) -> None:
    edge, client = pair
    ws = edge.made.result()
    for n in range(50):
        frame = text_frame(b'{"n":%d}' % n)
        ws.write_frame(frame)
        assert await _read(client, len(frame)) == frame  # a pass of its own: a first write
    assert edge.through_transport == 0


async def test_writes_to_a_reset_socket_end_the_connection_and_raise_nothing(
    pair: tuple[_Edge, socket.socket],
) -> None:
    edge, client = pair
    ws = edge.made.result()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # a reset, with no close frame
    await asyncio.sleep(0.05)
    async with asyncio.timeout(5):
        while not edge.lost.done():
            ws.write_frame(text_frame(b"after the reset"))
            await asyncio.sleep(0.01)
    assert isinstance(await edge.lost, ConnectionError)
    assert ws.transport.is_closing()
    ws.write_frame(text_frame(b"after the end"))  # no longer written: nothing happens


class _TlsTransport(asyncio.Transport):
    """A transport whose socket carries TLS records, not the frames."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock
        self.written = bytearray()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sslcontext": object(), "socket": self.sock}.get(name, default)

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


async def test_a_tls_transport_gets_every_byte_itself() -> None:
    left, right = socket.socketpair()
    with left, right:
        transport = _TlsTransport(left)
        ws = _subscriber(transport)
        frame = text_frame(b"secret")
        ws.write_frame(frame)
        assert bytes(transport.written) == frame
        right.setblocking(False)
        with pytest.raises(BlockingIOError):
            right.recv(100)  # nothing reached the socket around the transport
