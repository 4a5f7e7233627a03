"""``python -m bench.redisscripts``: what Redis itself spends on each message's script.

A message streamed through Redis ends in one script run inside Redis: ``WHOLE`` when its
open and first deltas are still queued at its final (a reply streamed quickly), its open,
deltas and terminal frame in one step. Redis runs the scripts of every relay process on it
one at a time, so its time per script bounds the messages a cluster can complete each
second, whatever the number of relay processes.

This runs that script on a private ``redis-server``, as a producer with a session sends it
(the message's open, its text and its terminal frame, held for ``--id-hold``), 2,000 calls
to a pipeline, for ``--rounds`` rounds. With ``--compare-python``, another installation's
script runs with the same keys and arguments, the two alternating round by round. Each
figure is Redis's own (``INFO commandstats``): its time per call, the median of the rounds,
and the Redis commands each call makes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from token_relay.brokers.redis.scripts import WHOLE
from token_relay.brokers.redis.writes import make_whole, open_write, taken, terminal_write
from token_relay.core.settings import Settings

from tests.harness import RedisServer

CALLS = 2000
"""Calls per round, in one pipeline."""


def script_of(python: str) -> str:
    """The ``WHOLE`` script of the installation whose interpreter is ``python``."""
    program = "import sys\nfrom token_relay.brokers.redis.scripts import WHOLE\n"
    program += "sys.stdout.write(WHOLE)"
    return subprocess.run(
        [python, "-c", program], capture_output=True, text=True, check=True
    ).stdout


def _command(sha: str, settings: Settings, number: int) -> tuple[Any, ...]:
    """One message's ``WHOLE``, as the broker sends it: a fresh id of one owner's."""
    target = ("c", "owner.1", f"m{number}")
    body = json.dumps({"type": "message", "channel": "c", "id": f"m{number}", "text": "hi"})
    opening = open_write(target, 0, 600)
    opening.parts = ["hi"]
    make_whole(opening, terminal_write(settings, False, target, body, None, strict=3), target)
    write = taken(opening)
    return ("EVALSHA", sha, len(write.keys), *write.keys, *write.args)


async def _round(redis: Redis, sha: str, settings: Settings, first: int) -> tuple[float, float]:
    """Redis's time per call and commands per call, over one pipeline of :data:`CALLS`."""
    await redis.config_resetstat()
    async with redis.pipeline(transaction=False) as pipe:
        for number in range(first, first + CALLS):
            pipe.execute_command(*_command(sha, settings, number))
        replies = await pipe.execute()
    if not all(isinstance(reply, list) for reply in replies):
        raise SystemExit(f"the script did not publish every message: {replies[:3]}")
    stats = await redis.info("commandstats")
    calls = stats["cmdstat_evalsha"]["calls"]
    nested = sum(
        value["calls"]
        for name, value in stats.items()
        if name not in ("cmdstat_evalsha", "cmdstat_config|resetstat")
    )
    return stats["cmdstat_evalsha"]["usec"] / calls, nested / calls


async def measure(scripts: dict[str, str], rounds: int) -> dict[str, tuple[float, float]]:
    """For each script by name: Redis's median time per call (µs) and its commands per call."""
    settings = Settings()
    with tempfile.TemporaryDirectory(prefix="token-relay-scripts-") as directory:
        server = RedisServer(Path(directory))
        server.start()
        redis = Redis.from_url(server.url)
        try:
            shas = {name: await redis.script_load(text) for name, text in scripts.items()}
            times: dict[str, list[float]] = {name: [] for name in scripts}
            commands: dict[str, float] = {}
            first = 0
            for number in range(rounds):
                names = list(scripts) if number % 2 == 0 else list(reversed(scripts))
                for name in names:
                    spent, commands[name] = await _round(redis, shas[name], settings, first)
                    times[name].append(spent)
                    first += CALLS
            return {name: (statistics.median(times[name]), commands[name]) for name in scripts}
        finally:
            await redis.aclose()
            server.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redisscripts", description=__doc__)
    parser.add_argument("--rounds", type=int, default=12, help="rounds of each (12)")
    parser.add_argument("--compare-python", metavar="PYTHON", help="another installation's python")
    args = parser.parse_args(argv)
    scripts = {"this version": WHOLE}
    if args.compare_python:
        scripts["--compare-python's"] = script_of(args.compare_python)
    results = asyncio.run(measure(scripts, args.rounds))
    for name, (spent, commands) in results.items():
        print(f"{name:<20} {spent:6.2f} µs of Redis per message, {commands:.0f} commands")
    return 0


if __name__ == "__main__":
    sys.exit(main())
