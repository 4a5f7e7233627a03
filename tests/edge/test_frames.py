"""The frame reader, synchronously: bytes a client sends in, messages and close codes out.

Frames are built byte by byte here (FIN, reserved bits and opcode; the mask bit and the
length in its 7-, 16- or 64-bit form; a fixed mask), so every malformed shape is exact.
"""

from __future__ import annotations

import pytest
from token_relay.edge.frames import MAX_FRAGMENTS, MAX_HELD_FRAME, FrameReader, text_frame
from websockets.frames import Close, Frame, Opcode

MASK = b"\x37\xfa\x21\x3d"


def frame(
    first: int, payload: bytes = b"", *, masked: bool = True, length: int | None = None
) -> bytes:
    """A client's frame: ``first`` is FIN, RSV1-3 and the opcode; ``length`` forces the
    16- (126) or 64-bit (127) form of the length."""
    size = len(payload)
    form = length if length is not None else (size if size < 126 else 126 if size < 65536 else 127)
    head = bytes((first, form | (0x80 if masked else 0)))
    if form == 126:
        head += size.to_bytes(2, "big")
    elif form == 127:
        head += size.to_bytes(8, "big")
    if not masked:
        return head + payload
    return head + MASK + bytes(b ^ MASK[i % 4] for i, b in enumerate(payload))


def text(payload: str | bytes, fin: bool = True) -> bytes:
    encoded = payload.encode() if isinstance(payload, str) else payload
    return frame((0x80 if fin else 0) | 0x1, encoded)


def binary(payload: bytes, fin: bool = True) -> bytes:
    return frame((0x80 if fin else 0) | 0x2, payload)


def cont(payload: bytes | str, fin: bool = True) -> bytes:
    return frame((0x80 if fin else 0), payload.encode() if isinstance(payload, str) else payload)


def close(payload: bytes) -> bytes:
    return frame(0x88, payload)


def ping(payload: bytes = b"") -> bytes:
    return frame(0x89, payload)


def server_close(code: int, reason: str = "") -> bytes:
    """The close frame the server sends (unmasked)."""
    return Frame(Opcode.CLOSE, Close(code, reason).serialize()).serialize(mask=False)


class Reading:
    """A reader and what it delivered."""

    def __init__(self, max_size: int = 1000, stop_after: int | None = None) -> None:
        self.reader = FrameReader(max_size)
        self.messages: list[str | bytes] = []
        self.sizes: list[int] = []
        self.stop_after = stop_after

    def deliver(self, message: str | bytes, payload: bytes) -> bool:
        self.messages.append(message)
        self.sizes.append(len(payload))
        return self.stop_after is not None and len(self.messages) >= self.stop_after

    def receive(self, *reads: bytes) -> list[bool]:
        return [self.reader.receive(data, self.deliver) for data in reads]

    def sent(self) -> list[bytes]:
        return self.reader.protocol.data_to_send()


def read(*reads: bytes, max_size: int = 1000) -> Reading:
    reading = Reading(max_size)
    reading.receive(*reads)
    return reading


# ---------------------------------------------------------------------- data frames


def test_a_text_frame_is_a_str_and_a_binary_frame_bytes() -> None:
    reading = read(text("héllo") + binary(b"\x00\xff"))
    assert reading.messages == ["héllo", b"\x00\xff"]
    assert reading.sizes == [6, 2]
    assert reading.reader.partial == b""
    assert reading.reader.failure is None
    assert reading.sent() == []


def test_an_empty_message_is_a_message() -> None:
    assert read(text(""), binary(b"")).messages == ["", b""]


def test_several_frames_in_one_read_come_out_in_order() -> None:
    frames = [text(str(n)) if n % 2 else binary(b"%d" % n) for n in range(50)]
    reading = read(b"".join(frames))
    assert reading.messages == [str(n) if n % 2 else b"%d" % n for n in range(50)]


@pytest.mark.parametrize(("size", "form"), [(125, 125), (126, 126), (65535, 126), (65536, 127)])
def test_every_form_of_the_length(size: int, form: int) -> None:
    payload = bytes(n % 251 for n in range(size))
    data = binary(payload)
    assert data[1] & 0x7F == form
    assert read(data, max_size=1 << 20).messages == [payload]


def test_a_short_length_in_a_longer_form_is_read() -> None:
    # RFC 6455 asks for the minimal form; websockets and the lean parser both take any.
    assert read(frame(0x81, b"hi", length=126), frame(0x81, b"yo", length=127)).messages == [
        "hi",
        "yo",
    ]


