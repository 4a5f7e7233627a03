"""``python -m bench``: options, the order of measurements, and the printed report."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from websockets.exceptions import ConnectionClosed

from .errors import BenchError
from .processes import Cluster, Route, running_cluster
from .report import RouteResults, format_table, percentile, to_json
from .workload import build_messages, measure_latency, measure_throughput

__all__ = ["Config", "main", "run"]

NOTE = (
    "Compare the ratios, not the absolute numbers: they are measured side by side in the same\n"
    "run, against the single instance, while absolute events/s and ms move from run to run on\n"
    "a shared, noisy machine. Each cell is the median of the repetitions. The relays run with\n"
    "default settings, except that the per-producer event rate limit is lifted."
)


@dataclass(frozen=True, slots=True)
class Config:
    """What to measure."""

    messages: int
    """Messages per throughput run."""
    deltas: int
    """Deltas per message (each message also has a final event)."""
    repeat: int
    """Repetitions of every measurement; the report shows medians."""
    rate: float
    """Messages per second in the latency case."""
    latency_messages: int
    """Messages per latency run."""
    warmup_messages: int
    """Messages per route sent once, unmeasured, before the first repetition."""


FULL = {"messages": 2000, "deltas": 10, "repeat": 3, "rate": 200.0, "latency_messages": 1000}
QUICK = {"messages": 200, "deltas": 10, "repeat": 1, "rate": 200.0, "latency_messages": 100}


def parse_args(argv: Sequence[str] | None) -> tuple[Config, Path | None]:
    """The configuration and the ``--json`` path from the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure token-relay's delivery throughput and latency on a single "
        "instance, one instance through Redis, and across two instances through Redis.",
    )
    parser.add_argument("--messages", type=int, help="messages per throughput run (2000)")
    parser.add_argument("--deltas", type=int, help="deltas per message, plus a final (10)")
    parser.add_argument("--repeat", type=int, help="repetitions; medians are reported (3)")
    parser.add_argument("--rate", type=float, help="messages per second, latency case (200)")
    parser.add_argument("--latency-messages", type=int, help="messages per latency run (1000)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every result as JSON")
    parser.add_argument(
        "--quick", action="store_true", help="small numbers for a smoke run (a few seconds)"
    )
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    values = {
        name: default if getattr(args, name) is None else getattr(args, name)
        for name, default in defaults.items()
    }
    for name, value in values.items():
        if value < 1 and not (name == "deltas" and value == 0):
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    warmup = min(int(values["messages"]), 200)
    config = Config(
        messages=int(values["messages"]),
        deltas=int(values["deltas"]),
        repeat=int(values["repeat"]),
        rate=float(values["rate"]),
        latency_messages=int(values["latency_messages"]),
        warmup_messages=warmup,
    )
    return config, args.json


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _measure(cluster: Cluster, config: Config, run_id: str) -> list[RouteResults]:
    throughput_messages = build_messages(config.messages, config.deltas)
    latency_messages = build_messages(config.latency_messages, config.deltas)
    warmup_messages = build_messages(config.warmup_messages, config.deltas)
    routes: list[Route] = cluster.routes()
    results = [RouteResults(route.key, route.label) for route in routes]

    def channel(case: str, route: Route, repetition: int) -> str:
        return f"bench-{run_id}-{case}-{route.key}-{repetition}"

    _progress("warming up")
    for route in routes:
        await measure_throughput(route, channel("warmup", route, 0), warmup_messages)
    # Repetition-major order: the three routes of one repetition run close together in
    # time, so a noisy spell on the machine hits all of them rather than one.
    for repetition in range(1, config.repeat + 1):
        for route, result in zip(routes, results, strict=True):
            cluster.check_alive()
            throughput = await measure_throughput(
                route, channel("throughput", route, repetition), throughput_messages
            )
            latency = await measure_latency(
                route, channel("latency", route, repetition), latency_messages, config.rate
            )
            result.throughput.append(throughput)
            result.latency.append(latency)
            _progress(
                f"[{repetition}/{config.repeat}] {route.label}: "
                f"{throughput.events_per_second:,.0f} events/s, latency "
                f"p50 {percentile(latency.samples, 50) * 1000:.2f} ms, "
                f"p99 {percentile(latency.samples, 99) * 1000:.2f} ms"
            )
    cluster.check_alive()
    return results


async def run(config: Config) -> tuple[list[RouteResults], list[str]]:
    """Start the processes, measure every route, stop the processes.

    Returns the results per route (baseline first) and the warnings and errors the
    relays logged meanwhile.
    """
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    _progress("starting redis-server and relays S, A, B")
    async with running_cluster() as cluster:
        try:
            results = await _measure(cluster, config, secrets.token_hex(3))
        except ConnectionClosed as exc:
            raise BenchError(f"a connection closed unexpectedly: {exc}") from None
        finally:
            notable = [
                f"{relay.name}: {line}" for relay in cluster.relays for line in relay.notable
            ]
    return results, notable


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (1 when a check failed, 130 when interrupted)."""
    config, json_path = parse_args(argv)
    began = time.monotonic()
    try:
        results, notable = asyncio.run(run(config))
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("bench interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    elapsed = time.monotonic() - began
    events = config.deltas + 1
    print(
        f"\ntoken-relay benchmark: throughput {config.messages} messages x {events} events "
        f"(as fast as possible); latency {config.latency_messages} messages at "
        f"{config.rate:g} msg/s (final sent -> message received); "
        f"median of {config.repeat} repetition{'s' if config.repeat > 1 else ''}\n"
    )
    print(format_table(results))
    print()
    print(NOTE)
    if notable:
        print("\nThe relays logged warnings or errors:")
        print("\n".join(f"  {line}" for line in notable))
    print(f"\nfinished in {elapsed:.0f} s")
    if json_path is not None:
        extra = {
            "environment": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
            },
            "elapsed_seconds": elapsed,
            "relay_warnings": notable,
        }
        record = to_json(results, asdict(config), extra)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"results written to {json_path}")
    return 0
