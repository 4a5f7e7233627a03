"""Tests for token_relay.core.durablestore: streams by path, forks, tombstones, expiry, bounds."""

from __future__ import annotations

import pytest
from token_relay.core.durable import ENTRY_OVERHEAD, Expiry, Limits, offset_text
from token_relay.core.durablestore import Create, MemoryStore
from token_relay.core.errors import StreamRefused

TEXT = "text/plain"


def _store(**kwargs: int) -> MemoryStore:
    options = {"max_streams": 10, "max_total_bytes": 1000}
    options.update(kwargs)
    return MemoryStore(limits=Limits(max_bytes=500, max_producers=4), **options)


def _refused(call: object, *args: object, **kwargs: object) -> StreamRefused:
    with pytest.raises(StreamRefused) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    return caught.value


def test_a_put_creates_then_confirms_the_same_stream() -> None:
    store = _store()
    made = store.create("/s", Create(TEXT, body=b"abc"), 0.0)
    assert (made.created, made.stream.tail) == (True, 3)
    again = store.create("/s", Create("TEXT/PLAIN", body=b"ignored"), 1.0)
    assert (again.created, again.stream is made.stream, again.stream.tail) == (False, True, 3)
    assert store.create("/t", Create(), 0.0).stream.content_type == "application/octet-stream"


@pytest.mark.parametrize(
    "other",
    [
        Create("application/json"),
        Create(TEXT, expiry=Expiry(ttl=5)),
        Create(TEXT, closed=True),
    ],
)
def test_a_put_with_another_configuration_is_409(other: Create) -> None:
    store = _store()
    store.create("/s", Create(TEXT), 0.0)
    assert _refused(store.create, "/s", other, 1.0).code == "stream_exists"


def test_a_closed_put_matches_only_a_closed_stream() -> None:
    store = _store()
    store.create("/s", Create(TEXT, closed=True), 0.0)
    assert not store.create("/s", Create(TEXT, closed=True), 0.0).created
    assert _refused(store.create, "/s", Create(TEXT), 0.0).status == 409


def test_missing_and_expired_streams_are_404() -> None:
    store = _store()
    assert _refused(store.get, "/none", 0.0).status == 404
    store.create("/s", Create(TEXT, expiry=Expiry(ttl=10), body=b"abc"), 0.0)
    store.append("/s", b"d", content_type=TEXT, close=False, now=5.0)  # slides to 15
    assert store.get("/s", 14.0).tail == 4
    assert _refused(store.get, "/s", 15.0).status == 404
    assert (len(store), store.total_bytes) == (0, 0)
    assert store.create("/s", Create(TEXT), 16.0).created  # the path is free again


def test_the_sweep_drops_expired_streams() -> None:
    store = _store()
    store.create("/a", Create(TEXT, expiry=Expiry(expires_at=10.0), body=b"xy"), 0.0)
    store.create("/b", Create(TEXT, body=b"z"), 0.0)
    assert store.expire(9.0) == []
    assert store.expire(10.0) == ["/a"]
    assert (sorted(store.streams), store.total_bytes) == (["/b"], 1 + ENTRY_OVERHEAD)


def test_a_deleted_source_is_a_tombstone_while_forks_read_it() -> None:
    store = _store()
    store.create("/src", Create(TEXT, body=b"hello"), 0.0)
    fork = store.create("/fork", Create(forked_from="/src", fork_offset=offset_text(2)), 0.0)
    assert (fork.stream.content_type, fork.stream.read(0).entries) == (TEXT, (b"he",))
    store.delete("/src", 1.0)
    assert _refused(store.get, "/src", 1.0).status == 410
    assert _refused(store.delete, "/src", 1.0).status == 410
    assert _refused(store.create, "/src", Create(TEXT), 1.0).status == 409
    assert _refused(store.create, "/f2", Create(forked_from="/src"), 1.0).status == 409
    assert store.get("/fork", 1.0).read(0).entries == (b"he",)
    store.delete("/fork", 2.0)
    assert (len(store), store.total_bytes) == (0, 0)
    assert _refused(store.get, "/src", 2.0).status == 404


