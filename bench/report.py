"""Statistics over repetitions, the printed table, the targets and the JSON record.

Every measurement is filed in :class:`Results` under a key (``ingest.relay``,
``fanout.10000.plain.p99``...), one value per repetition; the table shows medians.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FANOUT_TARGET_MS",
    "Results",
    "Target",
    "format_table",
    "format_targets",
    "percentile",
    "table_rows",
    "targets",
    "to_json",
]

FANOUT_TARGET_MS = 100.0
BATCHED_TARGET = 1_000_000.0
RSS_TARGET_KIB = 40.0
INGEST_NOOP_TARGET = 0.8
INGEST_SOCKETIO_TARGET = 10.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, interpolating between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ratio(value: float, baseline: float) -> float:
    if math.isnan(value) or math.isnan(baseline) or not baseline:
        return math.nan
    return value / baseline


@dataclass
class Results:
    """Every value measured in a run, per key, one per repetition."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    """Headline values per key, one per repetition."""
    details: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Raw measurements per case, for the JSON record."""
    notes: dict[str, str] = field(default_factory=dict)
    """Why a case has no value (for example, the relay rejected its frames)."""

    def add(self, key: str, value: float) -> None:
        """File one repetition's value."""
        self.samples.setdefault(key, []).append(value)

    def detail(self, case: str, record: dict[str, Any]) -> None:
        """Keep one raw measurement."""
        self.details.setdefault(case, []).append(record)

    def median(self, key: str) -> float:
        """The median over repetitions, NaN when nothing was measured."""
        values = self.samples.get(key)
        return statistics.median(values) if values else math.nan

    def ratio(self, key: str, baseline: str) -> float:
        """``key`` over ``baseline``: the median of the per-repetition ratios.

        Both are measured in each repetition, close together in time, so pairing them
        cancels most of a machine's slow and fast spells; when the counts differ, the
        ratio of the medians.
        """
        values, bases = self.samples.get(key, []), self.samples.get(baseline, [])
        if not values or len(values) != len(bases):
            return _ratio(self.median(key), self.median(baseline))
        return statistics.median(_ratio(v, b) for v, b in zip(values, bases, strict=True))


def _rate(value: float, unit: str = "events/s") -> str:
    return "n/a" if math.isnan(value) else f"{value:,.0f} {unit}"