def test_a_frame_split_at_every_byte_boundary_reads_the_same() -> None:
    stream = b"".join(
        [
            text("first"),
            binary(b"x" * 300),  # 16-bit length
            ping(b"p"),
            text("frag", fin=False),
            ping(b"q"),  # a control frame between fragments
            cont("ment", fin=True),
            text("é" * 100),
            frame(0x81, b"late", length=127),
        ]
    )
    expected = ["first", b"x" * 300, "fragment", "é" * 100, "late"]
    pongs = [frame_bytes(0x8A, b"p"), frame_bytes(0x8A, b"q")]
    whole = read(stream)
    assert whole.messages == expected
    assert whole.sent() == pongs
    for cut in range(1, len(stream)):
        reading = read(stream[:cut], stream[cut:])
        assert reading.messages == expected, cut
        assert reading.sent() == pongs, cut
        assert reading.reader.failure is None


def test_a_stream_read_one_byte_at_a_time_reads_the_same() -> None:
    stream = text("one") + binary(b"\x02" * 200) + text("thr", fin=False) + cont("ee")
    reading = read(*(stream[n : n + 1] for n in range(len(stream))))
    assert reading.messages == ["one", b"\x02" * 200, "three"]


def test_a_frame_over_the_held_size_split_across_reads_is_read() -> None:
    payload = b"y" * (MAX_HELD_FRAME + 1)
    data = binary(payload)
    reading = read(data[:1000], data[1000:], max_size=1 << 20)
    assert reading.messages == [payload]


def frame_bytes(first: int, payload: bytes) -> bytes:
    """A server's (unmasked) frame."""
    return bytes((first, len(payload))) + payload


# ---------------------------------------------------------------------- failures


def failed(reading: Reading, code: int, reason: str) -> None:
    assert reading.reader.failure == Close(code, reason)
    assert reading.sent() == [server_close(code, reason), b""]  # b"": end the TCP connection


def test_a_text_frame_that_is_not_utf8_fails_with_1007_and_nothing_after_it_is_read() -> None:
    reading = read(text("before") + text(b"\xff\xfe") + text("after"))
    assert reading.messages == ["before"]
    failed(reading, 1007, "invalid start byte at 0")


def test_invalid_utf8_across_fragments_fails_with_1007() -> None:
    reading = read(text(b"ok \xe2\x82", fin=False) + cont(b"x"))
    assert reading.messages == []
    failed(reading, 1007, "invalid continuation byte at 3")


def test_a_character_split_between_fragments_is_read() -> None:
    euro = "€".encode()
    assert read(text(euro[:2], fin=False) + cont(euro[2:])).messages == ["€"]


def test_an_unmasked_client_frame_fails_with_1002() -> None:
    reading = read(text("fine") + frame(0x81, b"bare", masked=False) + text("after"))
    assert reading.messages == ["fine"]
    failed(reading, 1002, "incorrect masking")


@pytest.mark.parametrize("bit", [0x40, 0x20, 0x10])
def test_a_reserved_bit_fails_with_1002(bit: int) -> None:
    reading = read(frame(0x81 | bit, b"x"))
    assert reading.messages == []
    failed(reading, 1002, "reserved bits must be 0")


@pytest.mark.parametrize("opcode", [3, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF])
def test_a_reserved_opcode_fails_with_1002(opcode: int) -> None:
    reading = read(frame(0x80 | opcode, b"x"))
    assert reading.messages == []
    failed(reading, 1002, "invalid opcode")


def test_a_continuation_frame_with_no_message_under_way_fails_with_1002() -> None:
    reading = read(cont("orphan"))
    failed(reading, 1002, "unexpected continuation frame")


def test_a_data_frame_in_the_middle_of_a_fragmented_message_fails_with_1002() -> None:
    reading = read(text("a", fin=False) + text("b"))
    assert reading.messages == []
    failed(reading, 1002, "expected a continuation frame")


def test_a_control_frame_over_125_bytes_fails_with_1002() -> None:
    reading = read(ping(b"p" * 126))
    failed(reading, 1002, "control frame too long")


def test_a_fragmented_control_frame_fails_with_1002() -> None:
    reading = read(frame(0x09, b"p"))
    failed(reading, 1002, "fragmented control frame")


def test_a_frame_over_the_limit_fails_with_1009() -> None:
    reading = read(binary(b"z" * 1001), max_size=1000)
    assert reading.messages == []
    failed(reading, 1009, "frame with 1001 bytes exceeds limit of 1000 bytes")


@pytest.mark.parametrize(("limit", "size"), [(10, 11), (124, 125), (125, 126), (0, 1)])
def test_a_small_frame_over_a_small_limit_fails_with_1009(limit: int, size: int) -> None:
    # The lean parser's small-frame path takes any frame under 126 bytes as within the
    # limit, so it is off when the limit is under 125 bytes.
    reading = read(text("x" * size), max_size=limit)
    assert reading.messages == []
    failed(reading, 1009, f"frame with {size} bytes exceeds limit of {limit} bytes")


@pytest.mark.parametrize("limit", [10, 125])
def test_a_frame_at_the_limit_is_read(limit: int) -> None:
    assert read(text("x" * limit), max_size=limit).messages == ["x" * limit]


