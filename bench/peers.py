"""``python -m bench.peers``: the relay beside its Node peers, the rows of ``python -m bench``
that compare them, on their own: WebSocket ingest (one frame per event) against the Node ws
relay (``bench/wsrelay``) and the Python floor of that job (``bench/floor.py``), fan-out to
1,000 (plain messages) against the Node ws relay, and ``POST /produce`` under ``wrk`` (16
connections, one completed message per request) against the ``@durable-streams/server``
reference's appends under the same load. Each row is a ratio against its peer in the same
run; ``--quick`` is a smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.harness import ServiceProcess

from . import cases, durable, wsrelay
from . import durableprotocol as protocol
from .cli import Config, Run
from .report import format_table, format_targets, peer_targets, times, to_json
from .subscribers import raise_fd_limit
from .wire import BenchError, build_messages

FANOUT_SIZE = 1_000


async def measure(run: Run) -> None:
    """Every peer row, repetition-major; fan-out last, on a pool per server."""
    config, results, stream = run.config, run.results, cases.stream
    await asyncio.gather(wsrelay.install(), durable.install())
    raise_fd_limit()
    relay, fanout = cases.relay("S", *config.relay_args), cases.relay("F", *config.relay_args)
    peer = ServiceProcess("bench.wsrelay", name="Node ws relay")
    floor = ServiceProcess("bench.producefloor", name="produce floor")
    wsfloor = ServiceProcess("bench.floor", name="os.write floor")
    messages = build_messages(config.ingest_messages, config.deltas)
    load = protocol.Load(seconds=config.durable_seconds)
    async with (
        cases.started(relay, fanout, peer, floor, wsfloor, notable=run.notable),
        durable.running_reference() as (port, pid),
    ):
        for server in (relay, peer, wsfloor):  # every code path once before any measuring
            await stream(server, server, run.channel(f"warm-{server.name}", 0), messages[:1000])
        for n in range(1, config.repeat + 1):
            ingest = (("ingest.relay", relay), ("ingest.wsrelay", peer), ("ingest.floor", wsfloor))
            for key, server in ingest:
                record = await stream(server, server, run.channel(key, n), messages)
                results.add(key, record["events_per_second"], {"repetition": n, **record})
            ratio = results.samples["ingest.relay"][-1] / results.samples["ingest.wsrelay"][-1]
            print(f"[{n}/{config.repeat}] ingest: relay {ratio:.2f}x Node ws", file=sys.stderr)
            reference = await protocol.appends(f"http://127.0.0.1:{port}/", load, [pid])
            results.add("durable.peer.stream.appends", reference["appends_per_second"], reference)
            await run.produce_load(relay, floor, load, n)
        sizes = (FANOUT_SIZE,)
        # In turn, a repetition of each before the next.
        pair = [(fanout, "fanout"), (peer, "fanout-wsrelay")]
        await run.fanout_of({"F": fanout, "ws": peer}, pair, deltas=False, sizes=sizes)


def rows(run: Run) -> list[tuple[str, str, str, str]]:
    """The figures side by side: relay, peer, and relay / peer (for the fan-out p50, the
    relay's over the peer's: at most 1.0 meets its target)."""
    r, size = run.results, f"{FANOUT_SIZE:,}"
    fanout, peer = f"fanout.{FANOUT_SIZE}.plain", f"fanout.wsrelay.{FANOUT_SIZE}.plain"

    def rate(key: str, unit: str) -> str:
        return f"{r.median(key):,.0f} {unit}"

    def spread(key: str) -> str:
        return f"p50 {r.median(key + '.p50'):.1f} ms, p99 {r.median(key + '.p99'):.1f} ms"

    ingest = times(r.ratio("ingest.relay", "ingest.wsrelay"))
    produce = times(r.ratio("durable.relay.produce", "durable.peer.stream.appends"))
    return [
        ("ingest", "relay, one frame per event", rate("ingest.relay", "events/s"), ingest),
        ("ingest", "  Node ws relay, the same", rate("ingest.wsrelay", "events/s"), ""),
        (
            "ingest",
            "  Python floor of the job (bench.floor), the same",
            rate("ingest.floor", "events/s"),
            times(r.ratio("ingest.floor", "ingest.wsrelay")),
        ),
        ("fan-out", f"relay, {size} subscribers, p50", spread(fanout), ""),
        ("fan-out", f"  Node ws relay, {size}", spread(peer), ""),
        (
            "fan-out",
            "  relay p50 / Node ws relay p50",
            "",
            times(r.ratio(fanout + ".p50", peer + ".p50")),
        ),
        (
            "http",
            "relay: POST /produce, 16 connections",
            rate("durable.relay.produce", "posts/s"),
            produce,
        ),
        (
            "http",
            "  reference: appends, 16 connections",
            rate("durable.peer.stream.appends", "appends/s"),
            "",
        ),
        (
            "http",
            "  Python floor of POST /produce, the same",
            rate("durable.floor.produce", "posts/s"),
            times(r.ratio("durable.floor.produce", "durable.peer.stream.appends")),
        ),
        (
            "http",
            "  relay: GET /healthz, the same (its HTTP edge alone)",
            rate("durable.relay.edge", "requests/s"),
            times(r.ratio("durable.relay.edge", "durable.peer.stream.appends")),
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; medians are reported")
    parser.add_argument("--ingest-messages", type=int, default=10_000)
    parser.add_argument("--fanout-messages", type=int, default=6, help="per repetition")
    parser.add_argument("--seconds", type=float, default=5.0, help="per wrk run")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.ingest_messages, args.fanout_messages, args.seconds = 1, 2_000, 2, 2.0
    config = Config(
        repeat=args.repeat,
        ingest_messages=args.ingest_messages,
        fanout_messages=args.fanout_messages,
        fanout_sizes=(FANOUT_SIZE,),
        fanout_processes=1,
        durable_seconds=args.seconds,
    )
    run = Run(config)
    try:
        asyncio.run(measure(run))
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    table, goals = rows(run), peer_targets(run.results)
    print(f"\n{format_table(table)}\n\nTargets:\n{format_targets(goals)}")
    if run.notable:
        print("\nThe servers logged warnings or errors:\n" + "\n".join(run.notable))
    if args.json is not None:
        extra: dict[str, Any] = {"config": dataclasses.asdict(config)}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(to_json(run.results, table, goals, extra), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
