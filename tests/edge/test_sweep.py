"""The sweep behind keepalive pings and SSE heartbeats: every member once an interval,
spread over it, and never twice within less than an interval after the loop stalled."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

from token_relay.edge.server import sweep

SLICES = 16
INTERVAL = 0.32
TICK = INTERVAL / SLICES


async def _visits(stall_at: int | None, stall: float, sweeps: float) -> dict[int, list[float]]:
    """Sweep ``SLICES`` slices of two members each for ``sweeps`` intervals; the
    ``stall_at``-th visit blocks the loop for ``stall`` seconds. When each member was
    visited, by the loop's clock."""
    loop = asyncio.get_running_loop()
    slices = [[2 * n, 2 * n + 1] for n in range(SLICES)]
    seen: dict[int, list[float]] = {member: [] for members in slices for member in members}
    count = itertools.count()

    def visit(member: int) -> None:
        seen[member].append(loop.time())
        if next(count) == stall_at:
            time.sleep(stall)  # the loop is held: every timer falls behind

    task = asyncio.create_task(sweep(slices, INTERVAL, visit))
    await asyncio.sleep(sweeps * INTERVAL)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return seen


def _gaps(seen: dict[int, list[float]]) -> list[float]:
    return [b - a for times in seen.values() for a, b in itertools.pairwise(times)]


async def test_every_member_is_visited_once_an_interval_in_its_own_slice() -> None:
    seen = await _visits(None, 0, 3.5)
    assert all(len(times) >= 2 for times in seen.values()), seen
    # A slice's two members are visited in the same pass; the slices a tick apart.
    assert all(abs(seen[2 * n][0] - seen[2 * n + 1][0]) < TICK / 2 for n in range(SLICES))
    firsts = [seen[2 * n][0] for n in range(SLICES)]
    # Slices are due a tick apart; a visit up to two ticks late is caught up, never more.
    assert firsts[-1] - firsts[0] >= (SLICES - 3) * TICK, firsts
    assert all(gap >= INTERVAL - 2 * TICK - 1e-3 for gap in _gaps(seen)), _gaps(seen)


async def test_after_a_stall_no_member_is_visited_again_within_less_than_an_interval() -> None:
    # Half an interval held in the middle of the first sweep: the slices it held up are
    # visited late, and the sweep goes on from there rather than bursting to catch up.
    seen = await _visits(SLICES, INTERVAL / 2, 4)
    gaps = _gaps(seen)
    assert all(len(times) >= 2 for times in seen.values()), seen
    assert min(gaps) >= INTERVAL - 2 * TICK - 1e-3, sorted(gaps)[:5]
