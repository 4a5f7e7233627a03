"""Ingest through Redis against the same relay in memory, in one run:
``python -m bench.redis_ingest`` (from the repository root).

A relay on ``memory://`` and a relay on a private redis-server each take the same load: one
producer streaming ``--messages`` messages of ``--deltas`` deltas and a final, all frames
written at once, to one subscriber on the same process. Figures: events per second of each
(median of ``--repeat`` runs), and the ratio Redis to memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

from token_relay.testing import RedisServer, relay_process

from .cases import stream
from .wire import build_messages


async def run(args: argparse.Namespace) -> dict[str, float]:
    messages = build_messages(args.messages, args.deltas)
    redis = RedisServer(Path(tempfile.mkdtemp()))
    redis.start()
    memory = relay_process("--max-events-per-second", "1000000000", name="memory")
    shared = relay_process(
        "--max-events-per-second", "1000000000", "--broker", redis.url, name="redis"
    )
    await asyncio.gather(memory.start(), shared.start())
    rates: dict[str, list[float]] = {"memory": [], "redis": []}
    try:
        for n in range(args.repeat):
            for name, relay in (("memory", memory), ("redis", shared)):
                record = await stream(relay, relay, f"ingest-{name}-{n}", messages)
                rates[name].append(record["events_per_second"])
    finally:
        await asyncio.gather(memory.stop(), shared.stop())
        redis.kill()
    result = {name: round(statistics.median(values)) for name, values in rates.items()}
    return {**result, "ratio_redis_to_memory": round(result["redis"] / result["memory"], 3)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_ingest", description=__doc__)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--deltas", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
