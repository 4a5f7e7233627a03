"""Each entry of a durable stream's log counts :data:`~token_relay.core.durable.ENTRY_OVERHEAD`
on top of its data: a JSON-array body of many tiny elements (one entry each) is counted as
what holding it costs, so the stream's bound and the store's total refuse it as they refuse
any append past them (413 ``stream_full``, 507 ``store_full``: nothing changes)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from token_relay.core.durable import ENTRY_OVERHEAD, Limits, counted_bytes
from token_relay.core.durablejson import messages_of
from token_relay.core.durablestore import Create, MemoryStore
from token_relay.core.errors import StreamRefused

JSON = "application/json"


def _tiny(count: int, element: bytes = b"1") -> bytes:
    """A JSON array of ``count`` copies of ``element``: one message each."""
    return b"[" + b",".join([element] * count) + b"]"


def _store(max_bytes: int, max_total_bytes: int = 1 << 30) -> MemoryStore:
    store = MemoryStore(
        max_streams=4,
        max_total_bytes=max_total_bytes,
        limits=Limits(max_bytes=max_bytes, max_producers=4),
    )
    store.create("/s", Create(JSON), 0.0)
    return store


def _refused(store: MemoryStore, body: bytes) -> StreamRefused:
    with pytest.raises(StreamRefused) as caught:
        store.append("/s", body, content_type=JSON, close=False, now=1.0)
    return caught.value


def test_many_tiny_messages_pass_the_stream_bound_by_their_overhead() -> None:
    bound = 4096
    body = _tiny(1000)  # 1,000 bytes of data, far under the bound as data alone
    assert sum(map(len, messages_of(body))) == 1000 < bound
    store = _store(max_bytes=bound)
    refused = _refused(store, body)
    assert (refused.status, refused.code) == (413, "stream_full")
    stream = store.get("/s", 1.0)
    assert (stream.tail, stream.own_bytes, store.total_bytes) == (0, 0, 0)
    # What fits is the data and the overhead of each entry, to the byte.
    fits = bound // (1 + ENTRY_OVERHEAD)
    appended = store.append("/s", _tiny(fits), content_type=JSON, close=False, now=1.0)
    assert appended.added_bytes == store.total_bytes == fits * (1 + ENTRY_OVERHEAD)
    assert _refused(store, _tiny(1)).code == "stream_full"
    assert stream.read(0).entries == (b"1",) * fits


def test_many_tiny_messages_pass_the_stores_total_by_their_overhead() -> None:
    store = _store(max_bytes=1 << 30, max_total_bytes=4096)
    refused = _refused(store, _tiny(1000))
    assert (refused.status, refused.code) == (507, "store_full")
    assert (store.get("/s", 1.0).tail, store.total_bytes) == (0, 0)


def test_a_byte_streams_appends_each_count_their_overhead() -> None:
    store = MemoryStore(
        max_streams=4, max_total_bytes=1 << 30, limits=Limits(max_bytes=3 * 100, max_producers=4)
    )
    store.create("/b", Create("text/plain"), 0.0)
    for _ in range(3):  # each counted 100 bytes: its data and ENTRY_OVERHEAD
        store.append(
            "/b", b"x" * (100 - ENTRY_OVERHEAD), content_type="text/plain", close=False, now=1.0
        )
    with pytest.raises(StreamRefused) as caught:
        store.append("/b", b"y", content_type="text/plain", close=False, now=1.0)
    assert caught.value.code == "stream_full"
    assert (store.get("/b", 1.0).tail, store.total_bytes) == (3 * (100 - ENTRY_OVERHEAD), 300)


@pytest.mark.parametrize("element", [b"1", b'"a"', b'"abcdefghijklmnopqrstuvwxyz"'])
def test_what_a_stream_counts_bounds_what_it_holds(element: bytes) -> None:
    """The bytes a body of tiny messages adds to the process (as tracemalloc counts them,
    once the body and its parse are gone) are at most what the store counts for it."""
    store = _store(max_bytes=1 << 30)
    body = _tiny(20_000, element)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        store.append("/s", body, content_type=JSON, close=False, now=1.0)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= store.total_bytes, (held, store.total_bytes)
    assert store.total_bytes == counted_bytes([element] * 20_000)
