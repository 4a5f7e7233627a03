"""Tests for token_relay.core.ratelimit: the token bucket, with the time passed in."""

from __future__ import annotations

import pytest
from token_relay.core.ratelimit import KeyedBuckets, TokenBucket


def test_starts_full() -> None:
    bucket = TokenBucket(rate=2.0, burst=3.0, now=5.0)
    assert bucket.tokens == 3.0
    assert bucket.stamp == 5.0


def test_burst_then_refusal() -> None:
    bucket = TokenBucket(rate=1.0, burst=3.0, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.0) is False
    assert bucket.tokens == 0.0


def test_refills_at_rate() -> None:
    bucket = TokenBucket(rate=1.0, burst=3.0, now=0.0)
    for _ in range(3):
        bucket.take(0.0)
    assert bucket.take(0.5) is False
    assert bucket.tokens == 0.5
    # A refusal spends nothing: the half token is still there.
    assert bucket.take(1.0) is True
    assert bucket.tokens == 0.0
    assert bucket.take(1.0) is False


def test_refill_grants_whole_tokens_only() -> None:
    bucket = TokenBucket(rate=10.0, burst=10.0, now=0.0)
    assert all(bucket.take(0.0) for _ in range(10))
    results = [bucket.take(0.25) for _ in range(3)]
    assert results == [True, True, False]
    assert bucket.tokens == 0.5


def test_never_above_burst() -> None:
    bucket = TokenBucket(rate=100.0, burst=2.0, now=0.0)
    assert bucket.take(1000.0) is True
    assert bucket.tokens == 1.0
    assert bucket.take(1000.0) is True
    assert bucket.take(1000.0) is False


def test_idle_full_bucket_stays_at_burst() -> None:
    bucket = TokenBucket(rate=5.0, burst=4.0, now=0.0)
    assert [bucket.take(60.0) for _ in range(5)] == [True, True, True, True, False]


def test_sustained_rate() -> None:
    bucket = TokenBucket(rate=4.0, burst=1.0, now=0.0)
    accepted = sum(bucket.take(i * 0.125) for i in range(81))
    # One at t=0, then one every 0.25 s up to t=10.
    assert accepted == 41


def test_burst_of_one() -> None:
    bucket = TokenBucket(rate=1.0, burst=1.0, now=0.0)
    assert bucket.take(0.0) is True
    assert bucket.take(0.0) is False
    assert bucket.take(1.0) is True


@pytest.mark.parametrize(
    ("rate", "burst"),
    [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, 0.5), (1.0, -1.0)],
)
def test_bad_arguments_are_refused(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match="rate must be positive and burst at least 1"):
        TokenBucket(rate=rate, burst=burst, now=0.0)


def _keyed(max_keys: int = 3, overall_burst: float = 100.0) -> KeyedBuckets:
    overall = TokenBucket(rate=10.0, burst=overall_burst, now=0.0)
    return KeyedBuckets(rate=1.0, burst=2.0, overall=overall, max_keys=max_keys, now=0.0)


def test_each_key_has_its_own_bucket_and_counts_its_refusals() -> None:
    buckets = _keyed()
    assert [buckets.take("a", 0.0) for _ in range(5)] == [0, 0, None, None, None]
    assert buckets.take("b", 0.0) == 0  # another key is not held back by a's flood
    assert buckets.take("a", 0.5) is None
    assert buckets.take("a", 1.0) == 4  # the four refused since its last success
    assert buckets.take("a", 2.0) == 0


def test_the_map_keeps_the_most_recently_used_keys_only() -> None:
    buckets = _keyed(max_keys=2)
    buckets.take("a", 0.0)
    buckets.take("b", 0.0)
    buckets.take("a", 0.0)
    buckets.take("c", 0.0)  # drops b, the least recently used
    assert len(buckets) == 2
    assert [buckets.take("a", 0.0), buckets.take("a", 0.0)] == [None, None]
    assert buckets.take("b", 0.0) == 0  # b starts again full


def test_all_keys_together_are_bounded_too() -> None:
    buckets = _keyed(max_keys=100, overall_burst=3.0)
    assert [buckets.take(f"k{n}", 0.0) for n in range(5)] == [0, 0, 0, None, None]
    assert buckets.take("k3", 0.1) == 1  # k3's refusal is counted for it
