"""HTTP next to a peer, the ``@durable-streams/server`` reference server (npm, in memory, run
by Node from ``bench/durable``): ``python -m bench.durable`` (from the repository root).

* **Appends**: one writer, sequential requests on one keep-alive connection, one per completed
  message: its text appended to a durable stream (``POST /STREAM``), or its frames as NDJSON
  to the relay's ``POST /produce``, as a serverless gateway posts a reply. Each answer is
  checked (2xx; the relay's must ack the message) and the stream is read back at the end.
* **SSE latency**: one live SSE reader (``GET /STREAM?offset=-1&live=sse``; the relay's ``GET
  /sse?channel=C``), then the same POSTs at ``--rate`` per second; from just before a POST to
  when the reader holds the message's whole text, each message once, in order, exact.
* **The Durable Streams protocol** (:mod:`bench.durableprotocol`): appends per second over
  16 connections (``wrk``), append -> SSE reader p99, and a catch-up read of a 10 MB stream,
  for the relay's ``/v1/stream/`` and the reference server, with ratios (above 1.0, the
  relay does better); the same on two relays on one ``redis-server`` behind nginx
  (round-robin), which reports a refusal (Redis out of reach, say) as such; and
  what bounds them: each server's CPU per request, the relay's ``/healthz`` over the same
  connections, and the clients against nginx. ``--quick`` is a smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from . import durableprotocol as protocol
from .cases import percentile
from .wire import BenchError, Message, build_messages

DIRECTORY = Path(__file__).with_name("durable")
START_TIMEOUT = 30.0
READ_TIMEOUT = 30.0
TEXT_PLAIN = "text/plain; charset=utf-8"
NDJSON = "application/x-ndjson"

Post = protocol.Post
TextOf = protocol.TextOf


async def install() -> None:
    """``npm ci`` (or ``npm install`` with no lockfile) in ``bench/durable``, once."""
    if (DIRECTORY / "node_modules" / "@durable-streams" / "server").is_dir():
        return
    if shutil.which("node") is None or (npm := shutil.which("npm")) is None:
        raise BenchError("the durable-streams peer needs Node.js (node and npm on PATH)")
    command = "ci" if (DIRECTORY / "package-lock.json").exists() else "install"
    process = await asyncio.create_subprocess_exec(
        npm, command, "--no-audit", "--no-fund", cwd=DIRECTORY,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await process.communicate()
    if process.returncode:
        raise BenchError(f"npm {command} in bench/durable failed:\n{output.decode()}")


@contextlib.asynccontextmanager
async def running_durable() -> AsyncIterator[int]:
    """Run ``bench/durable/serve.mjs`` (in memory, a free port); yields the port."""
    async with running_reference() as (port, _):
        yield port


@contextlib.asynccontextmanager
async def running_reference() -> AsyncIterator[tuple[int, int]]:
    """Run ``bench/durable/serve.mjs`` (in memory, a free port); yields its port and pid."""
    if (node := shutil.which("node")) is None:
        raise BenchError("the durable-streams peer needs Node.js (node on PATH)")
    process = await asyncio.create_subprocess_exec(
        node, "serve.mjs", cwd=DIRECTORY,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    try:
        port = await listening(process.stderr)
        drain = asyncio.create_task(process.stderr.read())  # a full pipe must not block it
        yield port, process.pid
        drain.cancel()
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 5)
            except TimeoutError:
                process.kill()
                await process.wait()


async def listening(stderr: asyncio.StreamReader) -> int:
    """The port that serve.mjs names once it listens."""
    log: list[bytes] = []
    try:
        async with asyncio.timeout(START_TIMEOUT):
            while not (line := await stderr.readline()).startswith(b"durable-streams"):
                if not line:
                    raise BenchError(f"durable-streams exited:\n{b''.join(log).decode()}")
                log.append(line)
    except TimeoutError:
        raise BenchError(f"durable-streams did not start within {START_TIMEOUT:g} s") from None
    return int(line.split(b"listening on port ", 1)[1].split(b":", 1)[0])


def ndjson(message: Message) -> bytes:
    """A message's frames as one NDJSON body."""
    return ("\n".join(message.frames) + "\n").encode()


