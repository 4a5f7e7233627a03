"""``--chart PATH``: the run's medians as bar charts in one PNG (matplotlib, no display).

Six panels: how far each target is met (1.0 = exactly on it), the assemblers, ingest rates
(log scale, with the batched target), fan-out latencies (log scale, with the 100 ms target),
memory (with the 40 KiB target) and the Redis paths against the single instance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .report import FANOUT_TARGET_MS, RSS_TARGET_KIB, Results, Target

__all__ = ["write_chart"]

MET = "#2e7d32"
MISSED = "#c62828"
RELAY = "#1565c0"
OTHER = "#9e9e9e"
PEER = "#ef6c00"


def _label_bars(axes: Any, bars: Any, texts: Sequence[str]) -> None:
    for bar, text in zip(bars, texts, strict=True):
        height = bar.get_height()
        if math.isnan(height):
            continue
        axes.annotate(
            text,
            (bar.get_x() + bar.get_width() / 2, height),
            ha="center",
            va="bottom",
            fontsize=7,
            xytext=(0, 2),
            textcoords="offset points",
        )


def _short(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _targets(axes: Any, goals: Sequence[Target]) -> None:
    names = [goal.label for goal in goals][::-1]
    values = [goal.attainment for goal in goals][::-1]
    colors = [MET if goal.met else MISSED for goal in goals][::-1]
    shown = [0.0 if math.isnan(value) else value for value in values]
    bars = axes.barh(names, shown, color=colors)
    axes.axvline(1.0, color="black", linewidth=1)
    axes.set_xscale("log")
    axes.set_title("targets: measured / goal (right of the line = met)", fontsize=9)
    for bar, value, goal in zip(bars, values, list(goals)[::-1], strict=True):
        text = "not measured" if math.isnan(value) else f"{goal.show(goal.value)} ({value:.2f})"
        axes.annotate(
            text,
            (bar.get_width() if not math.isnan(value) else 1.0, bar.get_y() + bar.get_height() / 2),
            va="center",
            fontsize=7,
            xytext=(3, 0),
            textcoords="offset points",
        )
    axes.tick_params(axis="y", labelsize=7)
    axes.set_xlim(left=min([v for v in values if not math.isnan(v)] + [1.0]) / 3)
    axes.set_xlim(right=max([v for v in values if not math.isnan(v)] + [1.0]) * 6)


def _assemblers(axes: Any, results: Results) -> None:
    keys = ("token", "naive", "floor")
    labels = ("TokenAssembler", "naive str +=", "floor")
    colors = (RELAY, PEER, OTHER)
    width = 0.27
    for n, (key, label, color) in enumerate(zip(keys, labels, colors, strict=True)):
        values = [results.median(f"assembler.{w}.{key}") for w in ("short", "long")]
        bars = axes.bar(
            [x + (n - 1) * width for x in (0, 1)], values, width, label=label, color=color
        )
        _label_bars(axes, bars, [_short(v) for v in values])
    axes.set_xticks([0, 1], ["short messages", "10k-char messages"])
    axes.set_ylabel("events/s")
    axes.set_title("assembler (in-process)", fontsize=9)
    axes.legend(fontsize=7)


def _ingest(axes: Any, results: Results) -> None:
    items = [
        ("relay", "ingest.relay", RELAY),
        ("no-op ws", "ingest.noop", OTHER),
        ("socketio", "ingest.socketio", PEER),
        ("relay\nbatched", "batched.relay", RELAY),
        ("no-op ws\nbatched", "batched.noop", OTHER),
    ]
    values = [results.median(key) for _, key, _ in items]
    bars = axes.bar([name for name, _, _ in items], values, color=[c for _, _, c in items])
    _label_bars(axes, bars, [_short(v) for v in values])
    axes.axhline(1_000_000, color=MISSED, linestyle="--", linewidth=1)
    axes.annotate("batched target 1M", (4.4, 1_000_000), fontsize=7, ha="right", va="bottom")
    axes.set_yscale("log")
    axes.set_ylabel("events/s (one producer)")
    axes.set_title(
        f"ingest: relay {_ratio(results, 'ingest.relay', 'ingest.noop')} of no-op, "
        f"{_ratio(results, 'ingest.relay', 'ingest.socketio')} socketio",
        fontsize=9,
    )
    axes.tick_params(axis="x", labelsize=7)


def _ratio(results: Results, key: str, baseline: str) -> str:
    value = results.ratio(key, baseline)
    return "n/a" if math.isnan(value) else f"{value:.2f}x"


def _fanout(axes: Any, results: Results, sizes: Sequence[int]) -> None:
    groups = [(size, mode) for size in sizes for mode in ("plain", "deltas")]
    names = [f"{size:,}\n{'+ deltas' if mode == 'deltas' else 'messages'}" for size, mode in groups]
    width = 0.4
    for n, (stat, color) in enumerate((("p50", RELAY), ("p99", PEER))):
        values = [results.median(f"fanout.{size}.{mode}.{stat}") for size, mode in groups]
        xs = [x + (n - 0.5) * width for x in range(len(groups))]
        bars = axes.bar(xs, values, width, label=stat, color=color)
        _label_bars(axes, bars, [_short(v) for v in values])
    axes.axhline(FANOUT_TARGET_MS, color=MISSED, linestyle="--", linewidth=1)
    axes.set_xticks(range(len(groups)), names, fontsize=7)
    axes.set_yscale("log")
    axes.set_ylabel("ms, final -> all subscribers")
    axes.set_title(f"fan-out (target: 10k p99 < {FANOUT_TARGET_MS:g} ms)", fontsize=9)
    axes.legend(fontsize=7)


def _memory(axes: Any, results: Results) -> None:
    values = [results.median("memory.idle") / 1024, results.median("memory.in_flight") / 1024]
    bars = axes.bar(
        ["per idle\nsubscriber", "per in-flight\n10k-char message"], values, color=RELAY
    )
    _label_bars(axes, bars, [f"{v:,.1f} KiB" if not math.isnan(v) else "n/a" for v in values])
    axes.axhline(RSS_TARGET_KIB, color=MISSED, linestyle="--", linewidth=1)
    axes.annotate(
        f"subscriber target {RSS_TARGET_KIB:g} KiB", (-0.4, RSS_TARGET_KIB), fontsize=7, va="bottom"
    )
    axes.set_ylabel("KiB of relay RSS")
    axes.set_title("memory", fontsize=9)


def _redis(axes: Any, results: Results) -> None:
    routes = [("redis-same", "A->A via Redis"), ("redis-cross", "A->B via Redis")]
    width = 0.4
    for n, (stat, label, color) in enumerate(
        (("throughput", "throughput", RELAY), ("p50", "p50 latency", PEER))
    ):
        values = [
            results.ratio(f"routes.{key}.{stat}", f"routes.single.{stat}") for key, _ in routes
        ]
        xs = [x + (n - 0.5) * width for x in range(len(routes))]
        bars = axes.bar(xs, values, width, label=label, color=color)
        _label_bars(axes, bars, [f"{v:.2f}x" if not math.isnan(v) else "n/a" for v in values])
    axes.axhline(1.0, color="black", linewidth=1)
    axes.set_xticks(range(len(routes)), [label for _, label in routes], fontsize=8)
    axes.set_ylabel("ratio to the single instance")
    p50, p99 = results.median("routes.single.p50"), results.median("routes.single.p99")
    axes.set_title(
        f"Redis paths vs single instance (its latency: p50 {p50:.2f} ms, p99 {p99:.2f} ms)",
        fontsize=9,
    )
    axes.legend(fontsize=7)


def write_chart(
    path: Path, results: Results, goals: Sequence[Target], sizes: Sequence[int], title: str
) -> None:
    """Draw the six panels into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, grid = plt.subplots(2, 3, figsize=(17, 9.5))
    _targets(grid[0][0], goals)
    _assemblers(grid[0][1], results)
    _ingest(grid[0][2], results)
    _fanout(grid[1][0], results, sizes)
    _memory(grid[1][1], results)
    _redis(grid[1][2], results)
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
