"""The histogram that counts every delta: folded in batches, the same as one by one."""

from __future__ import annotations

import random
from bisect import bisect_left

import pytest
from token_relay.edge.metrics import FOLD_AT, Timings

BOUNDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def one_by_one(values: list[float]) -> tuple[list[int], float]:
    counts, total = [0] * (len(BOUNDS) + 1), 0.0
    for value in values:
        counts[bisect_left(BOUNDS, value)] += 1
        total += value
    return counts, total


@pytest.mark.parametrize("observed", [0, 1, FOLD_AT - 1, FOLD_AT, FOLD_AT + 1, 3 * FOLD_AT + 7])
def test_counts_and_sum_match_observing_one_by_one(observed: int) -> None:
    rng = random.Random(observed)
    # Values on the bounds themselves, between them, and past the last one.
    choices = [*BOUNDS, 0.0, 75.0, *(b * 0.999 for b in BOUNDS), *(b * 1.001 for b in BOUNDS)]
    values = [
        rng.choice(choices) if rng.random() < 0.5 else rng.expovariate(20) for _ in range(observed)
    ]
    timings = Timings(BOUNDS)
    read_between = rng.randrange(observed + 1)
    for index, value in enumerate(values):
        timings.observe(value)
        if index == read_between:  # a scrape in the middle folds early
            assert timings.counts == one_by_one(values[: index + 1])[0]
    counts, total = one_by_one(values)
    assert timings.counts == counts
    assert timings.total == total  # exactly: added in the order observed
    cumulative = timings.cumulative()
    assert cumulative[-1] == ("+Inf", observed)
    assert [bound for bound, _ in cumulative[:-1]] == [repr(float(b)) for b in BOUNDS]


def test_unread_observations_are_bounded() -> None:
    timings = Timings(BOUNDS)
    for _ in range(10 * FOLD_AT):
        timings.observe(0.002)
    assert len(timings._pending) < FOLD_AT
    assert timings.counts[1] == 10 * FOLD_AT
