"""Medians over repetitions (:class:`Results`, by key such as ``fanout.10000.plain.p99``),
the printed table, the targets and the JSON record."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .cases import ASSEMBLERS, ROUTES

NOOP_GOAL, SOCKETIO_GOAL, BATCHED_GOAL, REDIS_GOAL = 0.8, 10.0, 1e6, 0.5
FLOOR_GOAL, FIRST_GOAL_MS, FANOUT_GOAL_MS, SSE_GOAL, HTTP_GOAL = 1.2, 2.0, 100.0, 1.1, 0.9
RSS_GOAL_KIB, LATENCY_GOAL_MS = 16.0, 1.0
Row = tuple[str, str, str, str]  # case, what was measured, its median, how it compares
Target = dict[str, Any]  # key, label, value, goal, comparison, met, attainment, verdict, shown


def _median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else math.nan


def _ratio(value: float, baseline: float) -> float:
    bad = math.isnan(value) or math.isnan(baseline) or not baseline
    return math.nan if bad else value / baseline


@dataclass
class Results:
    """Every value measured in a run: headline ``samples`` per key, one per repetition; raw
    ``details`` per case, for the JSON record; ``notes`` on why a case has no value."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    details: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def add(self, key: str, value: float, record: dict[str, Any] | None = None) -> None:
        """File one repetition's value, and its raw ``record`` under the same key."""
        self.samples.setdefault(key, []).append(value)
        if record is not None:
            self.detail(key, record)

    def detail(self, case: str, record: dict[str, Any]) -> None:
        """Keep one raw measurement."""
        self.details.setdefault(case, []).append(record)

    def median(self, key: str) -> float:
        """The median over repetitions, NaN when nothing was measured."""
        return _median(self.samples.get(key, ()))

    def ratio(self, key: str, baseline: str) -> float:
        """``key`` over ``baseline``: the median of the per-repetition ratios, which pairs values
        measured close together in time (the ratio of the medians when the counts differ)."""
        values, bases = self.samples.get(key, []), self.samples.get(baseline, [])
        if not values or len(values) != len(bases):
            return _ratio(self.median(key), self.median(baseline))
        return statistics.median(_ratio(v, b) for v, b in zip(values, bases, strict=True))

    def busy(self, key: str, name: str = "server_busy") -> float:
        """The median of ``name`` over the case's records that have it."""
        return _median(d[name] for d in self.details.get(key, []) if name in d)

    def cpu_per_message(self, key: str) -> tuple[float, float]:
        """A fan-out case's CPU time per message, in ms, of the relay (every process of it)
        and of the subscribers' client processes: medians over its messages, then over its
        repetitions. Both are spent between the final and its last delivery, so on N cores
        that takes at least their sum over N, however well the work is spread."""
        records = [d for d in self.details.get(key, []) if d.get("relay_cpu_ms")]
        return (
            _median(_median(d["relay_cpu_ms"]) for d in records),
            _median(_median(d["client_cpu_ms"]) for d in records),
        )


def _rate(value: float, unit: str = "events/s") -> str:
    return "n/a" if math.isnan(value) else f"{value:,.0f} {unit}"


def times(value: float) -> str:
    """A ratio as text: ``0.25x``, ``12.5x``."""
    return "n/a" if math.isnan(value) else f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


