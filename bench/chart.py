"""``--chart PATH``: the run's medians as six bar charts in one PNG (matplotlib, no display)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .report import BATCHED_GOAL, FANOUT_GOAL_MS, RSS_GOAL_KIB, Results, Target, times

MET, MISSED, RELAY, OTHER, PEER = "#2e7d32", "#c62828", "#1565c0", "#9e9e9e", "#ef6c00"
Series = tuple[str | None, str | list[str], list[float]]  # legend label, colors, values


def _short(value: float) -> str:
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _bars(
    axes: Any,
    title: str,
    names: Sequence[str],
    series: Sequence[Series],
    line: float | None = None,
    show: Callable[[float], str] = _short,
) -> None:
    """One group of bars per name, one bar per series, each labelled with its value; a
    dashed line at ``line``, a target (at 1.0: black, the baseline of a ratio)."""
    width = 0.8 / len(series)
    for n, (label, color, values) in enumerate(series):
        xs = [x + (n - (len(series) - 1) / 2) * width for x in range(len(names))]
        bars = axes.bar(xs, values, width, label=label, color=color)
        for bar, value in zip(bars, values, strict=True):
            at = (bar.get_x() + bar.get_width() / 2, value)
            if not math.isnan(value):
                axes.annotate(show(value), at, ha="center", va="bottom", fontsize=7)
    axes.set_xticks(range(len(names)), names, fontsize=7)
    if line is not None:
        axes.axhline(line, color="black" if line == 1 else MISSED, linestyle="--", linewidth=1)
    if series[0][0] is not None:
        axes.legend(fontsize=7)
    axes.set_title(title, fontsize=9)


def write_chart(
    path: Path, results: Results, goals: Sequence[Target], sizes: Sequence[int], title: str
) -> None:
    """Draw how far each target is met, the assemblers, ingest (log scale), fan-out (log
    scale), memory and the Redis paths against the single instance into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = results
    figure = plt.figure(figsize=(17, 13))
    grid = figure.add_gridspec(3, 3, height_ratios=(1.1, 1, 1))
    top = figure.add_subplot(grid[0, :])
    axes = [[top, *(figure.add_subplot(grid[1, n]) for n in (0, 1))]]
    axes[0].append(figure.add_subplot(grid[1, 2]))
    axes.append([figure.add_subplot(grid[2, n]) for n in range(3)])
    names = [
        textwrap.fill(goal["key"].replace("_", " "), 14) + f"\n{goal['shown']}" for goal in goals
    ]
    values = [goal["attainment"] for goal in goals]
    colors = [MET if goal["met"] else MISSED for goal in goals]
    heading = "targets: measured / goal (above the line = met)"
    _bars(axes[0][0], heading, names, [(None, colors, values)], 1.0, lambda v: f"{v:.2f}")
    kinds = {
        "token": ("TokenAssembler", RELAY),
        "naive": ("naive str +=", PEER),
        "floor": ("floor", OTHER),
    }
    series: list[Series] = [
        (label, color, [r.median(f"assembler.{w}.{key}") for w in ("short", "long")])
        for key, (label, color) in kinds.items()
    ]
    names = ["short messages", "10k-char messages"]
    _bars(axes[0][1], "assembler (in-process), events/s", names, series)
    posts, appends = r.median("durable.relay.publish"), r.median("durable.peer.appends")
    sse = [r.median(f"durable.{side}.sse.p99") for side in ("relay", "peer")]
    http: list[Series] = [
        ("relay", RELAY, [posts, sse[0]]),
        ("@durable-streams/server", PEER, [appends, sse[1]]),
    ]
    names = ["posts (appends) per second,\none per message", "SSE delivery p99, ms"]
    axes[0][3].set_yscale("log")
    _bars(axes[0][3], "HTTP publishing and SSE, beside durable-streams", names, http)
    keys = ["ingest.relay", "ingest.http", "ingest.noop", "ingest.floor", "ingest.wsrelay"]
    keys += ["ingest.socketio", "batched.relay", "batched.floor"]
    names = ["relay", "relay\nNDJSON", "no-op ws", "Python\nfloor", "Node ws", "socketio"]
    names += ["relay\nbatched", "floor\nbatched"]
    colors = [RELAY, RELAY, OTHER, OTHER, PEER, PEER, RELAY, OTHER]
    heading = (
        f"ingest events/s: relay {times(r.ratio('ingest.relay', 'ingest.noop'))} of no-op, "
        f"{times(r.ratio('ingest.relay', 'ingest.socketio'))} socketio (target: batched 1M)"
    )
    ingest: list[Series] = [(None, colors, [r.median(key) for key in keys])]
    _bars(axes[0][2], heading, names, ingest, BATCHED_GOAL)
    size = max(sizes)
    groups = [
        ("fanout", "plain", "relay"),
        ("fanout.floor", "plain", "os.write\nfloor"),
        ("fanout.sse", "plain", "relay\nSSE"),
        ("fanout.workers", "plain", "--workers 2\nRedis"),
        ("fanout", "deltas", "relay\n+ deltas"),
        ("fanout.floor", "deltas", "floor\n+ deltas"),
    ]
    names = [name for _, _, name in groups]
    series = [
        (stat, color, [r.median(f"{case}.{size}.{mode}.{stat}") for case, mode, _ in groups])
        for stat, color in (("p50", RELAY), ("p99", PEER))
    ]
    heading = f"fan-out to {size:,}, ms from final to all (target: --workers 2 p99 < 100 ms)"
    _bars(axes[1][0], heading, names, series, FANOUT_GOAL_MS)
    values = [r.median(f"memory.{key}") / 1024 for key in ("idle", "idle_sse", "in_flight")]
    names = ["per idle\nWebSocket", "per idle\nSSE stream", "per in-flight\n10k-char message"]
    heading = f"memory, KiB of relay RSS (target: {RSS_GOAL_KIB:g} KiB per subscriber)"
    _bars(axes[1][1], heading, names, [(None, RELAY, values)], RSS_GOAL_KIB, lambda v: f"{v:,.1f}")
    routes = {"redis-same": "A->A via Redis", "redis-cross": "A->B via Redis"}
    stats = (("throughput", "throughput", RELAY), ("p50", "p50 latency", PEER))
    series = [
        (label, color, [r.ratio(f"routes.{key}.{stat}", f"routes.single.{stat}") for key in routes])
        for stat, label, color in stats
    ]
    p50, p99 = r.median("routes.single.p50"), r.median("routes.single.p99")
    heading = f"Redis paths / single instance (its latency: p50 {p50:.2f} ms, p99 {p99:.2f} ms)"
    _bars(axes[1][2], heading, list(routes.values()), series, 1.0, times)
    for panel in (axes[0][0], axes[0][2], axes[1][0]):
        panel.set_yscale("log")
    figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