def session() -> aiohttp.ClientSession:
    """One keep-alive connection: requests go one at a time."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=READ_TIMEOUT)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=timeout)


async def create_stream(http: aiohttp.ClientSession, url: str) -> None:
    async with http.put(url, headers={"Content-Type": TEXT_PLAIN}) as response:
        if response.status != 201:
            raise BenchError(f"PUT {url}: {response.status} {await response.text()}")


async def append(http: aiohttp.ClientSession, url: str, message: Message) -> None:
    """Append one message's text to the durable stream at ``url``."""
    data = message.text.encode()
    async with http.post(url, data=data, headers={"Content-Type": TEXT_PLAIN}) as response:
        if not 200 <= response.status < 300:
            raise BenchError(f"append {message.id}: {response.status} {await response.text()}")
        await response.read()


async def produce(http: aiohttp.ClientSession, url: str, channel: str, message: Message) -> None:
    """Post one message's frames to the relay; its answer must ack it and nothing else."""
    async with http.post(url, data=ndjson(message), headers={"Content-Type": NDJSON}) as response:
        body = await response.read()
    answer = json.loads(body) if response.status == 200 else {}
    expected = [{"type": "ack", "id": message.id, "channel": channel}]
    if answer.get("acks") != expected or answer.get("errors") or answer.get("cancels"):
        raise BenchError(f"produce {message.id}: {response.status} {body.decode()}")


async def durable_appends(port: int, messages: Sequence[Message]) -> dict[str, float]:
    """Append every message's text to a fresh stream; then read it back from the start."""
    url = f"http://127.0.0.1:{port}/bench/appends-{time.monotonic_ns()}"
    async with session() as http:
        await create_stream(http, url)
        started = time.perf_counter()
        for message in messages:
            await append(http, url, message)
        seconds = time.perf_counter() - started
        async with http.get(url, params={"offset": "-1"}) as response:
            stored = await response.text()
    if stored != "".join(message.text for message in messages):
        raise BenchError(f"the stream read back differs ({len(stored)} characters)")
    count = len(messages)
    return {"appends": count, "seconds": seconds, "appends_per_second": count / seconds}


async def relay_http_publish(
    port: int, channel: str, messages: Sequence[Message]
) -> dict[str, float]:
    """``POST /produce`` every message, one after the other; each must be acked."""
    url = f"http://127.0.0.1:{port}/produce?channel={channel}"
    async with session() as http:
        started = time.perf_counter()
        for message in messages:
            await produce(http, url, channel, message)
        seconds = time.perf_counter() - started
    count, events = len(messages), sum(len(message.frames) for message in messages)
    return {
        "messages": count,
        "events": events,
        "seconds": seconds,
        "messages_per_second": count / seconds,
        "events_per_second": events / seconds,
    }


async def sse_latency(
    url: str, post: Post, messages: Sequence[Message], rate: float, text_of: TextOf
) -> dict[str, Any]:
    """Connect a reader to ``url``, then ``post`` each message at ``rate``; time each one."""
    async with session() as reader, session() as writer:
        response = await reader.get(url, headers={"Accept": "text/event-stream"})
        if response.status != 200:
            raise BenchError(f"GET {url}: {response.status} {await response.text()}")
        timed = await protocol.timed_sse(response, writer, post, messages, rate, text_of)
    samples = [round(ms, 3) for ms in timed]
    return {
        "p50_ms": round(percentile(samples, 50), 3),
        "p99_ms": round(percentile(samples, 99), 3),
        "samples_ms": samples,
    }


async def durable_sse_latency(
    port: int, messages: Sequence[Message], rate: float
) -> dict[str, Any]:
    """Latency from an append to the durable stream's live SSE reader holding its text."""
    url = f"http://127.0.0.1:{port}/bench/latency-{time.monotonic_ns()}"
    async with session() as http:
        await create_stream(http, url)

    async def post(http: aiohttp.ClientSession, message: Message) -> None:
        await append(http, url, message)

    return await sse_latency(f"{url}?offset=-1&live=sse", post, messages, rate, protocol.data_text)


