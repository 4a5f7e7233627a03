"""``python -m bench.instructions``: the relay's instructions per event, counted, not timed.

The relay runs in-process on in-memory transports, as in :mod:`bench.inprocess`, under
valgrind's callgrind, which counts the instructions the process executes. The count does
not depend on what else the machine is doing, so two versions of the relay compare exactly
even on a busy, shared machine where times move by half from run to run.

Each figure is the difference between two runs, one with ``--messages`` more messages than
the other, less the same difference for a run that only builds the load: what remains is
the relay's own work per event (reading frames, rules, assembly, broker, acks, delivery to
one subscriber), sent a frame each, 100 to an array frame (also with ten messages streamed
at once, their events interleaved), and as NDJSON lines in one chunked ``POST /produce``.
``--compare-python`` counts another installation's relay the same way.
With ``redis-server`` on the PATH, ingest through a private Redis is counted too: the
relay's side only (Redis is another process).

The HTTP rows count a whole request the same way, one at a time on one keep-alive
connection, each answered before the next is read: ``POST /produce`` of one completed
message (as ``bench/durable/produce.lua`` posts it), the same as a browser's ``fetch`` sends
it through the shipped nginx (:data:`BROWSER_HEADERS`), and a Durable Streams append.

Needs ``valgrind`` on the PATH (Debian's package). Each figure takes about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from token_relay.edge.relay import Relay
from token_relay.edge.server import HttpConnection, HttpServer

from tests.harness import RedisServer

from .durableprotocol import APPEND_TEXT
from .inprocess import (
    KeptTransport,
    as_the_cli_starts,
    check_answer,
    connect,
    feed,
    load,
    ndjson_post,
    post_lines,
    settings,
    settle,
)

BASE = 300
"""Messages in the smaller of each pair of runs (start-up and warm-up cancel out)."""
EVENTS_PER_MESSAGE = 11
"""10 deltas and a final, as :func:`bench.wire.build_messages` builds them."""
ROOT = Path(__file__).resolve().parent.parent


async def _ingest(
    messages: int, batch: int, setup_only: bool, broker: str, interleave: int = 1
) -> None:
    """Build the load; unless ``setup_only``, feed it to a relay and check it was applied:
    in frames of ``batch`` events, or (``batch`` 0) as NDJSON lines in one chunked POST;
    the messages ``interleave`` at a time (see :func:`~bench.inprocess.load`)."""
    relay = as_the_cli_starts(Relay(settings(broker)))
    server = await relay.start()
    _, seen = connect(server, "/subscribe?channel=c")
    quiet = None if broker == "memory://" else seen  # Redis's replies come back later
    await settle(lambda: True, quiet)
    _, texts, reads = load(messages, max(batch, 1), interleave=interleave)
    post = b"" if batch else ndjson_post(texts)
    if setup_only:
        return
    if not batch:  # NDJSON lines in one chunked POST
        check_answer(await post_lines(server, post), messages)
        if not seen.written:
            raise SystemExit("the relay did not apply the lines")
        return
    producer, transport = connect(server, "/produce?channel=c")
    await settle(lambda: True)
    await feed(producer, transport, reads, quiet)
    if relay.metrics.frames_in_producer.value != len(texts) or not seen.written:
        raise SystemExit("the relay did not apply every frame")


HTTP_CASES = {
    "produce": "POST /produce, a message per request",
    "browser": "  the same, a browser's through nginx",
    "append": "Durable Streams append",
}
"""The HTTP rows: what each request is."""
BROWSER_HEADERS = (
    b"User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    b"Chrome/131.0.0.0 Safari/537.36\r\n"
    b"Accept: */*\r\nAccept-Language: en-US,en;q=0.9\r\nAccept-Encoding: gzip, deflate, br\r\n"
    b"Origin: https://chat.example\r\nReferer: https://chat.example/\r\n"
    b"Sec-Fetch-Dest: empty\r\nSec-Fetch-Mode: cors\r\nSec-Fetch-Site: cross-site\r\n"
    b"Forwarded: for=203.0.113.7\r\nX-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Proto: https\r\n"
)
"""What a browser's ``fetch`` sends beside the request's own headers, and what the shipped
nginx adds to it: the ``browser`` row's request is ``produce``'s with these."""


def _request(kind: str, number: int) -> bytes:
    """The ``number``th request of ``kind``, as ``wrk`` sends it."""
    if kind in ("produce", "browser"):
        message = {"id": f"m-{number}", "delta": APPEND_TEXT, "final": True}
        body = json.dumps(message, separators=(",", ":")).encode()
        head = b"POST /produce?channel=c HTTP/1.1\r\nContent-Type: application/json\r\n"
        if kind == "browser":
            head += BROWSER_HEADERS
    else:
        body = APPEND_TEXT.encode()
        head = b"POST /v1/stream/counted HTTP/1.1\r\nContent-Type: text/plain; charset=utf-8\r\n"
    return head + b"Host: relay\r\nContent-Length: %d\r\n\r\n" % len(body) + body


async def _answered(server: HttpServer, request: bytes, ends: bytes) -> bytes:
    """Hand ``request`` to a new connection of ``server``; its whole answer."""
    connection, transport = HttpConnection(server), KeptTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    connection.data_received(request)
    await _until(lambda: transport.out.endswith(ends))
    return bytes(transport.out)


async def _until(done: Callable[[], bool]) -> None:
    """Let the loop run, a pass at a time, until ``done()``; give up after 10,000 passes."""
    for _ in range(10_000):
        if done():
            return
        await asyncio.sleep(0)
    raise SystemExit("no answer")


async def _http(kind: str, requests: int, setup_only: bool) -> None:
    """Build ``requests`` requests of ``kind``; unless ``setup_only``, send them one at a
    time on one connection, each answered (and checked) before the next."""
    relay = as_the_cli_starts(Relay(settings()))
    server = await relay.start()
    create = b"PUT /v1/stream/counted HTTP/1.1\r\nHost: relay\r\nContent-Length: 0\r\n"
    create += b"Content-Type: text/plain; charset=utf-8\r\n\r\n"
    if not (await _answered(server, create, b"\r\n\r\n")).startswith(b"HTTP/1.1 201"):
        raise SystemExit("the stream was not created")
    loads = [_request(kind, number) for number in range(requests)]
    if setup_only:
        return
    connection, transport = HttpConnection(server), KeptTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    produce = kind != "append"
    ends, status = (b"]}", b"HTTP/1.1 200") if produce else (b"\r\n\r\n", b"HTTP/1.1 204")
    for request in loads:
        written = len(transport.out)

        def answered(at: int = written) -> bool:
            return len(transport.out) > at and transport.out.endswith(ends)

        connection.data_received(request)
        await _until(answered)
    if transport.out.count(status) != requests or (produce and b'"errors":[{' in transport.out):
        raise SystemExit(f"the relay did not answer every request with {status.decode()}")


async def _child(messages: int, batch: int, setup_only: bool, redis: bool, interleave: int) -> None:
    """One counted run; with ``redis``, on a private ``redis-server`` (not counted: it is
    another process)."""
    if not redis:
        return await _ingest(messages, batch, setup_only, "memory://", interleave)
    with tempfile.TemporaryDirectory(prefix="token-relay-instructions-") as directory:
        server = RedisServer(Path(directory))
        server.start()
        try:
            await _ingest(messages, batch, setup_only, server.url)
        finally:
            server.kill()


class CountFailed(Exception):
    """A counted run did not finish (another installation may lack an extra, such as
    ``redis``): its row is reported failed, and the other rows are still counted."""


def _count(
    python: str, messages: int, batch: int, setup_only: bool, redis: bool, interleave: int
) -> int:
    """Instructions one child run executes, as callgrind counts them."""
    arguments = [str(messages), str(batch), "1" if setup_only else "0", "1" if redis else "0"]
    arguments.append(str(interleave))
    return _counted(python, ["--child", *arguments])


def _counted(python: str, arguments: list[str]) -> int:
    """Instructions ``python -m bench.instructions ARGUMENTS`` executes, as callgrind counts."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        python,
        "-m",
        "bench.instructions",
        *arguments,
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode or found is None:
        raise CountFailed(f"{python}: the counted run failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_event(
    python: str, batch: int, messages: int, redis: bool = False, interleave: int = 1
) -> float:
    """The relay's instructions per event, frames of ``batch`` events, the messages
    ``interleave`` at a time."""
    runs = [(BASE, False), (BASE + messages, False), (BASE, True), (BASE + messages, True)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        small, large, setup_small, setup_large = pool.map(
            lambda run: _count(python, run[0], batch, run[1], redis, interleave), runs
        )
    return ((large - small) - (setup_large - setup_small)) / (messages * EVENTS_PER_MESSAGE)


def per_request(python: str, kind: str, requests: int) -> float:
    """The relay's instructions per HTTP request of ``kind``."""
    runs = [(BASE, False), (BASE + requests, False), (BASE, True), (BASE + requests, True)]

    def count(run: tuple[int, bool]) -> int:
        number, setup_only = run
        return _counted(python, ["--http-child", kind, str(number), "1" if setup_only else "0"])

    with ThreadPoolExecutor(max_workers=2) as pool:
        small, large, setup_small, setup_large = pool.map(count, runs)
    return ((large - small) - (setup_large - setup_small)) / requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("--messages", type=int, default=1000, help="messages counted (1000)")
    parser.add_argument(
        "--compare-python", default="", metavar="PYTHON", help="another installation's python"
    )
    parser.add_argument("--child", nargs=5, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--http-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.http_child:
        kind, requests, setup_only = args.http_child
        asyncio.new_event_loop().run_until_complete(_http(kind, int(requests), setup_only == "1"))
        sys.stdout.flush()
        os._exit(0)
    if args.child:
        messages, batch, setup_only, redis, interleave = args.child
        run = _child(messages, batch, bool(setup_only), bool(redis), interleave)
        asyncio.new_event_loop().run_until_complete(run)
        sys.stdout.flush()
        os._exit(0)  # the relay's leftover tasks need no orderly end
    if shutil.which("valgrind") is None:
        print("python -m bench.instructions needs valgrind on the PATH", file=sys.stderr)
        return 2
    pythons = [("relay", sys.executable)]
    if args.compare_python:
        pythons.append(("--compare-python's relay", args.compare_python))
    cases = [
        (1, False, 1, "a frame per event"),
        (100, False, 1, "100 events per frame"),
        (100, False, 10, "the same, 10 at a time"),
        (0, False, 1, "as NDJSON lines"),
    ]
    if shutil.which("redis-server"):
        cases.append((1, True, 1, "through Redis"))
    failed = 0
    rows: list[tuple[str, str, Callable[[str], float]]] = [
        (
            f"ingest, {what:<22}",
            "event",
            functools.partial(
                per_event, batch=batch, messages=args.messages, redis=redis, interleave=interleave
            ),
        )
        for batch, redis, interleave, what in cases
    ]
    rows += [
        (
            f"{what:<37}",
            "request",
            functools.partial(per_request, kind=kind, requests=args.messages),
        )
        for kind, what in HTTP_CASES.items()
    ]
    for what, unit, count_of in rows:
        first: float | None = None
        for index, (name, python) in enumerate(pythons):
            try:
                count = count_of(python)
            except CountFailed as exc:
                failed += 1
                print(f"{what} {name:<26} failed: {exc}", file=sys.stderr)
                print(f"{what} {name:<26} {'failed':>9}")
                continue
            if index == 0:
                first = count
            ratio = f"  {count / first:.2f}x this relay" if index and first else ""
            print(f"{what} {name:<26} {count:9,.0f} instructions/{unit}{ratio}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
