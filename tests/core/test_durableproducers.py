"""Tests for token_relay.core.durableproducers: idempotent producers, fenced by epoch and seq."""

from __future__ import annotations

import pytest
from token_relay.core.durableproducers import Producer, Producers, Verdict
from token_relay.core.errors import StreamRefused


def _accept(producers: Producers, producer: Producer) -> Verdict:
    verdict = producers.judge(producer)
    if verdict is Verdict.NEW:
        producers.record(producer)
    return verdict


def _refusal(producers: Producers, producer: Producer) -> StreamRefused:
    with pytest.raises(StreamRefused) as caught:
        producers.judge(producer)
    return caught.value


def test_seq_runs_on_and_a_retry_is_a_duplicate() -> None:
    producers = Producers(10)
    assert _accept(producers, Producer("p", 0, 0)) is Verdict.NEW
    assert _accept(producers, Producer("p", 0, 1)) is Verdict.NEW
    assert _accept(producers, Producer("p", 0, 1)) is Verdict.DUPLICATE
    assert _accept(producers, Producer("p", 0, 0)) is Verdict.DUPLICATE
    assert producers.last_seq("p") == 1
    assert producers.epoch("p") == 0


def test_a_gap_is_409_with_the_seq_expected_and_received() -> None:
    producers = Producers(10)
    _accept(producers, Producer("p", 0, 0))
    refused = _refusal(producers, Producer("p", 0, 5))
    assert (refused.status, refused.code) == (409, "producer_seq_gap")
    assert refused.headers == (("Producer-Expected-Seq", "1"), ("Producer-Received-Seq", "5"))
    assert producers.last_seq("p") == 0


def test_a_new_producer_starts_at_seq_zero() -> None:
    refused = _refusal(Producers(10), Producer("p", 3, 2))
    assert (refused.status, refused.headers[0]) == (409, ("Producer-Expected-Seq", "0"))


def test_a_stale_epoch_is_fenced_with_the_current_one() -> None:
    producers = Producers(10)
    _accept(producers, Producer("p", 0, 0))
    assert _accept(producers, Producer("p", 2, 0)) is Verdict.NEW
    refused = _refusal(producers, Producer("p", 1, 0))
    assert (refused.status, refused.code, refused.headers) == (
        403,
        "producer_fenced",
        (("Producer-Epoch", "2"),),
    )


def test_a_new_epoch_must_start_at_seq_zero() -> None:
    producers = Producers(10)
    _accept(producers, Producer("p", 0, 0))
    refused = _refusal(producers, Producer("p", 1, 1))
    assert (refused.status, refused.code) == (400, "bad_producer_seq")
    assert producers.epoch("p") == 0


def test_producers_are_independent() -> None:
    producers = Producers(10)
    _accept(producers, Producer("a", 0, 0))
    _accept(producers, Producer("a", 0, 1))
    assert _accept(producers, Producer("b", 0, 0)) is Verdict.NEW
    assert (producers.last_seq("a"), producers.last_seq("b")) == (1, 0)


def test_past_the_limit_the_least_recent_producer_is_forgotten() -> None:
    producers = Producers(2)
    _accept(producers, Producer("a", 0, 0))
    _accept(producers, Producer("b", 0, 0))
    producers.touch("a")  # a wrote again (a duplicate): b is now the least recent
    _accept(producers, Producer("c", 0, 0))
    assert len(producers) == 2
    assert producers.last_seq("b") is None
    assert producers.last_seq("a") == 0
    # Forgotten, it is new again: seq 0 is new data, not a duplicate.
    assert producers.judge(Producer("b", 0, 0)) is Verdict.NEW


def test_states_are_restored_in_their_order_and_within_the_limit() -> None:
    producers = Producers(limit=2)
    for name in ("a", "b"):
        _accept(producers, Producer(name, 1, 0))
    _accept(producers, Producer("a", 1, 1))  # a wrote last
    assert producers.states() == [("b", 1, 0), ("a", 1, 1)]
    again = Producers(limit=2)
    again.restore([("old", 0, 0), *producers.states()])  # past the limit: the oldest goes
    assert again.states() == [("b", 1, 0), ("a", 1, 1)]
    assert _accept(again, Producer("a", 1, 1)) is Verdict.DUPLICATE
    _accept(again, Producer("c", 0, 0))  # b, the least recent, is forgotten
    assert again.epoch("b") is None