def _ms(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def table_rows(results: Results, config: dict[str, Any]) -> list[Row]:
    """The rows of the table, in order."""
    r, rows = results, []

    def add(case: str, what: str, key: str, compared: str = "", cpu: bool = False) -> None:
        value = r.median(key)
        if key.startswith("fanout.") or key in ("routes.single", "routes.floor"):
            if math.isnan(r.median(key + ".p50")) and "compare" in key:
                return
            p50, p99 = r.median(key + ".p50"), r.median(key + ".p99")
            text = "n/a" if math.isnan(p50) else f"p50 {_ms(p50)} ms, p99 {_ms(p99)} ms"
        elif key.startswith("memory."):
            text = "n/a" if math.isnan(value) else f"{value / 1024:,.1f} KiB"
        else:
            if math.isnan(value) and "compare" in key:
                return
            text = _rate(value, "frames/s" if key == "ingest.noop" else "events/s")
        busy = r.busy(key) if cpu else math.nan
        server = "" if math.isnan(busy) else f"server CPU {busy:.0%}"
        rows.append((case, what, text, "; ".join(part for part in (compared, server) if part)))

    def versus(key: str, *baselines: str) -> str:
        pairs = zip(baselines[::2], baselines[1::2], strict=True)
        return ", ".join(f"{times(r.ratio(key, base))} {name}" for base, name in pairs)

    for workload, description in (
        ("short", f"{config['deltas']}-delta messages"),
        ("long", f"{config['long_chars']:,}-char messages"),
    ):
        for kind, (label, _) in ASSEMBLERS.items():
            key, base = f"assembler.{workload}.{kind}", f"assembler.{workload}."
            compared = versus(key, base + "floor", "floor", base + "naive", "naive")
            add("assembler", f"{label}, {description}", key, compared * (kind == "token"))
    compared = versus("ingest.relay", "ingest.noop", "no-op", "ingest.socketio", "socketio")
    add("ingest", "relay, 1 producer -> 1 subscriber", "ingest.relay", compared, cpu=True)
    compared = versus("ingest.compare", "ingest.noop", "no-op", "ingest.relay", "this relay")
    add("ingest", "--compare-python's relay, the same", "ingest.compare", compared, cpu=True)
    compared = versus("ingest.http", "ingest.relay", "WebSocket ingest")
    add("ingest", "relay, the same as NDJSON in one chunked POST", "ingest.http", compared, True)
    add("ingest", "no-op websockets server (ceiling)", "ingest.noop", cpu=True)
    add("ingest", "python-socketio relay (peer)", "ingest.socketio", cpu=True)
    compared = f"relay at {times(r.ratio('ingest.relay', 'ingest.wsrelay'))} of it"
    add("ingest", "Node ws relay (peer), the same", "ingest.wsrelay", compared, cpu=True)
    compared = f"relay at {times(r.ratio('ingest.relay', 'ingest.floor'))} of it"
    compared += f", Node ws relay at {times(r.ratio('ingest.wsrelay', 'ingest.floor'))}"
    add("ingest", "Python floor of the job (bench.floor), the same", "ingest.floor", compared, True)
    what = f"relay, {config['batch']} events per array frame"
    compared = versus("batched.relay", "ingest.relay", "unbatched", "batched.noop", "no-op")
    add("batched ingest", what, "batched.relay", compared, cpu=True)
    compared = versus("batched.compare", "batched.relay", "this relay")
    add("batched ingest", "--compare-python's relay, the same", "batched.compare", compared)
    add("batched ingest", "no-op server, the same frames (ceiling)", "batched.noop")
    compared = f"relay at {times(r.ratio('batched.relay', 'batched.floor'))} of it"
    add("batched ingest", "Python floor of the job, the same frames", "batched.floor", compared)
    for size in config["fanout_sizes"]:
        for mode, label in (("plain", ""), ("deltas", ", with deltas")):
            key, floor = f"fanout.{size}.{mode}", f"fanout.floor.{size}.{mode}"
            parts = []
            if r.details.get(floor):
                parts.append(versus(key + ".p99", floor + ".p99", "floor's p99"))
            if not math.isnan(first := r.median(key + ".first")):
                parts.append(f"first {_ms(first)} ms")
            if r.details.get(key):
                relay, clients = r.busy(key, "relay_busy"), r.busy(key, "clients_busy")
                parts.append(f"relay CPU {relay:.0%}, clients {clients:.0%}")
            add("fan-out", f"{size:,} subscribers{label}", key, "; ".join(parts))
            if r.details.get(floor):
                add("fan-out", f"  bare os.write floor, {size:,}{label}", floor)
            if r.details.get(peer := f"fanout.wsrelay.{size}.{mode}"):
                ratio = times(r.ratio(key + ".p50", peer + ".p50"))
                add(
                    "fan-out", f"  Node ws relay, {size:,}{label}", peer, f"relay's p50 {ratio} its"
                )
            if r.details.get(sse := f"fanout.sse.{size}.{mode}"):
                compared = versus(sse + ".p99", key + ".p99", "WebSocket's p99")
                add("fan-out", f"  SSE streams, {size:,}{label}", sse, compared)
            if r.details.get(workers := f"fanout.workers.{size}.{mode}"):
                relay_cpu, client_cpu = r.cpu_per_message(workers)
                compared = f"CPU per message: relay {relay_cpu:.0f} ms, clients {client_cpu:.0f} ms"
                add("fan-out", f"  --workers 2 on Redis, {size:,}{label}", workers, compared)
            key = f"fanout.compare.{size}.{mode}"
            compared = versus(key + ".p99", f"fanout.{size}.{mode}.p99", "this relay's p99")
            add("fan-out", f"--compare-python's relay, {size:,}{label}", key, compared)
    what = f"final -> message at {config['rate']:g} msg/s, single instance"
    add("latency", what, "routes.single")
    add("latency", "  the same through the os.write floor", "routes.floor")
    what = f"RSS per idle subscriber ({config['idle_subscribers']:,} of them)"
    add("memory", what, "memory.idle")
    add(
        "memory",
        f"RSS per idle SSE stream ({config['idle_subscribers']:,} of them)",
        "memory.idle_sse",
    )
    value, chars = r.median("memory.in_flight"), config["long_chars"]
    what = f"RSS per in-flight {chars:,}-char message ({config['in_flight']:,} of them)"
    per_char = "" if math.isnan(value) else f"{value / chars:.1f} bytes per char"
    add("memory", what, "memory.in_flight", per_char)
    if r.samples.get("durable.relay.publish"):
        compared = versus("durable.relay.publish", "durable.peer.appends", "durable-streams")
        text = _rate(r.median("durable.relay.publish"), "posts/s")
        rows.append(("http", "relay: one NDJSON POST per message", text, compared))
        text = _rate(r.median("durable.peer.appends"), "appends/s")
        rows.append(("http", "@durable-streams/server: one append per message", text, ""))
        for side, label in (
            ("relay", "relay: POST -> SSE reader"),
            ("peer", "durable-streams: append -> SSE"),
        ):
            p50, p99 = r.median(f"durable.{side}.sse.p50"), r.median(f"durable.{side}.sse.p99")
            compared = versus("durable.relay.sse.p99", "durable.peer.sse.p99", "its p99")
            rows.append(
                (
                    "http",
                    label,
                    f"p50 {_ms(p50)} ms, p99 {_ms(p99)} ms",
                    compared * (side == "relay"),
                )
            )

    def against_reference(key: str, what: str, unit: str, more: Callable[[], str]) -> None:
        """A row of ``key`` beside the reference's appends, and what ``more`` adds."""
        if r.samples.get(key):
            compared = versus(key, "durable.peer.stream.appends", "reference") + more()
            rows.append(("http", what, _rate(r.median(key), unit), compared))

    produce = "durable.relay.produce"
    against_reference(
        produce, "relay: POST /produce, one JSON message each, 16 connections", "posts/s", str
    )
    against_reference(
        "durable.redis.produce",
        "relay on Redis (A): POST /produce, the same",
        "posts/s",
        lambda: f"; {times(r.ratio('durable.redis.produce', produce))} of the relay in memory",
    )
    against_reference(
        "durable.floor.produce",
        "Python floor of POST /produce (bench.producefloor), the same",
        "posts/s",
        lambda: f"; relay at {times(r.ratio(produce, 'durable.floor.produce'))}",
    )
    against_reference(
        "durable.relay.edge",
        "relay: GET /healthz, the same (its HTTP edge alone)",
        "requests/s",
        lambda: f"; POST /produce at {times(r.ratio(produce, 'durable.relay.edge'))} of it",
    )
    if r.samples.get("durable.relay.stream.appends"):
        ours, peer = "durable.relay.stream", "durable.peer.stream"
        for what, key, unit in (
            ("appends, 16 connections, one stream", "appends", "appends/s"),
            ("catch-up read of a 10 MB stream", "catch_up", "MB/s"),
        ):
            compared = versus(f"{ours}.{key}", f"{peer}.{key}", "reference")
            text = _rate(r.median(f"{ours}.{key}"), unit)
            rows.append(("durable", f"relay /v1/stream/: {what}", text, compared))
            rows.append(
                ("durable", f"  reference: {what}", _rate(r.median(f"{peer}.{key}"), unit), "")
            )
        if r.samples.get("durable.redis.appends"):
            compared = versus("durable.redis.appends", f"{peer}.appends", "reference")
            in_memory = times(r.ratio("durable.redis.appends", f"{ours}.appends"))
            compared += f"; {in_memory} of the relay in memory"
            text = _rate(r.median("durable.redis.appends"), "appends/s")
            rows.append(
                ("durable", "relay on Redis (A) /v1/stream/: appends, the same", text, compared)
            )
        compared = versus(f"{ours}.sse.p99", f"{peer}.sse.p99", "reference's p99")
        text = f"p99 {_ms(r.median(f'{ours}.sse.p99'))} ms"
        rows.append(("durable", "relay /v1/stream/: append -> SSE reader", text, compared))
        text = f"p99 {_ms(r.median(f'{peer}.sse.p99'))} ms"
        rows.append(("durable", "  reference: append -> SSE reader", text, ""))
    for key, (label, _, _) in ROUTES.items():
        prefix, base = f"routes.{key}", "routes.single"
        compared = versus(prefix + ".throughput", base + ".throughput", "throughput")
        compared += ", " + versus(prefix + ".p50", base + ".p50", "p50")
        text = f"{_rate(r.median(prefix + '.throughput'))}, p50 {_ms(r.median(prefix + '.p50'))} ms"
        rows.append(("redis", label, text, "baseline" if key == "single" else compared))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    """The rows as aligned text, with a header, a blank line between cases."""
    rows = [("case", "what", "median", "compared"), *rows]
    widths = [max(len(row[n]) for row in rows) for n in range(4)]
    out = []
    for n, (case, what, median, compared) in enumerate(rows):
        if n > 1 and case != rows[n - 1][0]:
            out.append("")
        cells = (case.ljust(widths[0]), what.ljust(widths[1]), median.rjust(widths[2]), compared)
        out.append("  ".join(cells).rstrip())
        if not n:
            out.append("  ".join("-" * width for width in widths))
    return "\n".join(out)


def _target(
    key: str,
    label: str,
    value: float,
    goal: float,
    how: str,
    show: Callable[[float], str],
    unit: str = "",
) -> Target:
    measured, at_least = not math.isnan(value), how == ">="
    met = {">=": value >= goal, "<": value < goal, "<=": value <= goal}[how]
    factor = math.nan if not measured or value <= 0 else value / goal if at_least else goal / value
    if not measured:
        verdict = "not measured"
    elif met:
        verdict = f"met, with {factor:.2f}x to spare"
    elif at_least:
        verdict = f"MISSED: {1 - factor:.0%} short, needs {1 / factor:.2f}x"
    else:
        verdict = f"MISSED: {1 / factor:.2f}x over, needs to fall {1 - factor:.0%}"
    return {
        **{"key": key, "label": label, "value": value, "goal": goal, "comparison": how},
        **{"met": met if measured else None, "attainment": factor, "verdict": verdict},
        "shown": show(value) + unit if measured else "n/a",
    }


def machine_bound(results: Results, key: str, cores: int) -> str:
    """What a fan-out case's CPU per message allows on ``cores`` cores at best, or ""."""
    relay_cpu, client_cpu = results.cpu_per_message(key)
    if math.isnan(relay_cpu) or math.isnan(client_cpu) or cores < 1:
        return ""
    total = relay_cpu + client_cpu
    return (
        f"; on this machine's {cores} cores at least {_ms(total / cores)} ms "
        f"({total:.0f} ms of CPU per message: relay {relay_cpu:.0f}, clients {client_cpu:.0f})"
    )


def targets(results: Results, cores: int = 0) -> list[Target]:
    """The goals the run is judged by; the --workers 2 fan-out's says what ``cores`` cores
    allow at best when it is missed (see :func:`machine_bound`)."""
    r = results
    ms, kib = " ms", "{:.1f}".format

    def ratio(key: str, label: str, value: float, goal: float, how: str) -> Target:
        return _target(key, label, value, goal, how, times)

    return [
        ratio(
            "ingest_vs_noop",
            f"ingest >= {NOOP_GOAL}x no-op",
            r.ratio("ingest.relay", "ingest.noop"),
            NOOP_GOAL,
            ">=",
        ),
        ratio(
            "ingest_vs_socketio",
            f"ingest >= {SOCKETIO_GOAL:g}x socketio",
            r.ratio("ingest.relay", "ingest.socketio"),
            SOCKETIO_GOAL,
            ">=",
        ),
        floor_bound(
            _target(
                "batched_ingest",
                f"batched ingest >= {BATCHED_GOAL:,.0f} events/s",
                r.median("batched.relay"),
                BATCHED_GOAL,
                ">=",
                _rate,
            ),
            _rate(r.median("batched.floor"), "events/s"),
        ),
        ratio(
            "redis_ingest",
            f"ingest via Redis >= {REDIS_GOAL}x in memory",
            r.ratio("routes.redis-same.throughput", "routes.single.throughput"),
            REDIS_GOAL,
            ">=",
        ),
        ratio(
            "fanout_vs_floor",
            f"fan-out 10k p99 <= {FLOOR_GOAL}x os.write floor",
            r.ratio("fanout.10000.plain.p99", "fanout.floor.10000.plain.p99"),
            FLOOR_GOAL,
            "<=",
        ),
        _target(
            "fanout_first",
            f"fan-out 10k: first subscriber <= {FIRST_GOAL_MS:g} ms",
            r.median("fanout.10000.plain.first"),
            FIRST_GOAL_MS,
            "<=",
            _ms,
            ms,
        ),
        _bounded(r, "fanout.workers.10000.plain", cores),
        ratio(
            "sse_fanout",
            f"SSE fan-out 10k p99 <= {SSE_GOAL}x WebSocket",
            r.ratio("fanout.sse.10000.plain.p99", "fanout.10000.plain.p99"),
            SSE_GOAL,
            "<=",
        ),
        *peer_targets(r),
        edge_bound(
            r,
            ratio(
                "durable_appends",
                "Durable Streams appends (16 connections) >= 1.0x reference",
                r.ratio("durable.relay.stream.appends", "durable.peer.stream.appends"),
                1.0,
                ">=",
            ),
        ),
        ratio(
            "durable_sse",
            "Durable Streams append -> SSE p99 <= 1.0x reference",
            r.ratio("durable.relay.stream.sse.p99", "durable.peer.stream.sse.p99"),
            1.0,
            "<=",
        ),
        ratio(
            "durable_catch_up",
            "Durable Streams 10 MB catch-up >= 1.0x reference",
            r.ratio("durable.relay.stream.catch_up", "durable.peer.stream.catch_up"),
            1.0,
            ">=",
        ),
        ratio(
            "http_ingest",
            f"NDJSON publishing >= {HTTP_GOAL}x WebSocket ingest",
            r.ratio("ingest.http", "ingest.relay"),
            HTTP_GOAL,
            ">=",
        ),
        _target(
            "rss_idle_websocket",
            f"RSS <= {RSS_GOAL_KIB:g} KiB per idle WebSocket",
            r.median("memory.idle") / 1024,
            RSS_GOAL_KIB,
            "<=",
            kib,
            " KiB",
        ),
        _target(
            "rss_idle_sse",
            f"RSS <= {RSS_GOAL_KIB:g} KiB per idle SSE stream",
            r.median("memory.idle_sse") / 1024,
            RSS_GOAL_KIB,
            "<=",
            kib,
            " KiB",
        ),
        _target(
            "latency_p99",
            f"final -> delivered p99 < {LATENCY_GOAL_MS:g} ms",
            r.median("routes.single.p99"),
            LATENCY_GOAL_MS,
            "<",
            _ms,
            ms,
        ),
    ]


def peer_targets(results: Results) -> list[Target]:
    """The goals against the Node peers: the Node ws relay's ingest and fan-out to 1,000,
    and the reference server's appends beside ``POST /produce``."""
    r = results

    def ratio(key: str, label: str, value: float, how: str) -> Target:
        return _target(key, label, value, 1.0, how, times)

    return [
        floor_bound(
            ratio(
                "ingest_vs_node_ws",
                "ingest >= 1.0x Node ws relay",
                r.ratio("ingest.relay", "ingest.wsrelay"),
                ">=",
            ),
            f"{times(r.ratio('ingest.floor', 'ingest.wsrelay'))} of it",
        ),
        ratio(
            "fanout_vs_node_ws",
            "fan-out 1k p50 <= 1.0x Node ws relay",
            r.ratio("fanout.1000.plain.p50", "fanout.wsrelay.1000.plain.p50"),
            "<=",
        ),
        edge_bound(
            r,
            ratio(
                "produce_vs_reference",
                "POST /produce (16 connections) >= 1.0x reference appends",
                r.ratio("durable.relay.produce", "durable.peer.stream.appends"),
                ">=",
            ),
        ),
    ]


def floor_bound(goal: Target, floor: str) -> Target:
    """An ingest target; when missed, with what the Python floor of the job (``bench.floor``,
    the relay's decoder and nothing beyond the seed's rules) reads under the same load: when
    the floor meets the target, Python is not what bounds it."""
    if goal["met"] is False and not floor.startswith("n/a"):
        goal["verdict"] += f"; the Python floor of the job reads {floor}"
    return goal


def edge_bound(results: Results, goal: Target) -> Target:
    """An HTTP target against the reference's appends; when missed, with how fast the
    relay's HTTP edge alone answers (``GET /healthz``, no relay work) under the same load:
    no request through that edge can go faster."""
    edge = results.ratio("durable.relay.edge", "durable.peer.stream.appends")
    if goal["met"] is False and not math.isnan(edge):
        goal["verdict"] += f"; the edge alone (GET /healthz) reads {times(edge)} of it"
    return goal


def _bounded(results: Results, key: str, cores: int) -> Target:
    """The --workers 2 fan-out target; when missed, with what the machine allows."""
    goal = _target(
        "fanout_workers",
        f"fan-out 10k, --workers 2 on Redis: p99 < {FANOUT_GOAL_MS:g} ms",
        results.median(key + ".p99"),
        FANOUT_GOAL_MS,
        "<",
        _ms,
        " ms",
    )
    if goal["met"] is False:
        goal["verdict"] += machine_bound(results, key, cores)
    return goal


def format_targets(goals: Sequence[Target]) -> str:
    """One line per target: the goal, the median, met or missed by how much."""
    width, value_width = (max(len(goal[name]) for goal in goals) for name in ("label", "shown"))
    return "\n".join(
        f"  {goal['label'].ljust(width)}  {goal['shown'].rjust(value_width)}  {goal['verdict']}"
        for goal in goals
    )


def format_markdown(rows: Sequence[Row], goals: Sequence[Target]) -> str:
    """The table and the targets as Markdown, as the docs' performance page shows them."""
    lines = ["| case | what | median | compared |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(cell.strip() or ' ' for cell in row)} |" for row in rows]
    lines += ["", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {g['label']} | {g['shown']} | {g['verdict']} |" for g in goals]
    return "\n".join(lines) + "\n"


def to_json(
    results: Results, rows: Sequence[Row], goals: Sequence[Target], extra: dict[str, Any]
) -> dict[str, Any]:
    """Every raw measurement, the medians, the table as printed and the targets."""

    def clean(value: Any) -> Any:
        return None if isinstance(value, float) and math.isnan(value) else value

    return {
        **extra,
        "medians": {key: clean(results.median(key)) for key in sorted(results.samples)},
        "repetitions": results.samples,
        "targets": [{k: clean(v) for k, v in goal.items() if k != "shown"} for goal in goals],
        "table": [
            dict(zip(("case", "what", "median", "compared"), row, strict=True)) for row in rows
        ],
        "notes": results.notes,
        "details": results.details,
    }
