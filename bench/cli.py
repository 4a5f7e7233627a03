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
import textwrap
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed

from .assembly import ASSEMBLERS, run_assembler
from .errors import BenchError
from .fanout import DELTA_GAP, measure_fanout
from .ingest import Unsupported, noop_ingest, relay_ingest, socketio_ingest
from .memory import IN_FLIGHT_CHARS, idle_subscriber_bytes, in_flight_bytes
from .messages import build_messages
from .processes import Cluster, SubscriberPool, running_cluster
from .report import (
    Results,
    format_table,
    format_targets,
    percentile,
    table_rows,
    targets,
    to_json,
)
from .workload import measure_latency, measure_throughput

__all__ = ["Config", "main", "run"]

WIDTH = 100

NOTE = (
    "Every row was measured in this run; each cell is the median over the repetitions (for "
    "latencies, of each repetition's p50 and p99); each ratio is the median of the "
    "per-repetition ratios. Compare the ratios more than the absolute numbers, which move from "
    "run to run on a shared machine. Relays run with their defaults "
    "except --max-events-per-second 1000000000 and --max-connections-per-ip 100000{extra}. "
    "'server CPU' and 'relay CPU' are the server's CPU time over the measured wall time "
    "(fan-out: over the final-to-last-subscriber spans): near 100%, the server, not the load "
    "generator or the clients, was the limit; 'clients' is the subscriber processes' CPU "
    "time, all together, over the same spans."
)


@dataclass(frozen=True, slots=True)
class Config:
    """What to measure."""

    repeat: int
    """Repetitions of every measurement; the report shows medians."""
    deltas: int
    """Deltas per message (each message also has a final event)."""
    assembler_messages: int
    """Messages per assembler pass on the short workload."""
    long_messages: int
    """Messages of ``long_chars`` characters per assembler pass on the long workload."""
    long_chars: int
    """Characters of a long message (in four-character deltas); the in-flight size too."""
    ingest_messages: int
    """Messages per ingest run (relay, no-op server, batched)."""
    socketio_messages: int
    """Messages per python-socketio ingest run."""
    batch: int
    """Events per array frame in the batched ingest case."""
    fanout_sizes: tuple[int, ...]
    """Subscriber counts of the fan-out case."""
    fanout_messages: int
    """Measured messages per fan-out configuration and repetition."""
    fanout_processes: int
    """Subscriber processes for the largest fan-out (fewer for smaller ones)."""
    messages: int
    """Messages per throughput run on the Redis paths."""
    rate: float
    """Messages per second in the latency case."""
    latency_messages: int
    """Messages per latency run."""
    idle_subscribers: int
    """Idle subscribers in the memory case."""
    in_flight: int
    """Unfinished messages in the memory case."""
    relay_args: tuple[str, ...] = ()
    """Extra flags for every relay process, such as ``--loop=uvloop``."""


FULL: dict[str, Any] = {
    "repeat": 3,
    "deltas": 10,
    "assembler_messages": 20_000,
    "long_messages": 100,
    "long_chars": IN_FLIGHT_CHARS,
    "ingest_messages": 10_000,
    "socketio_messages": 3_000,
    "batch": 100,
    "fanout_sizes": (1_000, 10_000),
    "fanout_messages": 6,
    "fanout_processes": 4,
    "messages": 2_000,
    "rate": 200.0,
    "latency_messages": 600,
    "idle_subscribers": 2_000,
    "in_flight": 100,
}
QUICK: dict[str, Any] = {
    **FULL,
    "repeat": 1,
    "assembler_messages": 4_000,
    "long_messages": 20,
    "ingest_messages": 2_000,
    "socketio_messages": 600,
    "fanout_messages": 2,
    "messages": 300,
    "latency_messages": 100,
    "idle_subscribers": 1_000,
    "in_flight": 20,
}
OPTIONS = {
    "repeat": "repetitions; medians are reported",
    "deltas": "deltas per message, plus a final",
    "ingest_messages": "messages per ingest run",
    "socketio_messages": "messages per python-socketio ingest run",
    "batch": "events per array frame, batched ingest",
    "fanout_messages": "measured messages per fan-out configuration and repetition",
    "messages": "messages per throughput run on the Redis paths",
    "rate": "messages per second, latency case",
    "latency_messages": "messages per latency run",
    "idle_subscribers": "idle subscribers, memory case",
    "in_flight": "unfinished 10k-character messages, memory case",
}


@dataclass(frozen=True, slots=True)
class Outputs:
    """Where to write the record and the chart, if anywhere."""

    json: Path | None
    chart: Path | None