def _times(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


def _ms(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _kib(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value / 1024:,.1f} KiB"


def _latency(results: Results, prefix: str) -> str:
    p50, p99 = results.median(prefix + ".p50"), results.median(prefix + ".p99")
    if math.isnan(p50):
        return "n/a"
    return f"p50 {_ms(p50)} ms, p99 {_ms(p99)} ms"


Row = tuple[str, str, str, str]
"""Case, what was measured, its median, how it compares."""


def table_rows(results: Results, config: dict[str, Any]) -> list[Row]:
    """The rows of the table, in order."""
    r = results
    rows: list[Row] = []
    assembler_labels = {
        "token": "TokenAssembler.apply()",
        "naive": "naive str += assembler",
        "floor": "dict + list append loop (floor)",
    }
    workloads = {
        "short": f"{config['deltas']}-delta messages",
        "long": f"{config['long_chars']:,}-char messages",
    }
    for workload, description in workloads.items():
        for key, label in assembler_labels.items():
            name = f"assembler.{workload}.{key}"
            compared = ""
            if key == "token":
                compared = (
                    f"{_times(r.ratio(name, f'assembler.{workload}.floor'))} floor, "
                    f"{_times(r.ratio(name, f'assembler.{workload}.naive'))} naive"
                )
            rows.append(("assembler", f"{label}, {description}", _rate(r.median(name)), compared))
    busy = {
        key: statistics.median(values) if values else math.nan
        for key, values in (
            (key, [d["server_busy"] for d in r.details.get(key, []) if "server_busy" in d])
            for key in ("ingest.relay", "ingest.noop", "ingest.socketio", "batched.relay")
        )
    }

    def cpu(key: str, before: str = "") -> str:
        value = busy.get(key, math.nan)
        return "" if math.isnan(value) else f"{before}server CPU {value:.0%}"

    rows.append(
        (
            "ingest",
            "relay, 1 producer -> 1 subscriber",
            _rate(r.median("ingest.relay")),
            f"{_times(r.ratio('ingest.relay', 'ingest.noop'))} no-op, "
            f"{_times(r.ratio('ingest.relay', 'ingest.socketio'))} socketio"
            + cpu("ingest.relay", "; "),
        )
    )
    rows.append(
        (
            "ingest",
            "no-op websockets server (ceiling)",
            _rate(r.median("ingest.noop"), "frames/s"),
            cpu("ingest.noop"),
        )
    )
    rows.append(
        (
            "ingest",
            "python-socketio relay (peer)",
            _rate(r.median("ingest.socketio")),
            cpu("ingest.socketio"),
        )
    )
    batch = config["batch"]
    batched_note = r.notes.get("batched")
    rows.append(
        (
            "batched ingest",
            f"relay, {batch} events per array frame",
            _rate(r.median("batched.relay")) if not batched_note else "not supported",
            (
                f"{_times(r.ratio('batched.relay', 'ingest.relay'))} unbatched, "
                f"{_times(r.ratio('batched.relay', 'batched.noop'))} no-op"
                + cpu("batched.relay", "; ")
            )
            if not batched_note
            else batched_note[:60],
        )
    )
    rows.append(
        (
            "batched ingest",
            "no-op server, the same frames (ceiling)",
            _rate(r.median("batched.noop")),
            "",
        )
    )
    for size in config["fanout_sizes"]:
        for mode, label in (("plain", ""), ("deltas", ", with deltas")):
            prefix = f"fanout.{size}.{mode}"
            records = r.details.get(prefix, [])
            compared = (
                f"relay CPU {statistics.median(d['relay_busy'] for d in records):.0%}, "
                f"clients {statistics.median(d['clients_busy'] for d in records):.0%}"
                if records
                else ""
            )
            rows.append(("fan-out", f"{size:,} subscribers{label}", _latency(r, prefix), compared))
    rows.append(
        (
            "latency",
            f"final -> message at {config['rate']:g} msg/s, single instance",
            _latency(r, "routes.single"),
            "",
        )
    )
    rows.append(
        (
            "memory",
            f"RSS per idle subscriber ({config['idle_subscribers']:,} of them)",
            _kib(r.median("memory.idle")),
            "",
        )
    )
    in_flight = r.median("memory.in_flight")
    chars = config["long_chars"]
    rows.append(
        (
            "memory",
            f"RSS per in-flight {chars:,}-char message ({config['in_flight']:,} of them)",
            _kib(in_flight),
            "" if math.isnan(in_flight) else f"{in_flight / chars:.1f} bytes per char",
        )
    )
    for key, label in (
        ("single", "single instance (S->S)"),
        ("redis-same", "same instance via Redis (A->A)"),
        ("redis-cross", "cross-instance via Redis (A->B)"),
    ):
        prefix = f"routes.{key}"
        value = (
            f"{_rate(r.median(prefix + '.throughput'))}, p50 {_ms(r.median(prefix + '.p50'))} ms"
        )
        compared = (
            "baseline"
            if key == "single"
            else f"{_times(r.ratio(prefix + '.throughput', 'routes.single.throughput'))} "
            f"throughput, {_times(r.ratio(prefix + '.p50', 'routes.single.p50'))} p50"
        )
        rows.append(("redis", label, value, compared))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    """The rows as aligned text, with a header."""
    header: Row = ("case", "what", "median", "compared")
    widths = [max(len(row[n]) for row in (header, *rows)) for n in range(4)]

    def line(cells: Row) -> str:
        return "  ".join(
            (
                cells[0].ljust(widths[0]),
                cells[1].ljust(widths[1]),
                cells[2].rjust(widths[2]),
                cells[3],
            )
        ).rstrip()

    rule = "  ".join("-" * width for width in widths)
    out = [line(header), rule]
    previous = ""
    for row in rows:
        if previous and row[0] != previous:
            out.append("")
        out.append(line(row))
        previous = row[0]
    return "\n".join(out)


@dataclass(frozen=True, slots=True)
class Target:
    """A goal for one measured value."""

    key: str
    label: str
    value: float
    goal: float
    comparison: str
    """``>=``, ``<`` or ``<=``: how the value must stand to ``goal``."""
    show: Callable[[float], str]
    note: str = ""

    @property
    def at_least(self) -> bool:
        """Whether higher is better."""
        return self.comparison == ">="

    @property
    def met(self) -> bool | None:
        """Whether the goal is met; None when nothing was measured."""
        if math.isnan(self.value):
            return None
        if self.comparison == ">=":
            return self.value >= self.goal
        if self.comparison == "<":
            return self.value < self.goal
        return self.value <= self.goal

    @property
    def attainment(self) -> float:
        """How far along the goal is: 1.0 exactly on it, above 1 met, below 1 missed."""
        if math.isnan(self.value) or self.value <= 0:
            return math.nan
        return self.value / self.goal if self.at_least else self.goal / self.value

    def verdict(self) -> str:
        """``met`` or ``MISSED`` and by how much."""
        if self.met is None:
            return "not measured" + (f": {self.note}" if self.note else "")
        factor = self.attainment
        if self.met:
            return f"met, with {factor:.2f}x to spare"
        if self.at_least:
            return f"MISSED: {1 - factor:.0%} short, needs {1 / factor:.2f}x"
        return f"MISSED: {1 / factor:.2f}x over, needs to fall {1 - factor:.0%}"


def targets(results: Results) -> list[Target]:
    """The goals the run is judged by."""
    r = results
    out = [
        Target(
            "ingest_vs_noop",
            f"ingest >= {INGEST_NOOP_TARGET}x no-op",
            r.ratio("ingest.relay", "ingest.noop"),
            INGEST_NOOP_TARGET,
            ">=",
            _times,
        ),
        Target(
            "ingest_vs_socketio",
            f"ingest >= {INGEST_SOCKETIO_TARGET:g}x socketio",
            r.ratio("ingest.relay", "ingest.socketio"),
            INGEST_SOCKETIO_TARGET,
            ">=",
            _times,
        ),
        Target(
            "batched_ingest",
            f"batched ingest >= {BATCHED_TARGET:,.0f} events/s",
            r.median("batched.relay"),
            BATCHED_TARGET,
            ">=",
            _rate,
            r.notes.get("batched", ""),
        ),
    ]
    for mode, label in (("plain", ""), ("deltas", ", with deltas")):
        key = f"fanout.10000.{mode}.p99"
        if key in r.samples:
            out.append(
                Target(
                    f"fanout_10k_{mode}_p99",
                    f"fan-out 10k p99 < {FANOUT_TARGET_MS:g} ms{label}",
                    r.median(key),
                    FANOUT_TARGET_MS,
                    "<",
                    lambda value: f"{_ms(value)} ms",
                )
            )
    out.append(
        Target(
            "rss_per_idle_subscriber",
            f"RSS <= {RSS_TARGET_KIB:g} KiB per idle subscriber",
            r.median("memory.idle") / 1024,
            RSS_TARGET_KIB,
            "<=",
            lambda value: f"{value:.1f} KiB",
        )
    )
    return out


def format_targets(items: Sequence[Target]) -> str:
    """One line per target: the goal, the median, met or missed by how much."""
    width = max(len(item.label) for item in items)
    shown = [item.show(item.value) if not math.isnan(item.value) else "n/a" for item in items]
    value_width = max(len(text) for text in shown)
    return "\n".join(
        f"  {item.label.ljust(width)}  {text.rjust(value_width)}  {item.verdict()}"
        for item, text in zip(items, shown, strict=True)
    )


def to_json(
    results: Results, rows: Sequence[Row], goals: Sequence[Target], extra: dict[str, Any]
) -> dict[str, Any]:
    """Every raw measurement, the medians, the table as printed and the targets."""

    def clean(value: float) -> float | None:
        return None if math.isnan(value) else value

    return {
        **extra,
        "medians": {key: clean(results.median(key)) for key in sorted(results.samples)},
        "repetitions": results.samples,
        "targets": [
            {
                "key": goal.key,
                "label": goal.label,
                "value": clean(goal.value),
                "goal": goal.goal,
                "comparison": goal.comparison,
                "met": goal.met,
                "attainment": clean(goal.attainment),
                "verdict": goal.verdict(),
            }
            for goal in goals
        ],
        "table": [
            dict(zip(("case", "what", "median", "compared"), row, strict=True)) for row in rows
        ],
        "notes": results.notes,
        "details": results.details,
    }
