"""``python -m bench.instructions``: the relay's instructions per event, counted, not timed.

The relay runs in-process on in-memory transports, as in :mod:`bench.inprocess`, under
valgrind's callgrind, which counts the instructions the process executes. The count does
not depend on what else the machine is doing, so two versions of the relay compare exactly
even on a busy, shared machine where times move by half from run to run.

Each figure is the difference between two runs, one with ``--messages`` more messages than
the other, less the same difference for a run that only builds the load: what remains is
the relay's own work per event (reading frames, rules, assembly, broker, acks, delivery to
one subscriber). ``--compare-python`` counts another installation's relay the same way.
With ``redis-server`` on the PATH, ingest through a private Redis is counted too: the
relay's side only (Redis is another process).

Needs ``valgrind`` on the PATH (Debian's package). Each figure takes about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from token_relay.edge.relay import Relay

from tests.harness import RedisServer

from .inprocess import connect, feed, load, settings, settle

BASE = 300
"""Messages in the smaller of each pair of runs (start-up and warm-up cancel out)."""
EVENTS_PER_MESSAGE = 11
"""10 deltas and a final, as :func:`bench.wire.build_messages` builds them."""
ROOT = Path(__file__).resolve().parent.parent


async def _ingest(messages: int, batch: int, setup_only: bool, broker: str) -> None:
    """Build the load; unless ``setup_only``, feed it to a relay and check it was applied."""
    relay = Relay(settings(broker))
    server = await relay.start()
    _, seen = connect(server, "/subscribe?channel=c")
    quiet = None if broker == "memory://" else seen  # Redis's replies come back later
    await settle(lambda: True, quiet)
    _, texts, reads = load(messages, batch)
    if setup_only:
        return
    producer, transport = connect(server, "/produce?channel=c")
    await settle(lambda: True)
    await feed(producer, transport, reads, quiet)
    if relay.metrics.frames_in_producer.value != len(texts) or not seen.written:
        raise SystemExit("the relay did not apply every frame")


async def _child(messages: int, batch: int, setup_only: bool, redis: bool) -> None:
    """One counted run; with ``redis``, on a private ``redis-server`` (not counted: it is
    another process)."""
    if not redis:
        return await _ingest(messages, batch, setup_only, "memory://")
    with tempfile.TemporaryDirectory(prefix="token-relay-instructions-") as directory:
        server = RedisServer(Path(directory))
        server.start()
        try:
            await _ingest(messages, batch, setup_only, server.url)
        finally:
            server.kill()


def _count(python: str, messages: int, batch: int, setup_only: bool, redis: bool) -> int:
    """Instructions one child run executes, as callgrind counts them."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        python,
        "-m",
        "bench.instructions",
        "--child",
        str(messages),
        str(batch),
        "1" if setup_only else "0",
        "1" if redis else "0",
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode or found is None:
        raise SystemExit(f"{python}: the counted run failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_event(python: str, batch: int, messages: int, redis: bool = False) -> float:
    """The relay's instructions per event, frames of ``batch`` events."""
    runs = [(BASE, False), (BASE + messages, False), (BASE, True), (BASE + messages, True)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        small, large, setup_small, setup_large = pool.map(
            lambda run: _count(python, run[0], batch, run[1], redis), runs
        )
    return ((large - small) - (setup_large - setup_small)) / (messages * EVENTS_PER_MESSAGE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("--messages", type=int, default=1000, help="messages counted (1000)")
    parser.add_argument(
        "--compare-python", default="", metavar="PYTHON", help="another installation's python"
    )
    parser.add_argument("--child", nargs=4, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        messages, batch, setup_only, redis = args.child
        run = _child(messages, batch, bool(setup_only), bool(redis))
        asyncio.new_event_loop().run_until_complete(run)
        sys.stdout.flush()
        os._exit(0)  # the relay's leftover tasks need no orderly end
    if shutil.which("valgrind") is None:
        print("python -m bench.instructions needs valgrind on the PATH", file=sys.stderr)
        return 2
    pythons = [("relay", sys.executable)]
    if args.compare_python:
        pythons.append(("--compare-python's relay", args.compare_python))
    cases = [(1, False, "a frame per event"), (100, False, "100 events per frame")]
    if shutil.which("redis-server"):
        cases.append((1, True, "through Redis"))
    for batch, redis, what in cases:
        counts = [
            (name, per_event(python, batch, args.messages, redis)) for name, python in pythons
        ]
        for index, (name, count) in enumerate(counts):
            ratio = f"  {count / counts[0][1]:.2f}x this relay" if index else ""
            print(f"ingest, {what:<22} {name:<26} {count:9,.0f} instructions/event{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
