"""``python -m bench``: options, the order of measurements, and the printed report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import os
import platform
import secrets
import signal
import statistics
import sys
import textwrap
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from websockets.exceptions import ConnectionClosed

from tests.harness import ServiceProcess

from . import cases, durable, produceload, wsrelay
from . import durableprotocol as protocol
from .cases import ASSEMBLERS, ROUTES, run_assembler
from .report import (
    Results,
    format_markdown,
    format_table,
    format_targets,
    table_rows,
    targets,
    to_json,
)
from .subscribers import SubscriberPool
from .wire import BenchError, Message, build_messages

NOTE = (
    "Every row was measured in this run; each cell is the median over the repetitions (for "
    "latencies, of each repetition's p50 and p99); each ratio is the median of the "
    "per-repetition ratios. Compare the ratios more than the absolute numbers, which move from "
    "run to run on a shared machine. Relays run with their defaults "
    "except --max-events-per-second 1000000000, --max-connections-per-ip 100000, "
    "--max-handshakes-per-ip 100000 and --max-body-bytes 67108864{extra}. "
    "'server CPU' and 'relay CPU' are the server's CPU time over the measured wall time "
    "(fan-out: over the final-to-last-subscriber spans): near 100%, the server, not the load "
    "generator or the clients, was the limit; 'clients' is the subscriber processes' CPU "
    "time, all together, over the same spans."
)
T = TypeVar("T")


def option(full: T, quick: T | None = None, help: str = "") -> T:
    """A :class:`Config` field: its full-run value, its ``--quick`` one, its ``--help``."""
    metadata = {"quick": full if quick is None else quick, "help": help}
    field: T = dataclasses.field(default=full, metadata=metadata)
    return field


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """What to measure; the fields with a help text are command-line options."""

    repeat: int = option(3, 1, "repetitions; medians are reported")
    deltas: int = option(10, help="deltas per message, plus a final")
    assembler_messages: int = option(20_000, 4_000)  # per pass, short workload
    long_messages: int = option(100, 20)  # per pass, messages of long_chars characters
    long_chars: int = option(cases.IN_FLIGHT_CHARS)  # in four-character deltas
    ingest_messages: int = option(10_000, 2_000, "messages per ingest run")
    socketio_messages: int = option(3_000, 600, "messages per python-socketio ingest run")
    batch: int = option(100, help="events per array frame, batched ingest")
    fanout_sizes: tuple[int, ...] = option((1_000, 10_000))
    fanout_messages: int = option(6, 2, "messages per fan-out configuration and repetition")
    fanout_processes: int = option(4)  # subscriber processes for the largest fan-out
    durable_messages: int = option(2_000, 300, "messages per run, HTTP publish vs durable-streams")
    durable_rate: float = option(200.0, help="messages per second, SSE latency vs durable-streams")
    durable_seconds: float = option(5.0, 2.0, "seconds per wrk run, Durable Streams appends")
    durable_reads: int = option(5, 2)  # catch-up reads of 10 MB per repetition
    messages: int = option(2_000, 300, "messages per throughput run on the Redis paths")
    rate: float = option(1000.0, help="messages per second, latency case")
    latency_messages: int = option(600, 100, "messages per latency run")
    idle_subscribers: int = option(2_000, 1_000, "idle subscribers, memory case")
    in_flight: int = option(100, 20, "unfinished 10k-character messages, memory case")
    relay_args: tuple[str, ...] = option(())  # extra flags for every relay
    compare_python: str = option("")  # another installation's python: its relay beside ours


def parse_args(
    argv: Sequence[str] | None,
) -> tuple[Config, Path | None, Path | None, Path | None]:
    """The configuration, and where to write the JSON record, the chart and the Markdown
    table, if anywhere."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Measure token-relay: the assembler, ingest against a no-op server and a "
        "python-socketio relay, batched ingest, fan-out to 1,000 and 10,000 subscribers, "
        "latency, memory, and the Redis paths. Prints one table and the targets.",
    )
    options = [field for field in dataclasses.fields(Config) if field.metadata["help"]]
    for field in options:
        flag, help_text = f"--{field.name.replace('_', '-')}", field.metadata["help"]
        parser.add_argument(flag, type=type(field.default), help=f"{help_text} ({field.default:g})")
    relay_help = "an extra flag for every relay, e.g. --relay-arg=--loop=uvloop (repeatable)"
    parser.add_argument("--relay-arg", action="append", default=[], metavar="FLAG", help=relay_help)
    compare_help = (
        "the python of another installation of token-relay (an earlier version): its relay "
        "is measured beside this one's, in the same run, for ingest and fan-out"
    )
    parser.add_argument("--compare-python", default="", metavar="PYTHON", help=compare_help)
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every result as JSON")
    parser.add_argument("--chart", type=Path, metavar="PATH", help="draw the results as a PNG")
    parser.add_argument(
        "--markdown", type=Path, metavar="PATH", help="write the table and targets as Markdown"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of under a minute")
    args = parser.parse_args(argv)
    values = {field.name: field.metadata["quick"] for field in dataclasses.fields(Config)}
    values = (values if args.quick else {}) | {"relay_args": tuple(args.relay_arg)}
    values["compare_python"] = args.compare_python
    for field in options:
        if (given := getattr(args, field.name)) is not None:
            if given < 1 and not (field.name == "deltas" and given == 0):
                parser.error(f"--{field.name.replace('_', '-')} must be at least 1")
            values[field.name] = given
    return Config(**values), args.json, args.chart, args.markdown


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Run:
    """One run: its configuration, results, the servers' warnings, and the cases in order."""

    def __init__(self, config: Config) -> None:
        self.config, self.results = config, Results()
        self.notable: list[str] = []
        self.run_id = secrets.token_hex(3)

    def channel(self, case: str, repetition: int) -> str:
        return f"bench-{self.run_id}-{case}-{repetition}"

    def assemblers(self) -> None:
        """The assembler case, in this process, before any other process starts."""
        config = self.config
        for workload, messages in (
            ("short", build_messages(config.assembler_messages, config.deltas)),
            ("long", build_messages(config.long_messages, config.long_chars // 4)),
        ):
            run_assembler("floor", messages[: len(messages) // 10 or 1])  # warm-up
            for n in range(1, config.repeat + 1):
                for key in ASSEMBLERS:
                    events, seconds = run_assembler(key, messages)
                    record = {"repetition": n, "events": events, "seconds": seconds}
                    self.results.add(f"assembler.{workload}.{key}", events / seconds, record)
            prefix = f"assembler.{workload}."
            summary = ", ".join(f"{k} {self.results.median(prefix + k):,.0f}" for k in ASSEMBLERS)
            _progress(f"assembler, {workload} messages: {summary} events/s")

    async def warm_up(self, c: dict[str, ServiceProcess]) -> None:
        """Every server's code paths run once before anything is measured."""
        _progress("warming up")
        messages = build_messages(min(self.config.ingest_messages, 1000), self.config.deltas)
        await cases.stream(c["S"], c["S"], self.channel("warm-ingest", 0), messages)
        await cases.stream(c["noop"], None, "", messages)
        await cases.socketio_ingest(c["socketio"], self.channel("warm-sio", 0), messages[:300])
        await cases.http_ingest(c["S"], self.channel("warm-http", 0), messages)
        await cases.stream(c["floor"], c["floor"], self.channel("warm-floor", 0), messages)
        await cases.stream(c["wsrelay"], c["wsrelay"], self.channel("warm-wsrelay", 0), messages)
        for key, (_, producer, subscriber) in ROUTES.items():
            some = messages[: min(self.config.messages, 200)]
            await cases.stream(c[producer], c[subscriber], self.channel(f"warm-{key}", 0), some)

    async def ingest(self, c: dict[str, ServiceProcess], n: int) -> None:
        """Relay, Node ws relay, no-op server and socketio ingest, then batched."""
        config, relay, noop, stream, rates = self.config, c["S"], c["noop"], cases.stream, {}
        messages, batch = build_messages(config.ingest_messages, config.deltas), config.batch

        async def file(key: str, measure: Awaitable[dict[str, Any]]) -> None:
            record = await measure
            rates[key] = record["events_per_second"]
            self.results.add(key, rates[key], {"repetition": n, **record})

        await file("ingest.relay", stream(relay, relay, self.channel("ingest", n), messages))
        peer = c["wsrelay"]
        await file("ingest.wsrelay", stream(peer, peer, self.channel("ingest-ws", n), messages))
        floor = c["floor"]
        await file("ingest.floor", stream(floor, floor, self.channel("ingest-floor", n), messages))
        if "S0" in c:
            channel = self.channel("ingest-compare", n)
            await file("ingest.compare", stream(c["S0"], c["S0"], channel, messages))
        await file("ingest.noop", stream(noop, None, "", messages))
        channel = self.channel("http", n)
        await file("ingest.http", cases.http_ingest(relay, channel, messages))
        some, channel = messages[: config.socketio_messages], self.channel("socketio", n)
        await file("ingest.socketio", cases.socketio_ingest(c["socketio"], channel, some))
        channel = self.channel("batched", n)
        await file("batched.relay", stream(relay, relay, channel, messages, batch=batch))
        if "S0" in c:
            channel = self.channel("batched-compare", n)
            await file("batched.compare", stream(c["S0"], c["S0"], channel, messages, batch=batch))
        channel = self.channel("batched-floor", n)
        await file("batched.floor", stream(floor, floor, channel, messages, batch=batch))
        # The no-op server reads array frames in a blink: ten copies make the run timeable.
        await file("batched.noop", stream(noop, None, "", messages, batch=batch, copies=10))
        summary = ", ".join(f"{key} {value:,.0f}" for key, value in rates.items())
        _progress(f"[{n}/{config.repeat}] events/s: {summary}")

    async def routes(self, c: dict[str, ServiceProcess], n: int) -> None:
        """Throughput and latency on the single instance and the Redis paths."""
        config = self.config
        fast = build_messages(config.messages, config.deltas)
        paced = build_messages(config.latency_messages, config.deltas)
        for key, (label, producer, subscriber) in ROUTES.items():
            cases.check_alive(*c.values())
            route = (c[producer], c[subscriber])
            throughput = await cases.stream(*route, self.channel(f"throughput-{key}", n), fast)
            channel = self.channel(f"latency-{key}", n)
            latency = (await cases.stream(*route, channel, paced, rate=config.rate))["latency"]
            rate, p50, p99 = throughput["events_per_second"], latency["p50_ms"], latency["p99_ms"]
            for stat, value in (("throughput", rate), ("p50", p50), ("p99", p99)):
                self.results.add(f"routes.{key}.{stat}", value)
            throughput = {k: throughput[k] for k in ("events", "seconds", "events_per_second")}
            record = {"repetition": n, "label": label}
            record |= {"throughput": {"messages": config.messages, **throughput}}
            record |= {"latency": {"rate": config.rate, **latency}}
            self.results.detail(f"routes.{key}", record)
            _progress(f"[{n}/{config.repeat}] {label}: {rate:,.0f} events/s, p50 {p50:.2f} ms")
        # The same paced load through the os.write floor: what the load generator and the
        # loopback cost, beside the relay's own latency.
        channel = self.channel("latency-floor", n)
        floor = c["floor"]
        latency = (await cases.stream(floor, floor, channel, paced, rate=config.rate))["latency"]
        for stat in ("p50", "p99"):
            self.results.add(f"routes.floor.{stat}", latency[f"{stat}_ms"])
        _progress(f"[{n}/{config.repeat}] os.write floor: p99 {latency['p99_ms']:.2f} ms")

    async def fanout(self, c: dict[str, ServiceProcess]) -> None:
        """Fan-out to every size, with and without deltas, on one pool per size and relay:
        the relay, the os.write floor and (``--compare-python``) the previous version in
        turn, a repetition of each before the next (so that a ratio between them pairs
        measurements taken minutes apart at most, not a whole case apart); then SSE
        streams, --workers 2 on Redis and the Node ws relay, each in a run of its own."""
        paired = [(c["F"], "fanout"), (c["floor"], "fanout-floor")]
        if "F0" in c:
            paired.append((c["F0"], "fanout-compare"))
        await self.fanout_of(c, paired)
        await self.fanout_of(c, [(c["F"], "fanout-sse")], sse=True)
        await self.fanout_of(c, [(c["W"], "fanout-workers")], deltas=False)
        # The Node ws relay at the smallest size (1,000), plain messages: the peer.
        smallest = (min(self.config.fanout_sizes),)
        await self.fanout_of(c, [(c["wsrelay"], "fanout-wsrelay")], deltas=False, sizes=smallest)

    async def fanout_of(
        self,
        c: dict[str, ServiceProcess],
        relays: Sequence[tuple[ServiceProcess, str]],
        *,
        sse: bool = False,
        deltas: bool = True,
        sizes: Sequence[int] = (),
    ) -> None:
        """Fan-out from each of ``relays`` (a relay, and the case its results' keys start
        with), in turn within each repetition, each on a pool of its own: over SSE streams
        with ``sse``, plain messages only without ``deltas``, to ``sizes`` subscribers (by
        default every configured size)."""
        config = self.config
        for size in sizes or config.fanout_sizes:
            processes = max(1, round(config.fanout_processes * size / max(config.fanout_sizes)))
            options = {"deltas_per_message": config.deltas, "nice": 10, "sse": int(sse)}
            async with contextlib.AsyncExitStack() as stack:
                pools: list[tuple[ServiceProcess, str, str, SubscriberPool]] = []
                for relay, case in relays:
                    channel, began = self.channel(f"{case}-{size}", 0), time.monotonic()
                    pool = await stack.enter_async_context(
                        SubscriberPool.running(relay.port, channel, size, processes, **options)
                    )
                    took = time.monotonic() - began
                    _progress(
                        f"{case}: {size:,} subscribers in {processes} processes in {took:.1f} s"
                    )
                    warm = build_messages(1, config.deltas, prefix="warm:")
                    await cases.measure_fanout(relay, pool, channel, warm)
                    pools.append((relay, case, channel, pool))
                modes = (False, True) if deltas else (False,)
                for n, live in itertools.product(range(1, config.repeat + 1), modes):
                    for relay, case, channel, pool in pools:
                        cases.check_alive(*c.values())
                        if deltas and (live or n > 1):
                            await pool.ready(live)
                        mode = "deltas" if live else "plain"
                        some = build_messages(config.fanout_messages, config.deltas, f"{n}{mode}:")
                        run = await cases.measure_fanout(relay, pool, channel, some)
                        record: dict[str, Any] = {"repetition": n, "subscribers": size}
                        record["deltas"] = live
                        record |= {"delta_gap_ms": cases.DELTA_GAP * 1000, **run}
                        key = f"{case.replace('-', '.')}.{size}.{mode}"
                        self.results.detail(key, record)
                        for stat in ("p50", "p99"):
                            self.results.add(f"{key}.{stat}", run[f"{stat}_ms"])
                        self.results.add(f"{key}.first", statistics.median(run["first_arrival_ms"]))
                        _progress(
                            f"[{n}/{config.repeat}] {case} {size:,}{' with deltas' * live}: "
                            f"p50 {run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms"
                        )

    async def memory(self) -> None:
        """RSS per idle subscriber and per in-flight message, each on a fresh relay."""
        config, notable, relay_args = self.config, self.notable, self.config.relay_args
        for n in range(1, config.repeat + 1):
            idle = await cases.memory("idle", config.idle_subscribers, notable, relay_args)
            sse = await cases.memory("idle_sse", config.idle_subscribers, notable, relay_args)
            flight = await cases.memory("in_flight", config.in_flight, notable, relay_args)
            for key, run in (("idle", idle), ("idle_sse", sse), ("in_flight", flight)):
                per_item = (run["after"] - run["before"]) / run["count"]
                self.results.add(f"memory.{key}", per_item, {"repetition": n, **run})
                _progress(f"[{n}/{config.repeat}] memory, {key}: {per_item / 1024:.1f} KiB each")

    async def durable(self, c: dict[str, ServiceProcess]) -> None:
        """HTTP publish and SSE delivery beside the @durable-streams/server reference server."""
        config, relay = self.config, c["S"]
        throughput = build_messages(config.durable_messages, config.deltas)
        paced = build_messages(min(config.durable_messages, 300), config.deltas, prefix="l")
        _progress("starting the @durable-streams/server reference server (Node)")
        await durable.install()
        load = protocol.Load(
            config.durable_seconds, len(paced), config.durable_rate, config.durable_reads
        )
        async with durable.running_reference() as (port, pid):
            for n in range(1, config.repeat + 1):
                await self.durable_protocol(relay, port, pid, load, paced, n)
                await self.produce_load(relay, c["pyproduce"], load, n, c["A"])
                channel = self.channel("publish", n)
                ours = await durable.relay_http_publish(relay.port, channel, throughput)
                theirs = await durable.durable_appends(port, throughput)
                rate = config.durable_rate
                channel = self.channel("sse-latency", n)
                ours_sse = await durable.relay_sse_latency(relay.port, channel, paced, rate)
                theirs_sse = await durable.durable_sse_latency(port, paced, rate)
                self.results.add("durable.relay.publish", ours["messages_per_second"], ours)
                self.results.add("durable.peer.appends", theirs["appends_per_second"], theirs)
                for side, record in (("relay", ours_sse), ("peer", theirs_sse)):
                    for stat in ("p50", "p99"):
                        self.results.add(f"durable.{side}.sse.{stat}", record[f"{stat}_ms"])
                    self.results.detail(f"durable.{side}.sse", record)
                _progress(
                    f"[{n}/{config.repeat}] HTTP: relay {ours['messages_per_second']:,.0f} "
                    f"posts/s, durable-streams {theirs['appends_per_second']:,.0f} appends/s; "
                    f"SSE p99 {ours_sse['p99_ms']:.2f} vs {theirs_sse['p99_ms']:.2f} ms"
                )

    async def produce_load(
        self,
        relay: ServiceProcess,
        floor: ServiceProcess,
        load: protocol.Load,
        n: int,
        shared: ServiceProcess | None = None,
    ) -> None:
        """``POST /produce`` under wrk, 16 connections, one completed message per request,
        right after the reference's appends under the same load; then the same load on a
        relay on Redis (``shared``), on the Python floor of that job
        (``bench.producefloor``), and ``GET /healthz`` of the relay (its HTTP edge alone, no
        relay work)."""
        channel = self.channel("produce-load", n)
        record = await produceload.produce_load(relay.port, relay.pid, channel, load.seconds)
        self.results.add("durable.relay.produce", record["posts_per_second"], record)
        redis = ""
        if shared is not None:
            channel, seconds = self.channel("produce-load-redis", n), load.seconds
            on_redis = await produceload.produce_load(shared.port, shared.pid, channel, seconds)
            self.results.add("durable.redis.produce", on_redis["posts_per_second"], on_redis)
            base = f"http://127.0.0.1:{shared.port}/v1/stream/"
            stream = await protocol.appends(base, load, [shared.pid])
            self.results.add("durable.redis.appends", stream["appends_per_second"], stream)
            redis = (
                f" (on Redis {on_redis['posts_per_second']:,.0f}/s, "
                f"its Durable Streams appends {stream['appends_per_second']:,.0f}/s)"
            )
        least = await produceload.floor_load(floor.port, floor.pid, load.seconds)
        self.results.add("durable.floor.produce", least["posts_per_second"], least)
        edge = await produceload.edge_load(relay.port, relay.pid, load.seconds)
        self.results.add("durable.relay.edge", edge["requests_per_second"], edge)
        peer = self.results.samples.get("durable.peer.stream.appends", [math.nan])[-1]
        _progress(
            f"[{n}/{self.config.repeat}] POST /produce, 16 connections: "
            f"{record['posts_per_second']:,.0f}/s{redis}; its Python floor "
            f"{least['posts_per_second']:,.0f}/s; its edge alone (GET /healthz) "
            f"{edge['requests_per_second']:,.0f}/s; reference appends {peer:,.0f}/s"
        )

    async def durable_protocol(
        self,
        relay: ServiceProcess,
        port: int,
        pid: int,
        load: protocol.Load,
        paced: Sequence[Message],
        n: int,
    ) -> None:
        """The Durable Streams figures (:mod:`bench.durableprotocol`): the relay's
        ``/v1/stream/`` beside the reference server."""
        sides = (
            ("relay", f"http://127.0.0.1:{relay.port}/v1/stream/", relay.pid),
            ("peer", f"http://127.0.0.1:{port}/", pid),
        )
        for side, base, server in sides:
            record = await protocol.figures(base, load, paced, [server])
            if "refused" in record:
                raise BenchError(f"Durable Streams at {base}: {record['refused']['request']}")
            prefix = f"durable.{side}.stream"
            self.results.add(f"{prefix}.appends", record["appends"]["appends_per_second"])
            self.results.add(f"{prefix}.sse.p99", record["sse"]["p99_ms"])
            self.results.add(f"{prefix}.catch_up", record["catch_up"]["mb_per_second"])
            self.results.detail(f"{prefix}", record)
            _progress(
                f"[{n}/{self.config.repeat}] Durable Streams, {side}: "
                f"{record['appends']['appends_per_second']:,.0f} appends/s, "
                f"SSE p99 {record['sse']['p99_ms']:.2f} ms, "
                f"10 MB at {record['catch_up']['mb_per_second']:,.0f} MB/s"
            )

    async def __call__(self) -> None:
        """Measure every case."""
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        self.assemblers()
        await wsrelay.install()
        _progress("starting redis-server, relays S, A, B, F and W, the three peers and the floor")
        try:
            async with cases.running_cluster(
                self.config.relay_args, self.notable, self.config.compare_python
            ) as cluster:
                await self.warm_up(cluster)
                # Repetition-major: the cases of one repetition run close together in time,
                # so a noisy spell on the machine hits all of them rather than one.
                for n in range(1, self.config.repeat + 1):
                    await self.ingest(cluster, n)
                    await self.routes(cluster, n)
                await self.fanout(cluster)
                await self.durable(cluster)
                cases.check_alive(*cluster.values())
        except ConnectionClosed as exc:
            raise BenchError(f"a connection closed unexpectedly: {exc}") from None
        await self.memory()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (1 when a check failed, 130 when interrupted)."""
    config, json_path, chart_path, markdown_path = parse_args(argv)
    began, run = time.monotonic(), Run(config)
    try:
        asyncio.run(run())
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("bench interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    elapsed, results, notable = time.monotonic() - began, run.results, run.notable
    cores = os.cpu_count() or 1
    rows, goals = table_rows(results, dataclasses.asdict(config)), targets(results, cores)
    headline = (
        f"token-relay benchmark: messages of {config.deltas} deltas + a final "
        f"({config.deltas + 1} events, about {4 * config.deltas} characters); median of "
        f"{config.repeat} repetition{'s' * (config.repeat > 1)}; {cores} CPUs"
    )
    workloads = (
        f"Workloads: ingest {config.ingest_messages:,} messages per run (socketio "
        f"{config.socketio_messages:,}), as fast as the server takes them; fan-out "
        f"{config.fanout_messages} messages per configuration and repetition, deltas "
        f"{cases.DELTA_GAP * 1000:g} ms apart, final -> every subscriber holds it; latency "
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
        environment: dict[str, Any] = {"python": platform.python_version()}
        environment["platform"] = platform.platform()
        recorded = dataclasses.asdict(config)
        if recorded["compare_python"]:
            # Where another installation lies on this machine says nothing about the run.
            recorded["compare_python"] = "another installation's python"
        extra: dict[str, Any] = {"config": recorded, "environment": environment}
        environment["cpus"] = cores
        extra |= {"elapsed_seconds": elapsed, "server_warnings": notable}
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(to_json(results, rows, goals, extra), indent=2) + "\n")
        print(f"results written to {json_path}")
    if markdown_path is not None:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(format_markdown(rows, goals))
        print(f"table written to {markdown_path}")
    if chart_path is not None:
        from .chart import write_chart

        write_chart(chart_path, results, goals, config.fanout_sizes, headline)
        print(f"chart written to {chart_path}")
    return 0
