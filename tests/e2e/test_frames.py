"""The WebSocket edge's frame reading, step by step: the lean parser and websockets' own.

Whole unfragmented data frames are read by the relay's lean parser; anything else goes
to websockets' ``Protocol``. Over generated streams of client frames (text, binary,
pings and pongs, fragmented messages with pings between their fragments, frames too big
to gather, invalid UTF-8, frames over the size limit, a close) cut into reads at random
places, the connection yields exactly the messages the stream holds, in order, answers
every ping, and ends with the close code the stream calls for.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from token_relay.core.grants import OPEN
from token_relay.edge import websocket
from token_relay.edge.frames import MAX_HELD_FRAME
from token_relay.edge.websocket import Cork, WebSocket, text_frame
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import CLIENT, Protocol
from websockets.utils import apply_mask

MAX_SIZE = 2 * MAX_HELD_FRAME


class Transport(asyncio.Transport):
    """What the connection writes, and whether it was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


text = st.text(alphabet=st.sampled_from('ab é🚀\n"'), max_size=40)
small = st.binary(max_size=40)


@st.composite
def pieces(draw: st.DrawFn) -> tuple[list[Frame], list[Any], list[bytes], int]:
    """Client frames, the messages they hold, the pongs they call for, the close code."""
    frames: list[Frame] = []
    messages: list[Any] = []
    pongs: list[bytes] = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(
            st.sampled_from(["text", "text", "text", "binary", "ping", "pong", "fragments", "big"])
        )
        if kind == "text":
            value = draw(text)
            frames.append(Frame(Opcode.TEXT, value.encode()))
            messages.append(value)
        elif kind == "binary":
            data = draw(small)
            frames.append(Frame(Opcode.BINARY, data))
            messages.append(data)
        elif kind == "ping":
            data = draw(st.binary(max_size=20))
            frames.append(Frame(Opcode.PING, data))
            pongs.append(data)
        elif kind == "pong":
            frames.append(Frame(Opcode.PONG, draw(small)))
        elif kind == "fragments":
            data = draw(text).encode()
            cuts = sorted(draw(st.lists(st.integers(0, len(data)), min_size=1, max_size=3)))
            parts = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
            for n, part in enumerate(parts):
                opcode = Opcode.TEXT if n == 0 else Opcode.CONT
                frames.append(Frame(opcode, part, fin=n == len(parts) - 1))
                if n < len(parts) - 1 and draw(st.booleans()):
                    frames.append(Frame(Opcode.PING, b"between"))
                    pongs.append(b"between")
            messages.append(data.decode())
        else:  # bigger than the lean parser gathers across reads
            value = "x" * draw(st.integers(MAX_HELD_FRAME - 20, MAX_HELD_FRAME + 20))
            frames.append(Frame(Opcode.TEXT, value.encode()))
            messages.append(value)
    end = draw(st.sampled_from(["close", "close", "invalid utf-8", "too big"]))
    if end == "close":
        frames.append(Frame(Opcode.CLOSE, Close(1000, "bye").serialize()))
        code = 1000
    elif end == "invalid utf-8":
        frames.append(Frame(Opcode.TEXT, b"ok \xff"))
        code = 1007
    else:
        frames.append(Frame(Opcode.TEXT, b"y" * (MAX_SIZE + 1)))
        code = 1009
    # What follows the end is never read as a message.
    frames.append(Frame(Opcode.TEXT, b"after the end"))
    return frames, messages, pongs, code


def _masked(frame: Frame, mask: bytes) -> bytes:
    """``frame`` as a client sends it, masked with ``mask``."""
    plain = frame.serialize(mask=False)
    head = 2 + {126: 2, 127: 8}.get(plain[1] & 0x7F, 0)
    payload = apply_mask(plain[head:], mask)
    return bytes((plain[0], plain[1] | 0x80)) + plain[2:head] + mask + payload


def _stream(frames: list[Frame], data: st.DataObject) -> bytes:
    """The frames masked as a client would, with keys hypothesis draws (so a failure is
    played again exactly; keys that look like frame headers included)."""
    keys = st.one_of(st.binary(min_size=4, max_size=4), st.sampled_from([b"\x81\x85\x00\x00"]))
    masks = data.draw(st.lists(keys, min_size=len(frames), max_size=len(frames)))
    return b"".join(_masked(frame, mask) for frame, mask in zip(frames, masks, strict=True))


def _connection(transport: Transport, max_size: int = MAX_SIZE) -> WebSocket:
    """A producer's WebSocket over ``transport``, as the edge makes one after a handshake."""
    return WebSocket(
        transport,
        path="/produce",
        client="127.0.0.1",
        grant=OPEN,
        max_size=max_size,
        max_unsent=0,
        cork=Cork(asyncio.get_running_loop()),
    )


