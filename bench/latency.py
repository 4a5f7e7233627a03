"""Final to delivered on one process at a steady rate: ``python -m bench.latency``.

One producer sends ``--messages`` messages of ``--deltas`` deltas and a final, paced at
``--rate`` messages per second, to one subscriber on the same relay process (memory broker);
each message's latency is from writing its final to the subscriber reading its ``message``
frame. Figures: p50 and p99 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from typing import Any

from token_relay.testing import relay_process

from .cases import stream
from .wire import build_messages


async def run(args: argparse.Namespace) -> dict[str, Any]:
    relay = relay_process("--max-events-per-second", "1000000000")
    await relay.start()
    try:
        warm = build_messages(200, args.deltas, prefix="warm-")
        await stream(relay, relay, "warm", warm)
        messages = build_messages(args.messages, args.deltas)
        record = await stream(relay, relay, "latency", messages, rate=args.rate)
    finally:
        await relay.stop()
    latency: dict[str, Any] = record["latency"]
    figures = {k: round(v, 3) for k, v in latency.items() if isinstance(v, float)}
    return {"rate": args.rate, "messages": args.messages, **figures}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--deltas", type=int, default=10)
    parser.add_argument("--rate", type=float, default=1000.0)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
