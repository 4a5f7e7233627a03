"""The Durable Streams figures of issue 29, against any server of the protocol at a base URL
(the relay's ``/v1/stream/``, the reference server's root, or nginx in front of two relays):

* **Appends, 16 connections**: ``wrk`` (``bench/durable/append.lua``) keeps 16 keep-alive
  connections busy appending a fixed text to one stream for ``seconds``; then the stream's
  length must match the appends ``wrk`` counted, and none may have failed.
* **Append -> SSE reader**: one live SSE reader (``?offset=-1&live=sse``), then appends at a
  paced rate; from just before each append to when the reader holds its text (p50, p99).
* **Catch-up of 10 MB**: a stream filled with 10 MB, then read from ``offset=-1`` to the
  tail, following ``Stream-Next-Offset`` until ``Stream-Up-To-Date``, checked byte for byte.

:func:`client_ceiling` runs the same two clients against nginx (``return 204`` and a static
10 MB file), to show that neither client is what bounds a figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from .cases import percentile
from .wire import BenchError, Message

DIRECTORY = Path(__file__).with_name("durable")
CONNECTIONS = 16
CATCH_UP_BYTES = 10 * 1000 * 1000
FILL_BYTES = 256 * 1024
"""Bytes per append while filling the catch-up stream (under every server's body limit)."""
TEXT_PLAIN = "text/plain; charset=utf-8"
APPEND_TEXT = "The quick brown fox jumps over the lazy dog. " * 2
"""What each ``wrk`` append carries (90 bytes: about one completed message)."""
READ_TIMEOUT = 60.0


class Refused(BenchError):
    """The server answered a setup request with an error (e.g. 503 ``broker_unavailable``)."""

    def __init__(self, request: str, status: int, body: str) -> None:
        super().__init__(f"{request}: {status} {body}")
        self.status, self.body = status, body


@dataclass(frozen=True, slots=True)
class Load:
    """How much of each figure to measure."""

    seconds: float = 5.0
    """Per ``wrk`` run of appends."""
    latency_messages: int = 300
    rate: float = 200.0
    reads: int = 5
    """Catch-up reads of the 10 MB stream (the median is reported)."""


def session(connections: int = 1) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=READ_TIMEOUT)
    connector = aiohttp.TCPConnector(limit=connections)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


async def create(http: aiohttp.ClientSession, url: str) -> None:
    async with http.put(url, headers={"Content-Type": TEXT_PLAIN}) as response:
        if response.status != 201:
            raise Refused(f"PUT {url}", response.status, await response.text())


async def append(http: aiohttp.ClientSession, url: str, body: bytes) -> None:
    async with http.post(url, data=body, headers={"Content-Type": TEXT_PLAIN}) as response:
        if not 200 <= response.status < 300:
            raise Refused(f"POST {url}", response.status, await response.text())
        await response.read()


async def read_all(http: aiohttp.ClientSession, url: str) -> bytes:
    """The whole stream: catch-up reads from the start until ``Stream-Up-To-Date``."""
    parts: list[bytes] = []
    offset = "-1"
    while True:
        async with http.get(url, params={"offset": offset}) as response:
            if response.status != 200:
                raise Refused(f"GET {url}", response.status, await response.text())
            parts.append(await response.read())
            offset = response.headers["Stream-Next-Offset"]
            if response.headers.get("Stream-Up-To-Date") == "true":
                return b"".join(parts)