def test_a_fragmented_message_over_the_limit_fails_with_1009() -> None:
    reading = read(text("x" * 600, fin=False) + cont("y" * 401), max_size=1000)
    assert reading.messages == []
    reason = "frame with 401 bytes after reading 600 bytes exceeds limit of 1000 bytes"
    failed(reading, 1009, reason)


def test_a_message_in_the_most_frames_allowed_is_read_and_one_more_fails_with_1009() -> None:
    within = text("a", fin=False) + cont(b"", fin=False) * (MAX_FRAGMENTS - 2) + cont("b")
    assert read(within).messages == ["ab"]
    past = text("a", fin=False) + cont(b"", fin=False) * (MAX_FRAGMENTS - 1) + cont("b")
    reading = read(past + text("after"))
    assert reading.messages == []
    failed(reading, 1009, f"message in more than {MAX_FRAGMENTS} frames")


def test_empty_continuation_frames_hold_nothing_of_their_own() -> None:
    reading = read(text("ab", fin=False) + cont(b"", fin=False) * 10_000)
    assert reading.reader._fragments == bytearray(b"ab")
    reading.receive(cont("c"))
    assert reading.messages == ["abc"]
    assert reading.reader._fragments == bytearray()


def test_a_64_bit_length_over_the_limit_fails_at_its_header() -> None:
    head = bytes((0x82, 0xFF)) + (1 << 40).to_bytes(8, "big") + MASK
    reading = read(head, max_size=1000)
    failed(reading, 1009, f"frame with {1 << 40} bytes exceeds limit of 1000 bytes")


# ---------------------------------------------------------------------- control frames


def test_a_ping_is_answered_with_its_payload_and_a_pong_is_read_quietly() -> None:
    reading = read(ping(b"are you there") + frame(0x8A, b"unasked") + text("after"))
    assert reading.messages == ["after"]
    assert reading.sent() == [frame_bytes(0x8A, b"are you there")]


def test_an_empty_close_is_echoed_and_ends_the_reading() -> None:
    reading = read(text("before") + close(b"") + text("after"))
    assert reading.messages == ["before"]
    assert reading.reader.protocol.close_rcvd == Close(1005, "")
    assert reading.reader.failure is None
    assert reading.sent() == [frame_bytes(0x88, b""), b""]


def test_a_close_with_a_code_and_reason_is_echoed() -> None:
    payload = Close(1000, "bye").serialize()
    reading = read(close(payload))
    assert reading.reader.protocol.close_rcvd == Close(1000, "bye")
    assert reading.reader.failure is None
    assert reading.sent() == [frame_bytes(0x88, payload), b""]


def test_a_close_with_a_1_byte_payload_fails_with_1002() -> None:
    failed(read(close(b"\x03")), 1002, "close frame too short")


@pytest.mark.parametrize("code", [0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000])
def test_a_close_with_a_code_a_peer_may_not_send_fails_with_1002(code: int) -> None:
    failed(read(close(code.to_bytes(2, "big"))), 1002, "invalid status code")


@pytest.mark.parametrize("code", [1000, 1001, 1011, 3000, 4999])
def test_a_close_with_a_code_a_peer_may_send_is_echoed(code: int) -> None:
    reading = read(close(code.to_bytes(2, "big")))
    assert reading.reader.failure is None
    assert reading.reader.protocol.close_rcvd == Close(code, "")


def test_a_close_reason_that_is_not_utf8_fails_with_1007() -> None:
    reading = read(close(b"\x03\xe8\xff"))
    failed(reading, 1007, "invalid start byte at position 0")


def test_a_close_in_the_middle_of_a_fragmented_message_fails_with_1002() -> None:
    reading = read(text("half", fin=False) + close(Close(1000, "").serialize()))
    assert reading.messages == []
    failed(reading, 1002, "incomplete fragmented message")


# ---------------------------------------------------------------------- stopping


def test_a_read_stops_where_deliver_asks_and_resumes_there() -> None:
    reading = Reading(stop_after=2)
    stream = b"".join(text(str(n)) for n in range(5))
    assert reading.receive(stream) == [True]
    assert reading.messages == ["0", "1"]
    assert reading.reader.partial == b"".join(text(str(n)) for n in range(2, 5))
    reading.stop_after = None
    assert reading.reader.resume(reading.deliver) is False
    assert reading.messages == ["0", "1", "2", "3", "4"]
    assert reading.reader.partial == b""


def test_a_stop_with_no_whole_frame_left_is_no_stop() -> None:
    reading = Reading(stop_after=1)
    second = text("second")
    assert reading.receive(text("first") + second[:3]) == [False]
    assert reading.reader.partial == second[:3]
    reading.stop_after = None
    assert reading.receive(second[3:]) == [False]
    assert reading.messages == ["first", "second"]


def test_a_server_text_frame_is_what_websockets_would_send() -> None:
    for size in (0, 125, 126, 65535, 65536):
        payload = b"t" * size
        assert text_frame(payload) == Frame(Opcode.TEXT, payload).serialize(mask=False)
