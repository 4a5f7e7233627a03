"""``python -m bench``: options, the order of measurements, and the printed report."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import secrets
import signal
import sys
import textwrap
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

from token_relay.testing import ServiceProcess
from websockets.exceptions import ConnectionClosed

from . import cases
from .assembly import ASSEMBLERS, run_assembler
from .cases import DELTA_GAP, IN_FLIGHT_CHARS, ROUTES, check_alive
from .report import Results, format_table, format_targets, percentile, table_rows, targets, to_json
from .subscribers import SubscriberPool
from .wire import BenchError, build_messages

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


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """What to measure (the defaults are the full run); see :data:`OPTIONS` for most fields."""

    repeat: int = 3
    deltas: int = 10
    assembler_messages: int = 20_000
    """Messages per assembler pass on the short workload."""
    long_messages: int = 100
    """Messages per assembler pass on the long workload, of ``long_chars`` characters."""
    long_chars: int = IN_FLIGHT_CHARS
    ingest_messages: int = 10_000
    socketio_messages: int = 3_000
    batch: int = 100
    fanout_sizes: tuple[int, ...] = (1_000, 10_000)
    fanout_messages: int = 6
    fanout_processes: int = 4
    """Subscriber processes for the largest fan-out (fewer for smaller ones)."""
    messages: int = 2_000
    rate: float = 200.0
    latency_messages: int = 600
    idle_subscribers: int = 2_000
    in_flight: int = 100
    relay_args: tuple[str, ...] = ()
    """Extra flags for every relay process, such as ``--loop=uvloop``."""


QUICK: dict[str, Any] = {
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
"""What ``--quick`` changes."""
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


def parse_args(argv: Sequence[str] | None) -> tuple[Config, Path | None, Path | None]:
    """The configuration, and where to write the JSON record and the chart, if anywhere."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure token-relay: the assembler, ingest against a no-op server and a "
        "python-socketio relay, batched ingest, fan-out to 1,000 and 10,000 subscribers, "
        "latency, memory, and the Redis paths. Prints one table and the targets.",
    )
    full = Config()
    for name, help_text in OPTIONS.items():
        default = getattr(full, name)
        flag, kind = f"--{name.replace('_', '-')}", type(default)
        parser.add_argument(flag, type=kind, help=f"{help_text} ({default:g})")
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
    values = dict(QUICK if args.quick else {}, relay_args=tuple(args.relay_arg))
    for name in OPTIONS:
        if (given := getattr(args, name)) is not None:
            if given < 1 and not (name == "deltas" and given == 0):
                parser.error(f"--{name.replace('_', '-')} must be at least 1")
            values[name] = given
    return dataclasses.replace(full, **values), args.json, args.chart


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _ms(seconds: Sequence[float], digits: int) -> list[float]:
    return [round(value * 1000, digits) for value in seconds]