def _server_frames(data: bytes) -> list[Frame]:
    """The frames the relay wrote, read as a client reads them."""
    client = Protocol(CLIENT, max_size=None)
    client.receive_data(data)
    return [event for event in client.events_received() if isinstance(event, Frame)]


async def _play(stream: bytes, cuts: list[int]) -> tuple[list[Any], Transport]:
    transport = Transport()
    ws = _connection(transport)
    for start, stop in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        ws.receive(stream[start:stop])
        await asyncio.sleep(0)  # the end of a pass of the loop: held writes go out
    received: list[Any] = []
    async with asyncio.timeout(5):
        async for message in ws:
            received.append(message)
    await asyncio.sleep(0)
    return received, transport


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces(), st.data())
def test_every_message_is_read_once_in_order_however_the_reads_fall(
    case: tuple[list[Frame], list[Any], list[bytes], int], data: st.DataObject
) -> None:
    frames, messages, pongs, code = case
    stream = _stream(frames, data)
    cut_at = st.integers(0, len(stream))
    cuts = sorted(
        set(
            data.draw(st.lists(cut_at, max_size=8))
            + data.draw(st.lists(st.integers(0, min(len(stream), 40)), max_size=3))
        )
    )
    received, transport = asyncio.run(_play(stream, cuts))
    assert received == messages
    written = _server_frames(bytes(transport.written))
    assert [f.data for f in written if f.opcode is Opcode.PONG] == pongs
    closes = [Close.parse(f.data).code for f in written if f.opcode is Opcode.CLOSE]
    assert closes == [code]


async def _dispatch(
    stream: bytes, cuts: list[int], waits: set[int], pauses: list[bool]
) -> list[Any]:
    """Feed the stream to a connection served by ``dispatch``; the handler asks to wait
    after the messages numbered in ``waits`` and checks nothing is handled meanwhile."""
    transport = Transport()
    ws = _connection(transport)
    handled: list[Any] = []
    waiting = False

    async def wait() -> None:
        nonlocal waiting
        for _ in range(3):
            await asyncio.sleep(0)  # reads go on meanwhile: their messages must queue
        waiting = False

    def handle(message: str | bytes) -> Any:
        nonlocal waiting
        assert not waiting, "a message was handled while the one before it was waited for"
        handled.append(message)
        if len(handled) in waits:
            waiting = True
            return wait()
        return None

    serving = asyncio.ensure_future(ws.dispatch(handle))
    reads = zip([0, *cuts], [*cuts, len(stream)], strict=True)
    for (start, stop), pause in zip(reads, pauses + [True] * len(stream), strict=False):
        ws.receive(stream[start:stop])
        if pause:  # else the next read comes before the loop runs anything else
            await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await serving
    return handled


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces(), st.data())
def test_dispatch_hands_over_every_message_once_in_order_waiting_when_asked(
    case: tuple[list[Frame], list[Any], list[bytes], int], data: st.DataObject
) -> None:
    frames, messages, _, _ = case
    stream = _stream(frames, data)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(stream)), max_size=8))))
    waits = set(data.draw(st.lists(st.integers(1, max(1, len(messages))), max_size=4)))
    pauses = data.draw(st.lists(st.booleans(), max_size=len(cuts) + 1))
    share = data.draw(st.sampled_from([2, websocket.FAIR_SHARE]))
    saved, websocket.FAIR_SHARE = websocket.FAIR_SHARE, share  # few per read: more queue
    try:
        assert asyncio.run(_dispatch(stream, cuts, waits, pauses)) == messages
    finally:
        websocket.FAIR_SHARE = saved