async def relay_sse_latency(
    port: int, channel: str, messages: Sequence[Message], rate: float
) -> dict[str, Any]:
    """Latency from a relay ``POST /produce`` to an ``/sse`` reader holding the message."""
    base = f"http://127.0.0.1:{port}"

    async def post(http: aiohttp.ClientSession, message: Message) -> None:
        await produce(http, f"{base}/produce?channel={channel}", channel, message)

    def text_of(event: str, data: str) -> str | None:
        if event == "message":
            text: str = json.loads(data)["text"]
            return text
        if event in ("aborted", "error"):
            raise BenchError(f"SSE {event}: {data}")
        return None

    return await sse_latency(f"{base}/sse?channel={channel}", post, messages, rate, text_of)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.harness import relay_process

    await install()
    throughput = build_messages(args.messages, args.deltas)
    latency = build_messages(args.latency_messages, args.deltas, prefix="l")
    load = protocol.Load(args.seconds, args.latency_messages, args.rate, args.reads)
    relay = relay_process(*RELAY_FLAGS, name="relay")
    await relay.start()
    try:
        async with running_reference() as (port, pid):
            durable = {
                "appends": await durable_appends(port, throughput),
                "sse": await durable_sse_latency(port, latency, args.rate),
            }
            base = f"http://127.0.0.1:{port}/"
            reference = await protocol.figures(base, load, latency, [pid])
        ours = {
            "publish": await relay_http_publish(relay.port, "bench-http", throughput),
            "sse": await relay_sse_latency(relay.port, "bench-sse", latency, args.rate),
        }
        base = f"http://127.0.0.1:{relay.port}/v1/stream/"
        streams = await protocol.figures(base, load, latency, [relay.pid])
        # The relay's cheapest request, over the same HTTP edge: its ceiling per request.
        health = await protocol.loaded(
            f"http://127.0.0.1:{relay.port}/healthz", load.seconds, [relay.pid], append=False
        )
    finally:
        await relay.terminate()
    cluster = await cluster_figures(load, latency) if args.cluster else None
    ceiling = await protocol.client_ceiling(load)
    for side in (ours, durable):
        side["sse"]["samples"] = len(side["sse"].pop("samples_ms"))
        for name, record in side.items():
            side[name] = {key: round(value, 3) for key, value in record.items()}
    result = {"relay": ours, "durable_streams": durable}
    figures = {"relay": streams, "reference": reference, "clients_on_nginx": ceiling}
    figures["relay_healthz"] = {
        key: health[key] for key in ("per_second", "server_cpu_percent", "cpu_us_per_request")
    }
    if cluster is not None:
        figures["two_relays_on_redis"] = cluster
    return result | {"durable_streams_protocol": _rounded(figures)}


RELAY_FLAGS = ("--max-events-per-second", "1000000000", "--max-connections-per-ip", "100000")


async def cluster_figures(load: protocol.Load, latency: Sequence[Message]) -> dict[str, Any]:
    """The figures on two relays on one ``redis-server``, behind nginx (round-robin)."""
    import tempfile

    from tests.harness import relays_on
    from tests.harness.redis_server import RedisServer

    if shutil.which("redis-server") is None:
        raise BenchError("the two-relay figures need redis-server on the PATH")
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as folder:
        redis = RedisServer(Path(folder))
        redis.start()
        try:
            async with (
                relays_on(redis.url, *RELAY_FLAGS) as relays,
                protocol.running_nginx([relay.port for relay in relays]) as port,
            ):
                base = f"http://127.0.0.1:{port}/v1/stream/"
                return await protocol.figures(base, load, latency, [r.pid for r in relays])
        finally:
            redis.kill()


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    return round(value, 3) if isinstance(value, float) else value