class Run:
    """One run: its configuration, results, the servers' warnings, and the cases in order."""

    def __init__(self, config: Config) -> None:
        self.config, self.results = config, Results()
        self.notable: list[str] = []
        self.run_id = secrets.token_hex(3)

    def channel(self, case: str, repetition: int) -> str:
        """A channel of its own for every case and repetition."""
        return f"bench-{self.run_id}-{case}-{repetition}"

    def assemblers(self) -> None:
        """The assembler case, in this process, before any other process starts."""
        config, results = self.config, self.results
        for workload, messages in (
            ("short", build_messages(config.assembler_messages, config.deltas)),
            ("long", build_messages(config.long_messages, config.long_chars // 4)),
        ):
            run_assembler("floor", messages[: len(messages) // 10 or 1])  # warm-up
            for repetition in range(1, config.repeat + 1):
                for key in ASSEMBLERS:
                    events, seconds = run_assembler(key, messages)
                    record = {"repetition": repetition, "events": events, "seconds": seconds}
                    results.add(f"assembler.{workload}.{key}", events / seconds, record)
            rates = [
                f"{key} {results.median(f'assembler.{workload}.{key}'):,.0f}" for key in ASSEMBLERS
            ]
            _progress(f"assembler, {workload} messages: {', '.join(rates)} events/s")

    async def warm_up(self, c: dict[str, ServiceProcess]) -> None:
        """Every server's code paths run once before anything is measured."""
        _progress("warming up")
        messages = build_messages(min(self.config.ingest_messages, 1000), self.config.deltas)
        await cases.stream(c["S"], c["S"], self.channel("warm-ingest", 0), messages)
        await cases.noop_ingest(c["noop"], messages)
        await cases.socketio_ingest(c["socketio"], self.channel("warm-sio", 0), messages[:300])
        for key, (_, producer, subscriber) in ROUTES.items():
            some = messages[: min(self.config.messages, 200)]
            await cases.stream(c[producer], c[subscriber], self.channel(f"warm-{key}", 0), some)

    async def ingest(self, c: dict[str, ServiceProcess], n: int) -> None:
        """Relay, no-op server and socketio ingest, then batched."""
        config, relay, rates = self.config, c["S"], {}
        messages = build_messages(config.ingest_messages, config.deltas)

        async def file(key: str, measure: Awaitable[dict[str, Any]]) -> None:
            record = await measure
            record.pop("samples", None)
            self.results.add(key, record["events_per_second"], {"repetition": n, **record})
            rates[key] = f"{record['events_per_second']:,.0f}"

        await file("ingest.relay", cases.stream(relay, relay, self.channel("ingest", n), messages))
        await file("ingest.noop", cases.noop_ingest(c["noop"], messages))
        some = messages[: config.socketio_messages]
        await file(
            "ingest.socketio",
            cases.socketio_ingest(c["socketio"], self.channel("socketio", n), some),
        )
        line = (
            f"[{n}/{config.repeat}] ingest: relay {rates['ingest.relay']}, "
            f"no-op {rates['ingest.noop']}, socketio {rates['ingest.socketio']} events/s"
        )
        if "batched" not in self.results.notes:
            channel = self.channel("batched", n)
            try:
                await file(
                    "batched.relay",
                    cases.stream(relay, relay, channel, messages, batch=config.batch),
                )
                line += f"; batched {rates['batched.relay']}"
            except cases.Unsupported as exc:
                self.results.notes["batched"] = f"the relay does not take array frames ({exc})"
                _progress(f"batched ingest skipped: {exc}")
        # The no-op server reads array frames in a blink: ten copies make the run timeable.
        await file("batched.noop", cases.noop_ingest(c["noop"], messages, config.batch, copies=10))
        _progress(line + f", batched no-op {rates['batched.noop']}")

    async def routes(self, c: dict[str, ServiceProcess], n: int) -> None:
        """Throughput and latency on the single instance and the Redis paths."""
        config = self.config
        fast_messages = build_messages(config.messages, config.deltas)
        paced_messages = build_messages(config.latency_messages, config.deltas)
        for key, (label, producer, subscriber) in ROUTES.items():
            check_alive(*c.values())
            route = (c[producer], c[subscriber])
            fast = await cases.stream(*route, self.channel(f"throughput-{key}", n), fast_messages)
            paced = await cases.stream(
                *route, self.channel(f"latency-{key}", n), paced_messages, rate=config.rate
            )
            samples = paced["samples"]
            p50, p99 = percentile(samples, 50) * 1000, percentile(samples, 99) * 1000
            for stat, value in (
                ("throughput", fast["events_per_second"]),
                ("p50", p50),
                ("p99", p99),
            ):
                self.results.add(f"routes.{key}.{stat}", value)
            throughput = {name: fast[name] for name in ("events", "seconds", "events_per_second")}
            latency = {
                "rate": config.rate,
                "p50_ms": p50,
                "p99_ms": p99,
                "max_ms": max(samples) * 1000,
            }
            record = {
                "repetition": n,
                "label": label,
                "throughput": {"messages": config.messages, **throughput},
                "latency": {**latency, "samples_ms": _ms(samples, 4)},
            }
            self.results.detail(f"routes.{key}", record)
            _progress(
                f"[{n}/{config.repeat}] {label}: {fast['events_per_second']:,.0f} events/s, "
                f"latency p50 {p50:.2f} ms, p99 {p99:.2f} ms"
            )

    async def fanout(self, c: dict[str, ServiceProcess]) -> None:
        """Fan-out to every size, with and without deltas, on one pool per size."""
        config, relay = self.config, c["F"]
        for size in config.fanout_sizes:
            processes = max(1, round(config.fanout_processes * size / max(config.fanout_sizes)))
            channel = self.channel(f"fanout-{size}", 0)
            _progress(f"fan-out: connecting {size:,} subscribers from {processes} processes")
            began = time.monotonic()
            async with SubscriberPool.running(
                relay.port, channel, size, processes, deltas_per_message=config.deltas, nice=10
            ) as pool:
                _progress(f"fan-out: {size:,} subscribed in {time.monotonic() - began:.1f} s")
                warm = build_messages(1, config.deltas, prefix="warm:")
                await cases.measure_fanout(relay, pool, channel, warm)
                for n in range(1, config.repeat + 1):
                    for deltas in (False, True):
                        check_alive(*c.values())
                        if deltas or n > 1:
                            await pool.ready(deltas)
                        mode = "deltas" if deltas else "plain"
                        messages = build_messages(
                            config.fanout_messages, config.deltas, prefix=f"{n}{mode}:"
                        )
                        run = await cases.measure_fanout(relay, pool, channel, messages)
                        samples, prefix = run["samples"], f"fanout.{size}.{mode}"
                        p50, p99 = percentile(samples, 50) * 1000, percentile(samples, 99) * 1000
                        self.results.add(prefix + ".p50", p50)
                        self.results.add(prefix + ".p99", p99)
                        record = {
                            "repetition": n,
                            "subscribers": size,
                            "deltas": deltas,
                            "delta_gap_ms": DELTA_GAP * 1000,
                            "p50_ms": p50,
                            "p99_ms": p99,
                            "samples_ms": _ms(samples, 3),
                            "first_arrival_ms": _ms(run["first"], 3),
                            "relay_cpu_ms": _ms(run["relay_cpu"], 1),
                            "client_cpu_ms": _ms(run["client_cpu"], 1),
                            "relay_busy": sum(run["relay_cpu"]) / sum(samples),
                            "clients_busy": sum(run["client_cpu"]) / sum(samples),
                        }
                        self.results.detail(prefix, record)
                        _progress(
                            f"[{n}/{config.repeat}] fan-out {size:,}"
                            f"{' with deltas' * deltas}: p50 {p50:.1f} ms, p99 {p99:.1f} ms"
                        )

    async def memory(self) -> None:
        """RSS per idle subscriber and per in-flight message, each on a fresh relay."""
        config, notable, relay_args = self.config, self.notable, self.config.relay_args
        for n in range(1, config.repeat + 1):
            idle = await cases.idle_subscriber_bytes(
                config.idle_subscribers, 2, notable, relay_args
            )
            flight = await cases.in_flight_bytes(config.in_flight, notable, relay_args)
            per_item = {}
            for key, record in (("idle", idle), ("in_flight", flight)):
                per_item[key] = (record["after"] - record["before"]) / record["count"] / 1024
                self.results.add(f"memory.{key}", per_item[key] * 1024, {"repetition": n, **record})
            _progress(
                f"[{n}/{config.repeat}] memory: {per_item['idle']:.1f} KiB per idle subscriber, "
                f"{per_item['in_flight']:.1f} KiB per in-flight message"
            )

    async def __call__(self) -> None:
        """Measure every case."""
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        self.assemblers()
        _progress(
            "starting redis-server, relays S, A, B, F, the no-op server and the socketio relay"
        )
        try:
            async with cases.running_cluster(self.config.relay_args, self.notable) as cluster:
                await self.warm_up(cluster)
                # Repetition-major: the cases of one repetition run close together in time,
                # so a noisy spell on the machine hits all of them rather than one.
                for n in range(1, self.config.repeat + 1):
                    await self.ingest(cluster, n)
                    await self.routes(cluster, n)
                await self.fanout(cluster)
                check_alive(*cluster.values())
        except ConnectionClosed as exc:
            raise BenchError(f"a connection closed unexpectedly: {exc}") from None
        await self.memory()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (1 when a check failed, 130 when interrupted)."""
    config, json_path, chart_path = parse_args(argv)
    began = time.monotonic()
    run = Run(config)
    try:
        asyncio.run(run())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("bench interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    elapsed = time.monotonic() - began
    results, notable = run.results, run.notable
    rows, goals = table_rows(results, dataclasses.asdict(config)), targets(results)
    headline = (
        f"token-relay benchmark: messages of {config.deltas} deltas + a final "
        f"({config.deltas + 1} events, about {4 * config.deltas} characters); median of "
        f"{config.repeat} repetition{'s' * (config.repeat > 1)}; {os.cpu_count()} CPUs"
    )
    workloads = (
        f"Workloads: ingest {config.ingest_messages:,} messages per run (socketio "
        f"{config.socketio_messages:,}), as fast as the server takes them; fan-out "
        f"{config.fanout_messages} messages per configuration and repetition, deltas "
        f"{DELTA_GAP * 1000:g} ms apart, final -> every subscriber holds it; latency "
        f"{config.latency_messages} messages at {config.rate:g} msg/s; Redis throughput "
        f"{config.messages:,} messages as fast as possible."
    )
    flags = "".join(f" {arg}" for arg in config.relay_args)
    print(f"\n{headline}\n\n{format_table(rows)}\n")
    print(textwrap.fill(NOTE.format(extra=flags), 100) + "\n" + textwrap.fill(workloads, 100))
    print(f"\nTargets:\n{format_targets(goals)}")
    if notable:
        print("\nThe servers logged warnings or errors:\n" + "\n".join(f"  {n}" for n in notable))
    print(f"\nfinished in {elapsed:.0f} s")
    if json_path is not None:
        environment = {"python": platform.python_version(), "platform": platform.platform()}
        extra = {
            "config": dataclasses.asdict(config),
            "environment": {**environment, "cpus": os.cpu_count()},
            "elapsed_seconds": elapsed,
            "server_warnings": notable,
        }
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(to_json(results, rows, goals, extra), indent=2) + "\n")
        print(f"results written to {json_path}")
    if chart_path is not None:
        from .chart import write_chart

        write_chart(chart_path, results, goals, config.fanout_sizes, headline)
        print(f"chart written to {chart_path}")
    return 0