class PausingTransport(Transport):
    """A transport that says whether its socket is being read."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


async def test_a_flood_in_one_read_is_handled_a_fair_share_at_a_time() -> None:
    transport = PausingTransport()
    ws = _connection(transport)
    handled: list[Any] = []
    serving = asyncio.ensure_future(ws.dispatch(lambda message: handled.append(message)))
    await asyncio.sleep(0)  # the dispatcher waits for messages to come
    count = 10 * websocket.FAIR_SHARE
    flood = b"".join(Frame(Opcode.TEXT, str(n).encode()).serialize(mask=True) for n in range(count))
    ws.receive(flood)
    # Within the read itself: a fair share, and the socket is no longer read.
    assert len(handled) == websocket.FAIR_SHARE
    assert not transport.reading
    for _ in range(count):
        if len(handled) == count:
            break
        await asyncio.sleep(0)
    assert handled == [str(n) for n in range(count)]
    assert transport.reading  # all handled: read again
    ws.receive(Frame(Opcode.CLOSE, Close(1000, "").serialize()).serialize(mask=True))
    await asyncio.wait_for(serving, 5)


async def test_messages_behind_one_still_handled_stop_the_reading_at_the_queue_limit() -> None:
    """While the endpoint is busy with a message, the ones after it queue; at
    ``MAX_QUEUE`` of them the socket is no longer read, and once they are handled it is."""
    transport = PausingTransport()
    ws = _connection(transport)
    handled: list[Any] = []
    busy = asyncio.Event()

    def handle(message: str | bytes) -> Any:
        handled.append(message)
        return busy.wait() if len(handled) == 1 else None

    serving = asyncio.ensure_future(ws.dispatch(handle))
    await asyncio.sleep(0)

    def frames(numbers: range) -> bytes:
        return b"".join(Frame(Opcode.TEXT, str(n).encode()).serialize(mask=True) for n in numbers)

    ws.receive(frames(range(websocket.MAX_QUEUE - 1)))
    await asyncio.sleep(0)
    assert handled == ["0"] and transport.reading  # 14 wait: under the limit
    ws.receive(frames(range(websocket.MAX_QUEUE - 1, websocket.MAX_QUEUE + 1)))
    assert not transport.reading  # 16 wait
    busy.set()
    for _ in range(100):
        if len(handled) == websocket.MAX_QUEUE + 1:
            break
        await asyncio.sleep(0)
    assert handled == [str(n) for n in range(websocket.MAX_QUEUE + 1)]
    assert transport.reading
    ws.receive(Frame(Opcode.CLOSE, Close(1000, "").serialize()).serialize(mask=True))
    await asyncio.wait_for(serving, 5)


@pytest.mark.parametrize("end", ["lost", "eof"])
async def test_a_flood_read_before_the_socket_ends_is_handled_whole(end: str) -> None:
    """The part of a read left for the loop's next pass is still handled, in order, when
    the socket ends (or the peer half-closes) before that pass comes."""
    transport = PausingTransport()
    ws = _connection(transport)
    handled: list[Any] = []
    serving = asyncio.ensure_future(ws.dispatch(lambda message: handled.append(message)))
    await asyncio.sleep(0)
    count = 3 * websocket.FAIR_SHARE + 5
    flood = b"".join(Frame(Opcode.TEXT, str(n).encode()).serialize(mask=True) for n in range(count))
    ws.receive(flood[:-3])  # the last frame is cut: it never came whole
    assert len(handled) == websocket.FAIR_SHARE
    if end == "lost":
        ws.lost()
    else:
        ws.receive_eof()
    await asyncio.wait_for(serving, 5)
    assert handled == [str(n) for n in range(count - 1)]


@pytest.mark.parametrize("limit", [10, 124, 125])
async def test_a_small_frame_over_a_small_limit_is_refused(limit: int) -> None:
    """The common small frame is read with one check, which holds only when every frame
    that small is within the limit: a frame one byte over a limit at or under 125 bytes
    is still refused (1009), and nothing after it is read."""
    transport = Transport()
    ws = _connection(transport, max_size=limit)
    mask = b"\x01\x02\x03\x04"
    within, over = "a" * limit, "b" * (limit + 1)
    frames = [Frame(Opcode.TEXT, t.encode()) for t in (within, over)]
    frames.append(Frame(Opcode.CLOSE, Close(1000, "bye").serialize()))
    ws.receive(b"".join(_masked(frame, mask) for frame in frames))
    async with asyncio.timeout(5):
        received = [message async for message in ws]
    await asyncio.sleep(0)
    written = _server_frames(bytes(transport.written))
    assert received == [within]
    assert [Close.parse(f.data).code for f in written if f.opcode is Opcode.CLOSE] == [1009]


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_text_frames_are_the_bytes_websockets_would_send(size: int) -> None:
    """The relay frames what it sends by hand: byte for byte websockets' own frame, at
    every boundary of the length's encoding, and websockets reads it back as sent."""
    payload = bytes((n * 7) % 256 for n in range(size))
    assert text_frame(payload) == Frame(Opcode.TEXT, payload).serialize(mask=False)
    reader = Protocol(CLIENT)
    reader.receive_data(text_frame(payload))
    [event] = reader.events_received()
    assert isinstance(event, Frame) and event.fin and event.data == payload


def test_the_hot_path_reads_the_event_loops_own_clock() -> None:
    """asyncio's loop: the very ``time.monotonic`` its ``time()`` returns; uvloop: its own."""
    import time

    import uvloop
    from token_relay.edge.flow import loop_clock

    loop = asyncio.new_event_loop()
    try:
        assert loop_clock(loop) is time.monotonic
        before = loop.time()
        assert before <= loop_clock(loop)() <= loop.time()
    finally:
        loop.close()
    other = uvloop.new_event_loop()
    try:
        assert loop_clock(other) == other.time
    finally:
        other.close()
