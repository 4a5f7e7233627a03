"""What a relay process made to start is frozen out of the cyclic garbage collector's scans
(:func:`token_relay.edge.workers.freeze_start`), in a lone process and in each of
``--workers 2``: ``/metrics`` says how many objects, per worker."""

from __future__ import annotations

import asyncio
import gc
import re
import weakref

from token_relay.edge.workers import freeze_start

from ..harness import RedisServer, eventually, relay_process

FROZEN = re.compile(r'^relay_gc_frozen_objects(?:\{worker="(\d+)"\})? (\S+)$', re.MULTILINE)
LEAST = 10_000
"""Far fewer objects than importing the relay makes (tens of thousands): a process that
froze nothing, or froze before importing it, reads under this."""


async def _frozen(port: int) -> dict[str, float]:
    """``relay_gc_frozen_objects`` from ``GET /metrics``, by worker ("" for a lone process)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
    text = (await asyncio.wait_for(reader.read(), 5)).decode()
    writer.close()
    return {worker: float(value) for worker, value in FROZEN.findall(text)}


async def test_a_relay_process_freezes_its_start() -> None:
    relay = await relay_process().start()
    try:
        frozen = await _frozen(relay.port)
        assert list(frozen) == [""], frozen
        assert frozen[""] >= LEAST
    finally:
        await relay.stop()


async def test_each_worker_freezes_its_own_start(redis_server: RedisServer) -> None:
    relay = await relay_process("--workers", "2", "--broker", redis_server.url).start()
    try:
        seen: dict[str, float] = {}

        async def both() -> bool:
            seen.update(await _frozen(relay.port))
            return sorted(seen) == ["0", "1"]

        await eventually(both, 15, interval=0.1)
        assert min(seen.values()) >= LEAST, seen
    finally:
        await relay.stop()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_garbage_is_collected_before_the_freeze_and_what_is_frozen_is_counted() -> None:
    cycle = _Cycle()
    gone = weakref.ref(cycle)
    del cycle  # garbage only the collector can free
    try:
        frozen = freeze_start()
        assert gone() is None  # collected, not frozen for good
        assert frozen == gc.get_freeze_count() >= LEAST
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
