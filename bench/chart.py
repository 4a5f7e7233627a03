"""``--chart PATH``: the run's medians as bar charts in one PNG (matplotlib, no display).

Six panels: how far each target is met (1.0 = exactly on it), the assemblers, ingest rates
(log scale, with the batched target), fan-out latencies (log scale, with the 100 ms target),
memory (with the 40 KiB target) and the Redis paths against the single instance.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .report import BATCHED_GOAL, FANOUT_GOAL_MS, RSS_GOAL_KIB, Results, Target

MET, MISSED, RELAY, OTHER, PEER = "#2e7d32", "#c62828", "#1565c0", "#9e9e9e", "#ef6c00"
Series = tuple[str | None, str | list[str], list[float]]
"""A legend label (None: no legend), a color or one per bar, a value per group."""


def _short(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _times(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}x"


def _bars(
    axes: Any,
    title: str,
    names: Sequence[str],
    series: Sequence[Series],
    line: float | None = None,
    show: Callable[[float], str] = _short,
    log: bool = False,
) -> None:
    """Side-by-side bars, one group per name and one bar per series, each labelled with its
    value; a dashed red line at ``line`` (a target)."""
    width = 0.8 / len(series)
    for n, (label, color, values) in enumerate(series):
        xs = [x + (n - (len(series) - 1) / 2) * width for x in range(len(names))]
        for bar, value in zip(
            axes.bar(xs, values, width, label=label, color=color), values, strict=True
        ):
            if not math.isnan(value):
                axes.annotate(
                    show(value),
                    (bar.get_x() + bar.get_width() / 2, value),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
    axes.set_xticks(range(len(names)), names, fontsize=7)
    if line is not None:
        axes.axhline(line, color=MISSED, linestyle="--", linewidth=1)
    if log:
        axes.set_yscale("log")
    if series[0][0] is not None:
        axes.legend(fontsize=7)
    axes.set_title(title, fontsize=9)


def _targets(axes: Any, goals: Sequence[Target]) -> None:
    goals = list(goals)[::-1]
    values = [goal["attainment"] for goal in goals]
    shown = [0.0 if math.isnan(value) else value for value in values]
    colors = [MET if goal["met"] else MISSED for goal in goals]
    bars = axes.barh([goal["label"] for goal in goals], shown, color=colors)
    axes.axvline(1.0, color="black", linewidth=1)
    axes.set_xscale("log")
    axes.set_title("targets: measured / goal (right of the line = met)", fontsize=9)
    for bar, value, goal in zip(bars, values, goals, strict=True):
        text = "not measured" if math.isnan(value) else f"{goal['shown']} ({value:.2f})"
        at = (bar.get_width() or 1.0, bar.get_y() + bar.get_height() / 2)
        axes.annotate(text, at, va="center", fontsize=7, xytext=(3, 0), textcoords="offset points")
    axes.tick_params(axis="y", labelsize=7)
    known = [value for value in values if not math.isnan(value)] + [1.0]
    axes.set_xlim(min(known) / 3, max(known) * 6)


def write_chart(
    path: Path, results: Results, goals: Sequence[Target], sizes: Sequence[int], title: str
) -> None:
    """Draw the six panels into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = results
    figure, ((targets, assemblers, ingest), (fanout, memory, redis)) = plt.subplots(
        2, 3, figsize=(17, 9.5)
    )
    _targets(targets, goals)
    series: list[Series] = [
        (label, color, [r.median(f"assembler.{w}.{key}") for w in ("short", "long")])
        for key, label, color in (
            ("token", "TokenAssembler", RELAY),
            ("naive", "naive str +=", PEER),
            ("floor", "floor", OTHER),
        )
    ]
    names = ["short messages", "10k-char messages"]
    _bars(assemblers, "assembler (in-process)", names, series)
    assemblers.set_ylabel("events/s")

    keys = ["ingest.relay", "ingest.noop", "ingest.socketio", "batched.relay", "batched.noop"]
    names = ["relay", "no-op ws", "socketio", "relay\nbatched", "no-op ws\nbatched"]
    colors = [RELAY, OTHER, PEER, RELAY, OTHER]
    heading = (
        f"ingest: relay {_times(r.ratio('ingest.relay', 'ingest.noop'))} of no-op, "
        f"{_times(r.ratio('ingest.relay', 'ingest.socketio'))} socketio"
    )
    _bars(
        ingest,
        heading,
        names,
        [(None, colors, [r.median(key) for key in keys])],
        BATCHED_GOAL,
        log=True,
    )
    ingest.annotate("batched target 1M", (4.4, BATCHED_GOAL), fontsize=7, ha="right", va="bottom")
    ingest.set_ylabel("events/s (one producer)")

    groups = [(size, mode) for size in sizes for mode in ("plain", "deltas")]
    names = [f"{size:,}\n{'+ deltas' if mode == 'deltas' else 'messages'}" for size, mode in groups]
    series = [
        (stat, color, [r.median(f"fanout.{size}.{mode}.{stat}") for size, mode in groups])
        for stat, color in (("p50", RELAY), ("p99", PEER))
    ]
    heading = f"fan-out (target: 10k p99 < {FANOUT_GOAL_MS:g} ms)"
    _bars(fanout, heading, names, series, FANOUT_GOAL_MS, log=True)
    fanout.set_ylabel("ms, final -> all subscribers")

    values = [r.median("memory.idle") / 1024, r.median("memory.in_flight") / 1024]
    names = ["per idle\nsubscriber", "per in-flight\n10k-char message"]
    _bars(memory, "memory", names, [(None, RELAY, values)], RSS_GOAL_KIB, lambda v: f"{v:,.1f} KiB")
    target = f"subscriber target {RSS_GOAL_KIB:g} KiB"
    memory.annotate(target, (-0.4, RSS_GOAL_KIB), fontsize=7, va="bottom")
    memory.set_ylabel("KiB of relay RSS")

    routes = {"redis-same": "A->A via Redis", "redis-cross": "A->B via Redis"}
    series = [
        (label, color, [r.ratio(f"routes.{key}.{stat}", f"routes.single.{stat}") for key in routes])
        for stat, label, color in (
            ("throughput", "throughput", RELAY),
            ("p50", "p50 latency", PEER),
        )
    ]
    p50, p99 = r.median("routes.single.p50"), r.median("routes.single.p99")
    heading = f"Redis paths vs single instance (its latency: p50 {p50:.2f} ms, p99 {p99:.2f} ms)"
    _bars(redis, heading, list(routes.values()), series, show=_times)
    redis.axhline(1.0, color="black", linewidth=1)
    redis.set_ylabel("ratio to the single instance")

    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
