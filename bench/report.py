"""Statistics over repetitions, the printed table and the JSON record."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .workload import LatencyResult, ThroughputResult

__all__ = ["RouteResults", "format_table", "percentile", "to_json"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, interpolating between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


@dataclass
class RouteResults:
    """Every repetition measured on one route."""

    key: str
    label: str
    throughput: list[ThroughputResult] = field(default_factory=list)
    latency: list[LatencyResult] = field(default_factory=list)

    @property
    def events_per_second(self) -> float:
        """Median throughput over repetitions."""
        return _median([run.events_per_second for run in self.throughput])

    @property
    def p50_ms(self) -> float:
        """Median over repetitions of each repetition's p50 latency, in ms."""
        return _median([percentile(run.samples, 50) * 1000 for run in self.latency])

    @property
    def p99_ms(self) -> float:
        """Median over repetitions of each repetition's p99 latency, in ms."""
        return _median([percentile(run.samples, 99) * 1000 for run in self.latency])


def _ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline else math.nan


def format_table(results: Sequence[RouteResults]) -> str:
    """One table: medians per route and ratios against the first route (the baseline)."""
    baseline = results[0]
    header = ("path", "events/s", "p50 ms", "p99 ms", "tput ratio", "p50 ratio")
    rows = [
        (
            route.label,
            f"{route.events_per_second:,.0f}",
            f"{route.p50_ms:.2f}",
            f"{route.p99_ms:.2f}",
            f"{_ratio(route.events_per_second, baseline.events_per_second):.2f}x",
            f"{_ratio(route.p50_ms, baseline.p50_ms):.2f}x",
        )
        for route in results
    ]
    widths = [max(len(row[n]) for row in (header, *rows)) for n in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join((first, *rest))

    rule = "-" * len(line(header))
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def to_json(
    results: Sequence[RouteResults], config: dict[str, Any], extra: dict[str, Any]
) -> dict[str, Any]:
    """Every raw measurement, the medians and the ratios, as plain JSON data."""
    baseline = results[0]
    routes = {}
    for route in results:
        routes[route.key] = {
            "label": route.label,
            "throughput": [
                {
                    "repetition": n,
                    "messages": run.messages,
                    "events": run.events,
                    "seconds": run.seconds,
                    "events_per_second": run.events_per_second,
                }
                for n, run in enumerate(route.throughput, 1)
            ],
            "latency": [
                {
                    "repetition": n,
                    "rate": run.rate,
                    "p50_ms": percentile(run.samples, 50) * 1000,
                    "p99_ms": percentile(run.samples, 99) * 1000,
                    "max_ms": max(run.samples) * 1000,
                    "samples_ms": [round(sample * 1000, 4) for sample in run.samples],
                }
                for n, run in enumerate(route.latency, 1)
            ],
            "median": {
                "events_per_second": route.events_per_second,
                "p50_ms": route.p50_ms,
                "p99_ms": route.p99_ms,
            },
            "ratio_to_baseline": {
                "throughput": _ratio(route.events_per_second, baseline.events_per_second),
                "p50": _ratio(route.p50_ms, baseline.p50_ms),
                "p99": _ratio(route.p99_ms, baseline.p99_ms),
            },
        }
    return {"config": config, **extra, "baseline": baseline.key, "routes": routes}
