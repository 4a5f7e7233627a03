"""Tests for token_relay.core.durable: one durable stream's log, offsets, appends and reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from token_relay.core.durable import (
    ENTRY_OVERHEAD,
    OFFSET_EPOCH,
    OFFSET_WIDTH,
    Appended,
    Chunk,
    DurableStream,
    Expiry,
    Limits,
    media_type,
    offset_text,
    position_of,
)
from token_relay.core.durableproducers import Producer
from token_relay.core.errors import StreamRefused

LIMITS = Limits(max_bytes=1000, max_producers=10, max_read_bytes=100)
ROOM = 10_000


def _stream(content_type: str = "text/plain", **kwargs: object) -> DurableStream:
    options: dict[str, object] = {"expiry": Expiry(), "limits": LIMITS, "now": 0.0}
    options.update(kwargs)
    return DurableStream(stream_id=1, content_type=content_type, **options)  # type: ignore[arg-type]


def _append(stream: DurableStream, body: bytes, **kwargs: object) -> Appended:
    options: dict[str, object] = {
        "content_type": stream.content_type,
        "close": False,
        "now": 1.0,
        "room": ROOM,
    }
    options.update(kwargs)
    return stream.append(body, **options)  # type: ignore[arg-type]


def _refused(stream: DurableStream, body: bytes, **kwargs: object) -> StreamRefused:
    with pytest.raises(StreamRefused) as caught:
        _append(stream, body, **kwargs)
    return caught.value


def test_offsets_sort_as_positions_and_read_back() -> None:
    offsets = [offset_text(n) for n in (0, 9, 10, 123456789)]
    assert offsets == sorted(offsets)
    assert offsets[0] == "0000000000000000_0000000000000000"
    assert [position_of(offset) for offset in offsets] == [0, 9, 10, 123456789]
    assert "-1" not in offsets and "now" not in offsets


@given(st.integers(min_value=0, max_value=10**OFFSET_WIDTH - 1))
def test_an_offset_is_its_epoch_and_its_position_padded(position: int) -> None:
    assert offset_text(position) == f"{OFFSET_EPOCH}_{position:0{OFFSET_WIDTH}d}"
    assert position_of(offset_text(position)) == position


@pytest.mark.parametrize(
    "offset", ["", "12", "abc", "0000000000000000_12", "1000000000000000_0000000000000001", "a,b"]
)
def test_a_malformed_offset_is_400(offset: str) -> None:
    with pytest.raises(StreamRefused) as caught:
        position_of(offset)
    assert (caught.value.status, caught.value.code) == (400, "bad_offset")


def test_a_byte_stream_reads_from_any_byte() -> None:
    stream = _stream()
    assert _append(stream, b"hello").next == 5
    assert _append(stream, b" world").next == 11
    assert stream.read(0) == Chunk((b"hello", b" world"), 11)
    assert stream.read(3) == Chunk((b"lo", b" world"), 11)
    assert stream.read(11) == Chunk((), 11)
    with pytest.raises(StreamRefused):
        stream.read(12)


def test_a_read_is_cut_at_its_budget() -> None:
    stream = _stream()
    _append(stream, b"a" * 150)
    first = stream.read(0)
    assert (len(b"".join(first.entries)), first.next) == (100, 100)
    assert stream.read(first.next) == Chunk((b"a" * 50,), 150)


def test_a_json_stream_keeps_each_message() -> None:
    stream = _stream("application/json")
    assert _append(stream, b'[{"a":1}, [2]]').next == 2
    assert _append(stream, b'"three"').next == 3
    assert stream.read(0) == Chunk((b'{"a":1}', b"[2]", b'"three"'), 3)
    assert stream.read(2) == Chunk((b'"three"',), 3)


def test_a_json_read_holds_at_least_one_message_past_its_budget() -> None:
    stream = _stream("application/json")
    big = b'"' + b"x" * 150 + b'"'
    _append(stream, b"[" + big + b", 1]")
    assert stream.read(0) == Chunk((big,), 1)
    assert stream.read(1) == Chunk((b"1",), 2)


def test_json_appends_are_validated_and_an_empty_batch_refused() -> None:
    stream = _stream("application/json")
    assert _refused(stream, b"{nope").code == "invalid_json"
    assert _refused(stream, b"[]").code == "empty_batch"
    assert stream.tail == 0


def test_refusals_come_in_the_protocols_order() -> None:
    stream = _stream()
    _append(stream, b"x", stream_seq="b")
    assert _refused(stream, b"").code == "empty_body"
    assert _refused(stream, b"y", content_type="").code == "content_type_required"
    assert _refused(stream, b"y", content_type="application/json").status == 409
    assert _refused(stream, b"y", stream_seq="a").code == "stream_seq_regression"
    assert _refused(stream, b"y", stream_seq="b").code == "stream_seq_regression"
    assert _append(stream, b"y", stream_seq="c", content_type="TEXT/plain; charset=utf-8").next == 2
    _append(stream, b"", close=True)
    closed = _refused(stream, b"z", content_type="application/json", stream_seq="a")
    assert (closed.status, closed.code) == (409, "stream_closed")
    assert closed.headers == (("Stream-Closed", "true"), ("Stream-Next-Offset", offset_text(2)))


def test_a_close_is_final_and_a_second_close_only_is_idempotent() -> None:
    stream = _stream()
    done = _append(stream, b"last", close=True)
    assert (done.next, done.closed, done.duplicate) == (4, True, False)
    again = _append(stream, b"", close=True)
    assert (again.next, again.closed, again.duplicate) == (4, True, True)
    assert _refused(stream, b"more", close=True).code == "stream_closed"


def test_the_producer_that_closed_may_retry_its_close() -> None:
    stream = _stream()
    closer = Producer("p", 0, 0)
    _append(stream, b"final", close=True, producer=closer)
    retry = _append(stream, b"final", close=True, producer=closer)
    assert (retry.duplicate, retry.closed, retry.producer_seq) == (True, True, 0)
    assert _refused(stream, b"final", close=True, producer=Producer("p", 0, 1)).status == 409
    assert stream.read(0) == Chunk((b"final",), 5)


def test_a_producers_duplicate_appends_nothing_and_answers_its_last_seq() -> None:
    stream = _stream()
    _append(stream, b"a", producer=Producer("p", 0, 0))
    _append(stream, b"b", producer=Producer("p", 0, 1))
    duplicate = _append(stream, b"a", producer=Producer("p", 0, 0))
    assert (duplicate.duplicate, duplicate.producer_epoch, duplicate.producer_seq) == (True, 0, 1)
    assert stream.read(0).entries == (b"a", b"b")


def test_bounds_refuse_and_change_nothing() -> None:
    stream = _stream()  # each entry counts its bytes and ENTRY_OVERHEAD
    _append(stream, b"x" * (890 - ENTRY_OVERHEAD))
    full = _refused(stream, b"y" * (111 - ENTRY_OVERHEAD))
    assert (full.status, full.code) == (413, "stream_full")
    store = _refused(stream, b"y" * 5, room=4 + ENTRY_OVERHEAD)
    assert (store.status, store.code) == (507, "store_full")
    assert (stream.tail, stream.own_bytes) == (890 - ENTRY_OVERHEAD, 890)


def test_the_sliding_ttl_counts_from_the_last_touch() -> None:
    stream = _stream(expiry=Expiry(ttl=10), now=100.0)
    assert not stream.expired(109.9)
    assert stream.expired(110.0)
    stream.touch(105.0)
    assert not stream.expired(114.0)
    assert stream.expired(115.0)
    fixed = _stream(expiry=Expiry(expires_at=50.0), now=0.0)
    fixed.touch(49.0)
    assert fixed.expired(50.0)
    assert not _stream(now=0.0).expired(10**12)


def test_a_fork_reads_its_source_to_the_fork_point_then_its_own() -> None:
    source = _stream()
    _append(source, b"hello")
    fork = _stream(source=source, fork_position=3)
    _append(source, b" later")  # past the fork point: never the fork's
    assert fork.read(0) == Chunk((b"hel",), 3)
    assert _append(fork, b"p!").next == 5
    assert fork.read(0) == Chunk((b"hel", b"p!"), 5)
    assert fork.read(1) == Chunk((b"el", b"p!"), 5)
    assert fork.read(4) == Chunk((b"!",), 5)
    assert fork.own_bytes == 2 + ENTRY_OVERHEAD


def test_the_etag_changes_with_the_data_and_the_closure() -> None:
    stream = _stream()
    _append(stream, b"abc")
    open_tag = stream.etag(0, 3)
    _append(stream, b"", close=True)
    assert stream.etag(0, 3) != open_tag
    assert stream.etag(0, 3).endswith(':c"')


def test_a_stream_holds_a_window_of_its_log_read_elsewhere() -> None:
    stream = _stream()
    _append(stream, b"abc")
    _append(stream, b"de")
    assert stream.logged() == [(0, b"abc"), (3, b"de")]
    loaded = _stream()
    loaded.tail = 5
    loaded.hold([(3, b"de")])  # only the entries a read from 4 needs
    assert loaded.read(4) == Chunk((b"e",), 5)


_TYPES = st.sampled_from(
    ["text/plain", "Text/Plain", "text/plain; charset=utf-8", " text/plain ", "text/html", ""]
)


@given(stream_type=_TYPES, sent=_TYPES)
def test_an_append_of_another_media_type_is_refused_whatever_its_spelling(
    stream_type: str, sent: str
) -> None:
    stream = _stream(stream_type or "text/plain")
    if not sent:
        assert _refused(stream, b"x", content_type=sent).code == "content_type_required"
    elif media_type(sent) != media_type(stream.content_type):
        assert _refused(stream, b"x", content_type=sent).code == "content_type_mismatch"
    else:
        assert _append(stream, b"x", content_type=sent).next == 1


@given(
    st.lists(
        st.tuples(st.sampled_from([b"", b"a", b"bcd", b"[1,2]", b"[]"]), st.booleans()),
        max_size=8,
    ),
    st.booleans(),
)
def test_an_append_tells_the_tail_it_found(steps: list[tuple[bytes, bool]], json: bool) -> None:
    stream = _stream("application/json" if json else "text/plain")
    for body, close in steps:
        tail = stream.tail
        try:
            appended = _append(stream, body, close=close)
        except StreamRefused:
            assert stream.tail == tail
            continue
        assert appended.before == tail
        assert appended.next == stream.tail
        assert appended.next - appended.before == (
            (len(body) if not json else len(body.strip(b"[]").split(b","))) if body else 0
        )


def test_a_duplicate_tells_the_tail_as_before_and_next() -> None:
    stream = _stream()
    producer = Producer("p", 0, 0)
    first = _append(stream, b"ab", producer=producer)
    assert (first.before, first.next, first.duplicate) == (0, 2, False)
    again = _append(stream, b"ab", producer=producer)
    assert (again.before, again.next, again.duplicate) == (2, 2, True)
    closed = _append(stream, b"", close=True)
    assert (closed.before, closed.next, closed.closed) == (2, 2, True)
    repeat = _append(stream, b"", close=True)
    assert (repeat.before, repeat.next, repeat.duplicate) == (2, 2, True)


@given(
    st.lists(
        st.tuples(st.binary(max_size=30), st.integers(0, 60).map(lambda n: n + ENTRY_OVERHEAD)),
        max_size=10,
    ),
    st.sampled_from(["text/plain", "application/json"]),
)
def test_an_append_logs_as_the_general_path_does(
    steps: list[tuple[bytes, int]], content_type: str
) -> None:
    limits = Limits(max_bytes=80 + 3 * ENTRY_OVERHEAD, max_producers=10, max_read_bytes=1000)
    fast, general = _stream(content_type, limits=limits), _stream(content_type, limits=limits)
    for body, room in steps:
        try:
            entries = general.entries_of(body, creating=False) if body else None
            if entries is not None:
                general.check_room(entries, room)
        except StreamRefused as refused:
            expected: tuple[int, str] | None = (refused.status, refused.code)
        else:
            expected = None if body else (400, "empty_body")
        try:
            appended = _append(fast, body, room=room)
        except StreamRefused as refused:
            assert (refused.status, refused.code) == expected
            continue
        assert expected is None and entries is not None
        assert appended.added_bytes == general.extend(entries)
        assert (fast.tail, fast.own_bytes, appended.next) == (
            general.tail,
            general.own_bytes,
            general.tail,
        )
        assert fast.logged() == general.logged()
        assert fast.read(0) == general.read(0)