def run_wrk(script: str, url: str, seconds: float, environment: dict[str, str]) -> dict[str, Any]:
    """One ``wrk`` run of ``bench/durable/<script>`` over :data:`CONNECTIONS` connections for
    ``seconds``, with ``environment`` added to the script's; the JSON summary the script prints
    when it is done, with its rate (``per_second``)."""
    if (binary := shutil.which("wrk")) is None:
        raise BenchError("the HTTP figures need wrk on the PATH (apt-get install wrk)")
    command = [
        binary, "-t1", f"-c{CONNECTIONS}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
        "-s", str(DIRECTORY / script), url,
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, env=os.environ | environment, check=False
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise BenchError(f"wrk failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    summary: dict[str, Any] = json.loads(lines[-1])
    summary["per_second"] = summary["requests"] / (summary["micros"] / 1e6)
    return summary


def wrk(url: str, seconds: float, append: bool = True) -> dict[str, Any]:
    """``wrk`` over :data:`CONNECTIONS` connections for ``seconds``: appending
    :data:`APPEND_TEXT` to ``url``, or (not ``append``) getting it."""
    return run_wrk("append.lua", url, seconds, {"APPEND_TEXT": APPEND_TEXT if append else ""})


def cpu(pids: Sequence[int]) -> float:
    """CPU seconds the processes have used so far, all together."""
    from tests.harness.machine import cpu_seconds

    return sum(cpu_seconds(pid) for pid in pids)


async def loaded(url: str, seconds: float, pids: Sequence[int], append: bool) -> dict[str, Any]:
    """One ``wrk`` run, with the servers' CPU time over its wall time."""
    used, started = cpu(pids), time.perf_counter()
    summary = await asyncio.to_thread(wrk, url, seconds, append)
    used, wall = cpu(pids) - used, time.perf_counter() - started
    summary["server_cpu_percent"] = 100 * used / wall
    summary["cpu_us_per_request"] = 1e6 * used / max(1, summary["requests"])
    return summary


async def appends(base: str, load: Load, pids: Sequence[int]) -> dict[str, Any]:
    """Appends per second over 16 connections to one stream, each one checked; and, as a
    yardstick of the server's cost per request, catch-up reads of a 90-byte stream."""
    url = f"{base}bench/appends-{time.monotonic_ns()}"
    small = f"{base}bench/small-{time.monotonic_ns()}"
    async with session() as http:
        await create(http, small)
        await append(http, small, APPEND_TEXT.encode())
        reads = await loaded(f"{small}?offset=-1", load.seconds, pids, append=False)
        await create(http, url)
        summary = await loaded(url, load.seconds, pids, append=True)
        stored = await read_all(http, url)
    failed = sum(summary[key] for key in ("non2xx", "connect", "read", "write", "timeout"))
    size, count = len(APPEND_TEXT.encode()), summary["requests"]
    # Appends in flight when wrk stopped may have landed without being counted.
    failed += sum(reads[key] for key in ("non2xx", "connect", "read", "write", "timeout"))
    if failed or not count * size <= len(stored) <= (count + CONNECTIONS) * size:
        raise BenchError(f"appends to {url}: {summary}, {len(stored)} bytes stored")
    if stored != APPEND_TEXT.encode() * (len(stored) // size):
        raise BenchError(f"appends to {url}: the stream read back is not the appends")
    return {
        "appends_per_second": summary["per_second"],
        "appends": count,
        "server_cpu_percent": summary["server_cpu_percent"],
        "cpu_us_per_append": summary["cpu_us_per_request"],
        "small_reads_per_second": reads["per_second"],
        "cpu_us_per_small_read": reads["cpu_us_per_request"],
    }


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, str]]:
    """The ``(event, data)`` pairs of an SSE response, as they arrive."""
    event, data = "message", list[str]()
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)


Post = Callable[[aiohttp.ClientSession, Message], Awaitable[None]]
"""Send one message (append it, or produce it) on a writer session."""
TextOf = Callable[[str, str], str | None]
"""A message's text from an SSE ``(event, data)``, or None for an event that holds none."""


async def timed_sse(
    response: aiohttp.ClientResponse,
    writer: aiohttp.ClientSession,
    post: Post,
    messages: Sequence[Message],
    rate: float,
    text_of: TextOf,
) -> list[float]:
    """Once the SSE ``response`` has sent its first event, ``post`` each message at ``rate``;
    each message's milliseconds from just before its post to when the reader holds its text
    (each once, in order, exact)."""
    sent: list[float] = []
    attached = asyncio.Event()

    async def receive() -> list[float]:
        arrived: list[float] = []
        async for event, data in sse_events(response):
            attached.set()  # every server opens a stream with an event of its own
            if (text := text_of(event, data)) is None:
                continue
            if len(arrived) >= len(messages) or text != messages[len(arrived)].text:
                raise BenchError(f"SSE message {len(arrived)} is wrong: {text!r}")
            arrived.append(time.perf_counter())
            if len(arrived) == len(messages):
                return arrived
        raise BenchError(f"the SSE stream ended after {len(arrived)} messages")

    receiving = asyncio.create_task(receive())
    try:
        async with asyncio.timeout(READ_TIMEOUT):
            await attached.wait()
        started = time.perf_counter()
        for n, message in enumerate(messages):
            await asyncio.sleep(max(0.0, started + n / rate - time.perf_counter()))
            sent.append(time.perf_counter())
            await post(writer, message)
        async with asyncio.timeout(READ_TIMEOUT):
            arrived = await receiving
    finally:
        receiving.cancel()
        response.close()
    return [(a - s) * 1000 for s, a in zip(sent, arrived, strict=True)]


def data_text(event: str, data: str) -> str | None:
    """A Durable Stream's SSE: a ``data`` event's data is the appended text."""
    return data if event == "data" else None


