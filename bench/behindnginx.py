"""``python -m bench.behindnginx``: HTTP requests through a real nginx to two relays.

Where users run it: two relay processes on one ``redis-server``, behind nginx running
``deploy/nginx.conf`` as shipped (only its ports change, as in the tests). ``wrk`` (16
connections, as in ``python -m bench``) posts one completed message per request to
``POST /produce``, appends to a Durable Streams stream, and gets ``GET /healthz``, through
nginx. ``--config OTHER`` runs another nginx configuration beside it on the same relays, in
turn, round by round (such as the previous version's file, for a before and after); each
row is the median of ``--rounds`` rounds, and the ratio is against the first configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.harness import Nginx, RedisServer, relays_on

from . import durableprotocol as protocol
from . import produceload
from .durable import RELAY_FLAGS
from .wire import BenchError

SHIPPED = Path(__file__).resolve().parent.parent / "deploy" / "nginx.conf"
LOADS = ("POST /produce", "Durable Streams appends", "GET /healthz")


async def _put(port: int, path: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"PUT {path} HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n"
            "Content-Type: text/plain; charset=utf-8\r\nContent-Length: 0\r\n\r\n".encode()
        )
        status = await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
    if not status.startswith(b"HTTP/1.1 201 "):
        raise BenchError(f"PUT {path} through nginx: {status!r}")


async def _loads(port: int, name: str, seconds: float) -> dict[str, float]:
    """Requests per second of each load through nginx on ``port``."""
    base = f"http://127.0.0.1:{port}"
    produced = await asyncio.to_thread(
        produceload.wrk, f"{base}/produce?channel={name}", seconds, f"{name}-"
    )
    await _put(port, f"/v1/stream/{name}")
    appended = await asyncio.to_thread(protocol.wrk, f"{base}/v1/stream/{name}", seconds, True)
    edge = await asyncio.to_thread(protocol.wrk, f"{base}/healthz", seconds, False)
    rates = {}
    for load, summary in zip(LOADS, (produced, appended, edge), strict=True):
        failed = {key: summary.get(key) for key in produceload.FAILURES if summary.get(key)}
        if failed:
            raise BenchError(f"{load} through nginx ({name}): {failed}")
        rates[load] = summary["per_second"]
    return rates


async def measure(
    configs: Sequence[Path], rounds: int, seconds: float
) -> dict[str, dict[str, list[float]]]:
    """Each configuration's rates, round by round, the configurations in turn."""
    results: dict[str, dict[str, list[float]]] = {
        str(config): {load: [] for load in LOADS} for config in configs
    }
    with tempfile.TemporaryDirectory(prefix="bench-behind-nginx-") as folder:
        redis = RedisServer(Path(folder))
        redis.start()
        try:
            async with relays_on(redis.url, *RELAY_FLAGS, "--trusted-proxy", "127.0.0.1") as (
                first,
                second,
            ):
                for round_ in range(rounds):
                    for index, config in enumerate(configs):
                        directory = Path(folder) / f"nginx-{round_}-{index}"
                        directory.mkdir()
                        nginx = Nginx(config, [first.port, second.port], directory)
                        nginx.start()
                        try:
                            rates = await _loads(nginx.port, f"r{round_}c{index}", seconds)
                        finally:
                            nginx.stop()
                        for load, rate in rates.items():
                            results[str(config)][load].append(rate)
        finally:
            redis.kill()
    return results


def report(results: dict[str, dict[str, list[float]]]) -> str:
    """The medians, and each against the first configuration's."""
    names = list(results)
    lines = [f"{'requests/s (median)':<26}" + "".join(f"{Path(n).name:>22}" for n in names)]
    for load in LOADS:
        medians = [statistics.median(results[name][load]) for name in names]
        cells = "".join(
            f"{m:>14,.0f}" + (f" ({m / medians[0]:.2f}x)" if i else " " * 8)
            for i, m in enumerate(medians)
        )
        lines.append(f"{load:<26}{cells}".rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.behindnginx", description=__doc__)
    parser.add_argument(
        "--config",
        action="append",
        type=Path,
        default=[],
        help="another nginx configuration, run beside the shipped one (repeatable)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds of each load (4)")
    parser.add_argument("--json", type=Path, help="write every round's rates here")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round of 1 s")
    args = parser.parse_args(argv)
    rounds, seconds = (1, 1.0) if args.quick else (args.rounds, args.seconds)
    try:
        results = asyncio.run(measure([SHIPPED, *args.config], rounds, seconds))
    except BenchError as exc:
        print(f"bench.behindnginx: {exc}", file=sys.stderr)
        return 1
    print(report(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
