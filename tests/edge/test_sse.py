"""An SSE stream writes a broadcast frame as the event it would make of the frame alone.

Every stream of a broadcast shares what is read of the frame (its fields) and, where its
event is the same as another's, the bytes themselves (built once, by the first stream).
Generated frames (confirmations, messages, aborts with their positions, deltas,
unsubscribes, errors, frames without a position) go to streams holding generated
positions, chunked (HTTP/1.1) or not (HTTP/1.0): every stream's bytes must be, frame by
frame, the event a stream of its own would write, its ``id:`` that stream's positions.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from token_relay.core.grants import OPEN
from token_relay.core.resume import encode_positions
from token_relay.edge.broadcast import Broadcast, event_fields
from token_relay.edge.http11 import Http11
from token_relay.edge.sse import SseStream

CHANNELS = ("a", "b", "c")
EPOCHS = ("e1", "e2")

Positions = dict[str, tuple[int, str]]


@dataclass
class KeptTransport:
    """A transport that keeps what is written, and may be closed."""

    written: bytearray = field(default_factory=bytearray)
    closing: bool = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: bytes) -> None:
        assert not self.closing
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0


def _stream(positions: Positions, version: bytes) -> tuple[SseStream, KeptTransport]:
    """A started stream of a request of HTTP ``version``, its head already written."""
    http = Http11()
    http.receive_data(b"GET /sse?channel=a HTTP/" + version + b"\r\nHost: r\r\n\r\n")
    http.next_event()
    transport = KeptTransport()
    stream = SseStream(
        transport,  # type: ignore[arg-type]
        http,
        path="/sse?channel=a",
        client="127.0.0.1",
        grant=OPEN,
        positions=dict(positions),
    )
    stream.start()
    transport.written.clear()
    return stream, transport


def _expected(data: bytes, positions: Positions, chunked: bool) -> bytes:
    """The event a stream holding ``positions`` writes for ``data`` alone (``positions``
    moved as the frame moves them)."""
    fields = event_fields(data)
    if fields.channel is not None:
        if fields.offset < 0:
            positions.pop(fields.channel, None)
        else:
            positions[fields.channel] = (fields.offset, fields.epoch)
    event = fields.line
    if fields.identified:
        event += b"id: " + encode_positions(positions).encode() + b"\n"
    event += b"data: " + data + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(event), event) if chunked else event


_positions = st.dictionaries(
    st.sampled_from(CHANNELS), st.tuples(st.integers(0, 9), st.sampled_from(EPOCHS)), max_size=3
)


@st.composite
def _frames(draw: st.DrawFn) -> bytes:
    kind = draw(
        st.sampled_from(["subscribed", "message", "aborted", "delta", "unsubscribed", "error"])
    )
    frame: dict[str, Any] = {"type": kind, "channel": draw(st.sampled_from(CHANNELS))}
    if kind == "error":
        frame = {"type": "error", "code": "x", "message": "y"}
    elif kind != "delta" and kind != "unsubscribed" and draw(st.booleans()):
        frame["offset"] = draw(st.integers(0, 9))
        frame["epoch"] = draw(st.sampled_from(EPOCHS))
        if kind == "subscribed":
            frame["replayed"] = draw(st.integers(0, 12))
    frame["text"] = draw(st.text(max_size=5))
    return json.dumps(frame, ensure_ascii=False).encode()


@settings(max_examples=300, deadline=None)
@given(
    streams=st.lists(st.tuples(_positions, st.booleans()), min_size=1, max_size=6),
    frames=st.lists(_frames(), min_size=1, max_size=8),
    closed=st.sets(st.integers(0, 5)),
)
def test_a_broadcast_is_each_streams_own_event(
    streams: list[tuple[Positions, bool]], frames: list[bytes], closed: set[int]
) -> None:
    async def run() -> None:
        made = [_stream(positions, b"1.1" if chunked else b"1.0") for positions, chunked in streams]
        expected = [bytearray() for _ in made]
        held = [dict(positions) for positions, _ in streams]
        for number, data in enumerate(frames):
            broadcast = Broadcast(data)
            for index, (stream, transport) in enumerate(made):
                if index in closed and number == 1:
                    transport.closing = True  # a stream that goes away keeps its positions
                stream.take(broadcast)
                event = _expected(data, held[index], streams[index][1])
                if not transport.closing:
                    expected[index] += event
        for index, (stream, transport) in enumerate(made):
            assert bytes(transport.written) == bytes(expected[index])
            assert stream.positions == held[index]

    asyncio.run(run())


async def test_write_event_reads_a_frame_once_for_the_next_stream() -> None:
    data = json.dumps({"type": "message", "channel": "a", "offset": 3, "epoch": "e1"}).encode()
    one, first = _stream({}, b"1.1")
    other, second = _stream({}, b"1.1")
    fields = one.write_event(data)
    assert other.write_event(data, fields) is fields
    assert first.written == second.written == _expected(data, {}, True)