async def sse_latency(base: str, messages: Sequence[Message], rate: float) -> dict[str, Any]:
    """From just before each append to when the live SSE reader holds its text."""
    url = f"{base}bench/latency-{time.monotonic_ns()}"
    async with session() as reader, session() as writer:
        await create(writer, url)
        response = await reader.get(f"{url}?offset=-1&live=sse")
        if response.status != 200:
            raise Refused(f"GET {url} (SSE)", response.status, await response.text())

        async def post(http: aiohttp.ClientSession, message: Message) -> None:
            await append(http, url, message.text.encode())

        samples = await timed_sse(response, writer, post, messages, rate, data_text)
    return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99)}


def catch_up_content() -> bytes:
    """10 MB of text that differs along its length, so a misplaced byte shows."""
    line = b"".join(f"{n:08d} {APPEND_TEXT}\n".encode() for n in range(2000))
    return (line * (CATCH_UP_BYTES // len(line) + 1))[:CATCH_UP_BYTES]


async def catch_up(base: str, load: Load, content: bytes) -> dict[str, Any]:
    """Fill a stream with ``content``, then time whole reads of it (fresh connection each)."""
    url = f"{base}bench/catch-up-{time.monotonic_ns()}"
    async with session() as http:
        await create(http, url)
        for start in range(0, len(content), FILL_BYTES):
            await append(http, url, content[start : start + FILL_BYTES])
    return await timed_reads(url, load.reads, content, whole=False)


async def timed_reads(url: str, reads: int, content: bytes, whole: bool) -> dict[str, Any]:
    """Read ``url`` ``reads`` times (as a stream, or ``whole`` as one GET); each must be
    ``content``; the median read."""
    seconds: list[float] = []
    for _ in range(reads):
        async with session() as http:
            started = time.perf_counter()
            if whole:
                async with http.get(url) as response:
                    got = await response.read()
            else:
                got = await read_all(http, url)
            seconds.append(time.perf_counter() - started)
        if got != content:
            raise BenchError(f"the catch-up read of {url} differs ({len(got)} bytes)")
    median = percentile(seconds, 50)
    return {"read_ms": median * 1000, "mb_per_second": len(content) / median / 1e6}


async def figures(
    base: str, load: Load, messages: Sequence[Message], pids: Sequence[int]
) -> dict[str, Any]:
    """The three figures for the server at ``base`` (its processes: ``pids``); a setup
    request refused (such as 503 while Redis is out of reach) is reported as such."""
    try:
        return {
            "appends": await appends(base, load, pids),
            "sse": await sse_latency(base, messages, load.rate),
            "catch_up": await catch_up(base, load, catch_up_content()),
        }
    except Refused as exc:
        return {"refused": {"status": exc.status, "answer": exc.body, "request": str(exc)}}


NGINX_CONFIG = """\
worker_processes 1;
pid nginx.pid;
error_log error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path client_body_temp;
    proxy_temp_path proxy_temp;
    fastcgi_temp_path fastcgi_temp;
    uwsgi_temp_path uwsgi_temp;
    scgi_temp_path scgi_temp;
    upstream relays {{
{servers}        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location = /noop {{ return 204; }}
        location = /file {{ root {root}; try_files /catch-up =404; }}
        location / {{
            proxy_pass http://relays;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 75s;
        }}
    }}
}}
"""


@contextlib.asynccontextmanager
async def running_nginx(backends: Sequence[int] = ()) -> AsyncIterator[int]:
    """nginx on a free port: ``/noop`` answers 204, ``/file`` is a static 10 MB file, and
    anything else goes round-robin to ``backends`` over keep-alive connections."""
    from tests.harness.machine import free_port

    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    with tempfile.TemporaryDirectory(prefix="bench-nginx-") as folder:
        directory, port = Path(folder), free_port()
        (directory / "catch-up").write_bytes(catch_up_content())
        servers = "".join(f"        server 127.0.0.1:{p};\n" for p in backends or (9,))
        text = NGINX_CONFIG.format(servers=servers, port=port, root=directory)
        (directory / "nginx.conf").write_text(text)
        options = "daemon off; user root;" if os.geteuid() == 0 else "daemon off;"
        process = await asyncio.create_subprocess_exec(
            binary, "-p", f"{directory}/", "-e", "stderr", "-c", str(directory / "nginx.conf"),
            "-g", options, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            for _ in range(500):
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    break
                await asyncio.sleep(0.02)
            else:
                raise BenchError("nginx did not start")
            yield port
        finally:
            if process.returncode is None:
                process.terminate()
                await process.wait()


async def client_ceiling(load: Load) -> dict[str, Any]:
    """The two clients against nginx, which does next to nothing: what they can measure."""
    async with running_nginx() as port:
        base = f"http://127.0.0.1:{port}"
        summary = await asyncio.to_thread(wrk, f"{base}/noop", load.seconds, True)
        read = await timed_reads(f"{base}/file", load.reads, catch_up_content(), whole=True)
    return {"requests_per_second": summary["per_second"], "catch_up": read}