def protocol_rows(figures: dict[str, Any]) -> list[tuple[str, Any, Any, float | None]]:
    """The three figures: relay, reference, and relay / reference (for the latency,
    reference / relay, so that above 1.0 is better on every row)."""

    def at(side: str, *keys: str) -> Any:
        record = figures[side]
        if "refused" in record:
            return f"{record['refused']['status']} refused"
        for key in keys:
            record = record[key]
        return record

    rows: list[tuple[str, Any, Any, float | None]] = []
    for name, keys, higher in (
        ("appends/s, 16 connections, one stream", ("appends", "appends_per_second"), True),
        ("append -> SSE reader p99 (ms)", ("sse", "p99_ms"), False),
        ("append -> SSE reader p50 (ms)", ("sse", "p50_ms"), False),
        ("catch-up read of 10 MB (MB/s)", ("catch_up", "mb_per_second"), True),
        ("server CPU during the appends (%)", ("appends", "server_cpu_percent"), None),
        ("CPU per append (us)", ("appends", "cpu_us_per_append"), False),
        ("reads/s of a 90-byte stream, 16 conns", ("appends", "small_reads_per_second"), True),
        ("CPU per read of a 90-byte stream (us)", ("appends", "cpu_us_per_small_read"), False),
    ):
        ours, theirs = at("relay", *keys), at("reference", *keys)
        ratio = (ours / theirs if higher else theirs / ours) if theirs and ours else None
        ratio = None if higher is None else ratio
        rows.append((name, ours, theirs, ratio))
        if "two_relays_on_redis" in figures and len(rows) < 8:
            cluster = at("two_relays_on_redis", *keys)
            both = isinstance(cluster, float) and isinstance(theirs, float)
            ratio = (cluster / theirs if higher else theirs / cluster) if both else None
            ratio = None if higher is None else ratio
            rows.append(("  two relays on Redis, behind nginx", cluster, theirs, ratio))
    return rows


def _cell(value: Any) -> str:
    return f"{value:>12,.6g}" if isinstance(value, float | int) else f"{value:>12}"


def table(result: dict[str, Any]) -> str:
    """The figures side by side, and their ratio, relay / reference for a rate and
    reference / relay for a time or a cost: above 1.0, the relay does better."""
    ours, peer = result["relay"], result["durable_streams"]
    rates = ours["publish"]["messages_per_second"], peer["appends"]["appends_per_second"]
    rows: list[tuple[str, Any, Any, float | None]] = [
        ("completed messages/s, sequential POSTs", *rates, rates[0] / rates[1])
    ]
    for stat in ("p50", "p99"):
        times = ours["sse"][f"{stat}_ms"], peer["sse"][f"{stat}_ms"]
        rows.append((f"SSE latency {stat} (ms), /sse vs append", *times, times[1] / times[0]))
    rows += protocol_rows(result["durable_streams_protocol"])
    lines = [f"{'':42} {'relay':>12} {'reference':>12} {'ratio':>7}"]
    for name, a, b, ratio in rows:
        shown = f"{ratio:>7.3f}" if ratio is not None else f"{'-':>7}"
        lines.append(f"{name:42} {_cell(a)} {_cell(b)} {shown}")
    health = result["durable_streams_protocol"]["relay_healthz"]
    lines.append(
        f"relay GET /healthz, 16 connections (its HTTP edge): {health['per_second']:,.0f}/s, "
        f"{health['cpu_us_per_request']:,.0f} us CPU each, CPU {health['server_cpu_percent']:.0f}%"
    )
    ceiling = result["durable_streams_protocol"]["clients_on_nginx"]
    lines.append(
        f"clients on nginx (their ceiling): wrk {ceiling['requests_per_second']:,.0f} "
        f"requests/s over 16 connections; aiohttp reads 10 MB at "
        f"{ceiling['catch_up']['mb_per_second']:,.0f} MB/s"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.durable", description=__doc__)
    parser.add_argument("--messages", type=int, default=2000, help="for the append rates")
    parser.add_argument("--latency-messages", type=int, default=300, help="for SSE latency")
    parser.add_argument("--rate", type=float, default=200.0, help="messages per second (SSE)")
    parser.add_argument("--deltas", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5.0, help="per wrk run of appends")
    parser.add_argument("--reads", type=int, default=5, help="catch-up reads of 10 MB")
    parser.add_argument(
        "--no-cluster", dest="cluster", action="store_false",
        help="skip the figures on two relays on Redis behind nginx",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.latency_messages, args.seconds, args.reads = 300, 100, 2.0, 2
    try:
        result = asyncio.run(run(args))
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    print(table(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