def parse_args(argv: Sequence[str] | None) -> tuple[Config, Outputs]:
    """The configuration and output paths from the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure token-relay: the assembler, ingest against a no-op server and a "
        "python-socketio relay, batched ingest, fan-out to 1,000 and 10,000 subscribers, "
        "latency, memory, and the Redis paths. Prints one table and the targets.",
    )
    for name, help_text in OPTIONS.items():
        kind = float if isinstance(FULL[name], float) else int
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=kind, help=f"{help_text} ({FULL[name]:g})"
        )
    parser.add_argument(
        "--relay-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="an extra flag for every relay, e.g. --relay-arg=--loop=uvloop (repeatable)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every result as JSON")
    parser.add_argument("--chart", type=Path, metavar="PATH", help="draw the results as a PNG")
    parser.add_argument(
        "--quick", action="store_true", help="small numbers for a smoke run (under a minute)"
    )
    args = parser.parse_args(argv)
    values = dict(QUICK if args.quick else FULL)
    for name in OPTIONS:
        given = getattr(args, name)
        if given is not None:
            if given < 1 and not (name == "deltas" and given == 0):
                parser.error(f"--{name.replace('_', '-')} must be at least 1")
            values[name] = given
    values["relay_args"] = tuple(args.relay_arg)
    return Config(**values), Outputs(args.json, args.chart)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def measure_assemblers(config: Config, results: Results) -> None:
    """The assembler case, in this process, before any other process starts."""
    workloads = {
        "short": build_messages(config.assembler_messages, config.deltas),
        "long": build_messages(config.long_messages, config.long_chars // 4),
    }
    for workload, messages in workloads.items():
        run_assembler("floor", messages[: len(messages) // 10 or 1])  # warm-up
        for repetition in range(1, config.repeat + 1):
            for key in ASSEMBLERS:
                run = run_assembler(key, messages)
                results.add(f"assembler.{workload}.{key}", run.events_per_second)
                results.detail(
                    f"assembler.{workload}.{key}",
                    {"repetition": repetition, "events": run.events, "seconds": run.seconds},
                )
        summary = ", ".join(
            f"{key} {results.median(f'assembler.{workload}.{key}'):,.0f}" for key in ASSEMBLERS
        )
        _progress(f"assembler, {workload} messages: {summary} events/s")


def _channel(run_id: str, case: str, repetition: int) -> str:
    return f"bench-{run_id}-{case}-{repetition}"


async def _warm_up(cluster: Cluster, config: Config, run_id: str) -> None:
    _progress("warming up")
    messages = build_messages(min(config.ingest_messages, 1000), config.deltas)
    await relay_ingest(cluster.single, _channel(run_id, "warm-ingest", 0), messages)
    await noop_ingest(cluster.noop, messages)
    await socketio_ingest(cluster.socketio, _channel(run_id, "warm-sio", 0), messages[:300])
    for route in cluster.routes():
        await measure_throughput(
            route, _channel(run_id, f"warm-{route.key}", 0), messages[: min(config.messages, 200)]
        )


def _ingest_detail(results: Results, key: str, repetition: int, run: Any) -> None:
    results.add(key, run.events_per_second)
    record = {
        "repetition": repetition,
        "events": run.events,
        "frames": run.frames,
        "seconds": run.seconds,
        "events_per_second": run.events_per_second,
        "frames_per_second": run.frames_per_second,
        "server_cpu_seconds": run.server_cpu_seconds,
    }
    if run.seconds >= 0.5:  # CPU time comes in 10 ms ticks: too coarse for shorter runs
        record["server_busy"] = run.server_busy
    results.detail(key, record)


async def _ingest_round(
    cluster: Cluster, config: Config, results: Results, run_id: str, repetition: int
) -> None:
    messages = build_messages(config.ingest_messages, config.deltas)
    relay = await relay_ingest(cluster.single, _channel(run_id, "ingest", repetition), messages)
    _ingest_detail(results, "ingest.relay", repetition, relay)
    noop = await noop_ingest(cluster.noop, messages)
    _ingest_detail(results, "ingest.noop", repetition, noop)
    sio = await socketio_ingest(
        cluster.socketio,
        _channel(run_id, "socketio", repetition),
        messages[: config.socketio_messages],
    )
    _ingest_detail(results, "ingest.socketio", repetition, sio)
    line = (
        f"[{repetition}/{config.repeat}] ingest: relay {relay.events_per_second:,.0f}, "
        f"no-op {noop.events_per_second:,.0f}, socketio {sio.events_per_second:,.0f} events/s"
    )
    if "batched" not in results.notes:
        try:
            batched = await relay_ingest(
                cluster.single, _channel(run_id, "batched", repetition), messages, config.batch
            )
        except Unsupported as exc:
            results.notes["batched"] = f"the relay does not take array frames ({exc})"
            _progress(f"batched ingest skipped: {exc}")
        else:
            _ingest_detail(results, "batched.relay", repetition, batched)
            line += f"; batched {batched.events_per_second:,.0f}"
    # The no-op server reads array frames in a blink: ten copies make the run timeable.
    noop_batched = await noop_ingest(cluster.noop, messages, config.batch, copies=10)
    _ingest_detail(results, "batched.noop", repetition, noop_batched)
    _progress(line + f", batched no-op {noop_batched.events_per_second:,.0f}")


async def _routes_round(
    cluster: Cluster, config: Config, results: Results, run_id: str, repetition: int
) -> None:
    throughput_messages = build_messages(config.messages, config.deltas)
    latency_messages = build_messages(config.latency_messages, config.deltas)
    for route in cluster.routes():
        cluster.check_alive()
        throughput = await measure_throughput(
            route, _channel(run_id, f"throughput-{route.key}", repetition), throughput_messages
        )
        latency = await measure_latency(
            route,
            _channel(run_id, f"latency-{route.key}", repetition),
            latency_messages,
            config.rate,
        )
        prefix = f"routes.{route.key}"
        p50 = percentile(latency.samples, 50) * 1000
        p99 = percentile(latency.samples, 99) * 1000
        results.add(prefix + ".throughput", throughput.events_per_second)
        results.add(prefix + ".p50", p50)
        results.add(prefix + ".p99", p99)
        results.detail(
            prefix,
            {
                "repetition": repetition,
                "label": route.label,
                "throughput": {
                    "messages": throughput.messages,
                    "events": throughput.events,
                    "seconds": throughput.seconds,
                    "events_per_second": throughput.events_per_second,
                },
                "latency": {
                    "rate": latency.rate,
                    "p50_ms": p50,
                    "p99_ms": p99,
                    "max_ms": max(latency.samples) * 1000,
                    "samples_ms": [round(sample * 1000, 4) for sample in latency.samples],
                },
            },
        )
        _progress(
            f"[{repetition}/{config.repeat}] {route.label}: "
            f"{throughput.events_per_second:,.0f} events/s, latency p50 {p50:.2f} ms, "
            f"p99 {p99:.2f} ms"
        )


async def _fanout_phase(cluster: Cluster, config: Config, results: Results, run_id: str) -> None:
    largest = max(config.fanout_sizes)
    for size in config.fanout_sizes:
        processes = max(1, round(config.fanout_processes * size / largest))
        channel = _channel(run_id, f"fanout-{size}", 0)
        _progress(f"fan-out: connecting {size:,} subscribers from {processes} processes")
        began = time.monotonic()
        async with SubscriberPool.running(
            cluster.fan.port, channel, size, processes, deltas_per_message=config.deltas, nice=10
        ) as pool:
            _progress(f"fan-out: {size:,} subscribed in {time.monotonic() - began:.1f} s")
            deltas_on = False
            warm = build_messages(1, config.deltas, prefix="warm:")
            await measure_fanout(cluster.fan, pool, channel, warm, False)
            for repetition in range(1, config.repeat + 1):
                for deltas in (False, True):
                    cluster.check_alive()
                    if deltas != deltas_on:
                        await pool.set_deltas(deltas)
                        deltas_on = deltas
                    mode = "deltas" if deltas else "plain"
                    messages = build_messages(
                        config.fanout_messages, config.deltas, prefix=f"{repetition}{mode}:"
                    )
                    run = await measure_fanout(cluster.fan, pool, channel, messages, deltas)
                    prefix = f"fanout.{size}.{mode}"
                    p50 = percentile(run.samples, 50) * 1000
                    p99 = percentile(run.samples, 99) * 1000
                    results.add(prefix + ".p50", p50)
                    results.add(prefix + ".p99", p99)
                    results.detail(
                        prefix,
                        {
                            "repetition": repetition,
                            "subscribers": size,
                            "deltas": deltas,
                            "delta_gap_ms": DELTA_GAP * 1000,
                            "p50_ms": p50,
                            "p99_ms": p99,
                            "samples_ms": [round(s * 1000, 3) for s in run.samples],
                            "first_arrival_ms": [round(s * 1000, 3) for s in run.first],
                            "relay_cpu_ms": [round(s * 1000, 1) for s in run.relay_cpu],
                            "client_cpu_ms": [round(s * 1000, 1) for s in run.client_cpu],
                            "relay_busy": sum(run.relay_cpu) / sum(run.samples),
                            "clients_busy": sum(run.client_cpu) / sum(run.samples),
                        },
                    )
                    _progress(
                        f"[{repetition}/{config.repeat}] fan-out {size:,}"
                        f"{' with deltas' if deltas else ''}: p50 {p50:.1f} ms, p99 {p99:.1f} ms"
                    )


async def _memory_phase(config: Config, results: Results, notable: list[str]) -> None:
    for repetition in range(1, config.repeat + 1):
        idle = await idle_subscriber_bytes(config.idle_subscribers, 2, notable, config.relay_args)
        results.add("memory.idle", idle.per_item)
        results.detail("memory.idle", {"repetition": repetition, **asdict(idle)})
        flight = await in_flight_bytes(config.in_flight, notable, config.relay_args)
        results.add("memory.in_flight", flight.per_item)
        results.detail("memory.in_flight", {"repetition": repetition, **asdict(flight)})
        _progress(
            f"[{repetition}/{config.repeat}] memory: {idle.per_item / 1024:.1f} KiB per idle "
            f"subscriber, {flight.per_item / 1024:.1f} KiB per in-flight message"
        )


async def run(config: Config) -> tuple[Results, list[str]]:
    """Measure every case; return the results and the warnings the servers logged."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    results = Results()
    notable: list[str] = []
    run_id = secrets.token_hex(3)
    measure_assemblers(config, results)
    _progress("starting redis-server, relays S, A, B, F, the no-op server and the socketio relay")
    async with running_cluster(config.relay_args) as cluster:
        try:
            await _warm_up(cluster, config, run_id)
            # Repetition-major: the cases of one repetition run close together in time, so
            # a noisy spell on the machine hits all of them rather than one.
            for repetition in range(1, config.repeat + 1):
                await _ingest_round(cluster, config, results, run_id, repetition)
                await _routes_round(cluster, config, results, run_id, repetition)
            await _fanout_phase(cluster, config, results, run_id)
            cluster.check_alive()
        except ConnectionClosed as exc:
            raise BenchError(f"a connection closed unexpectedly: {exc}") from None
        finally:
            notable.extend(
                f"{service.name}: {line}"
                for service in cluster.services
                for line in service.notable
            )
    await _memory_phase(config, results, notable)
    return results, notable