def test_deleting_the_last_fork_of_a_chain_frees_every_tombstone() -> None:
    store = _store()
    store.create("/a", Create(TEXT, body=b"1"), 0.0)
    store.create("/b", Create(forked_from="/a"), 0.0)
    store.append("/b", b"2", content_type=TEXT, close=False, now=0.0)
    store.create("/c", Create(forked_from="/b"), 0.0)
    assert store.get("/c", 0.0).read(0).entries == (b"1", b"2")
    store.delete("/a", 1.0)
    store.delete("/b", 1.0)
    assert store.total_bytes == 2 + 2 * ENTRY_OVERHEAD
    store.delete("/c", 1.0)
    assert (store.streams, store.total_bytes) == ({}, 0)


def test_fork_requests_are_checked() -> None:
    store = _store()
    store.create("/src", Create("application/json", body=b"[1,2,3]"), 0.0)
    assert _refused(store.create, "/f", Create(forked_from="/none"), 0.0).status == 404
    assert _refused(store.create, "/f", Create(TEXT, forked_from="/src"), 0.0).status == 409
    past = Create(forked_from="/src", fork_offset=offset_text(4))
    assert _refused(store.create, "/f", past, 0.0).code == "bad_fork_offset"
    lone = Create(TEXT, fork_sub_offset_given=True)
    assert _refused(store.create, "/f", lone, 0.0).code == "bad_fork_offset"
    sub = Create(forked_from="/src", fork_offset=offset_text(1), fork_sub_offset=1)
    assert store.create("/f", sub, 0.0).stream.read(0).entries == (b"1", b"2")
    assert not store.create("/f", sub, 0.0).created
    other = Create(forked_from="/src", fork_offset=offset_text(1), fork_sub_offset=2)
    assert _refused(store.create, "/f", other, 0.0).code == "stream_exists"


def test_a_fork_inherits_its_sources_expiry_unless_it_asks_for_its_own() -> None:
    store = _store()
    store.create("/src", Create(TEXT, expiry=Expiry(ttl=60)), 0.0)
    assert store.create("/f1", Create(forked_from="/src"), 0.0).stream.expiry.ttl == 60
    own = Create(forked_from="/src", expiry=Expiry(expires_at=99.0))
    assert store.create("/f2", own, 0.0).stream.expiry == Expiry(expires_at=99.0)


def test_bounds_on_streams_and_bytes_refuse_and_change_nothing() -> None:
    store = _store(max_streams=2, max_total_bytes=10 + ENTRY_OVERHEAD)  # and ENTRY_OVERHEAD each
    store.create("/a", Create(TEXT, body=b"12345678"), 0.0)
    store.create("/b", Create(TEXT), 0.0)
    assert _refused(store.create, "/c", Create(TEXT), 0.0).code == "too_many_streams"
    refused = _refused(store.append, "/b", b"abc", content_type=TEXT, close=False, now=0.0)
    assert (refused.status, refused.code) == (507, "store_full")
    assert (store.total_bytes, store.get("/b", 0.0).tail) == (8 + ENTRY_OVERHEAD, 0)
    store.delete("/a", 0.0)
    store.append("/b", b"abc", content_type=TEXT, close=False, now=0.0)
    assert store.total_bytes == 3 + ENTRY_OVERHEAD


def test_tails_and_paths_are_of_live_streams_only() -> None:
    store = _store()
    store.create("/a", Create(TEXT, body=b"abc"), 0.0)
    store.create("/b", Create(forked_from="/a"), 0.0)
    store.delete("/a", 0.0)  # a tombstone: /b still reads it
    assert (store.tail_of("/a"), store.tail_of("/b"), store.tail_of("/none")) == (None, 3, None)
    assert store.paths() == ["/b"]