def _headline(config: Config) -> str:
    events = config.deltas + 1
    return (
        f"token-relay benchmark: messages of {config.deltas} deltas + a final ({events} events, "
        f"about {4 * config.deltas} characters); median of {config.repeat} "
        f"repetition{'s' if config.repeat > 1 else ''}; {os.cpu_count()} CPUs"
    )


def _workloads(config: Config) -> str:
    return textwrap.fill(
        f"Workloads: ingest {config.ingest_messages:,} messages per run (socketio "
        f"{config.socketio_messages:,}), as fast as the server takes them; fan-out "
        f"{config.fanout_messages} messages per configuration and repetition, deltas "
        f"{DELTA_GAP * 1000:g} ms apart, final -> every subscriber holds it; latency "
        f"{config.latency_messages} messages at {config.rate:g} msg/s; Redis throughput "
        f"{config.messages:,} messages as fast as possible.",
        WIDTH,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (1 when a check failed, 130 when interrupted)."""
    config, outputs = parse_args(argv)
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
    rows = table_rows(results, asdict(config))
    goals = targets(results)
    headline = _headline(config)
    print(f"\n{headline}\n")
    print(format_table(rows))
    print()
    flags = "".join(f" {arg}" for arg in config.relay_args)
    print(textwrap.fill(NOTE.format(extra=flags), WIDTH))
    print(_workloads(config))
    print("\nTargets:")
    print(format_targets(goals))
    if notable:
        print("\nThe servers logged warnings or errors:")
        print("\n".join(f"  {line}" for line in notable))
    print(f"\nfinished in {elapsed:.0f} s")
    if outputs.json is not None:
        extra = {
            "config": asdict(config),
            "environment": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
            },
            "elapsed_seconds": elapsed,
            "server_warnings": notable,
        }
        record = to_json(results, rows, goals, extra)
        outputs.json.parent.mkdir(parents=True, exist_ok=True)
        outputs.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"results written to {outputs.json}")
    if outputs.chart is not None:
        from .chart import write_chart

        write_chart(outputs.chart, results, goals, config.fanout_sizes, headline)
        print(f"chart written to {outputs.chart}")
    return 0
