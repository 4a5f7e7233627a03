"""HTTP next to a peer, the ``@durable-streams/server`` reference server (npm, in memory, run
by Node from ``bench/durable``): ``python -m bench.durable`` (from the repository root).

* **Appends**: one writer, sequential requests on one keep-alive connection, one per completed
  message: its text appended to a durable stream (``POST /STREAM``), or its frames as NDJSON
  to the relay's ``POST /produce``, as a serverless gateway posts a reply. Each answer is
  checked (2xx; the relay's must ack the message) and the stream is read back at the end.
* **SSE latency**: one live SSE reader (``GET /STREAM?offset=-1&live=sse``; the relay's ``GET
  /sse?channel=C``), then the same POSTs at ``--rate`` per second; from just before a POST to
  when the reader holds the message's whole text, each message once, in order, exact.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from .cases import percentile
from .wire import BenchError, Message, build_messages

DIRECTORY = Path(__file__).with_name("durable")
START_TIMEOUT = 30.0
READ_TIMEOUT = 30.0
TEXT_PLAIN = "text/plain; charset=utf-8"
NDJSON = "application/x-ndjson"

Post = Callable[[aiohttp.ClientSession, Message], Awaitable[None]]  # append or produce one
TextOf = Callable[[str, str], str | None]  # a message's text from an SSE (event, data), or None


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
        yield port
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


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, str]]:
    """The ``(event, data)`` pairs of an SSE response, as they arrive."""
    event = "message"
    data: list[str] = []
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


async def sse_latency(
    url: str, post: Post, messages: Sequence[Message], rate: float, text_of: TextOf
) -> dict[str, Any]:
    """Connect a reader to ``url``, then ``post`` each message at ``rate``; time each one."""
    sent: list[float] = []
    attached = asyncio.Event()
    async with session() as reader, session() as writer:
        response = await reader.get(url, headers={"Accept": "text/event-stream"})
        if response.status != 200:
            raise BenchError(f"GET {url}: {response.status} {await response.text()}")

        async def receive() -> list[float]:
            arrived: list[float] = []
            async for event, data in sse_events(response):
                attached.set()  # both servers open a stream with an event of their own
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
    samples = [round((a - s) * 1000, 3) for s, a in zip(sent, arrived, strict=True)]
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

    def text_of(event: str, data: str) -> str | None:
        return data if event == "data" else None

    return await sse_latency(f"{url}?offset=-1&live=sse", post, messages, rate, text_of)


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
    relay = relay_process(
        "--max-events-per-second", "1000000000", "--max-connections-per-ip", "100000",
        name="relay",
    )  # fmt: skip
    await relay.start()
    try:
        async with running_durable() as port:
            durable = {
                "appends": await durable_appends(port, throughput),
                "sse": await durable_sse_latency(port, latency, args.rate),
            }
        ours = {
            "publish": await relay_http_publish(relay.port, "bench-http", throughput),
            "sse": await relay_sse_latency(relay.port, "bench-sse", latency, args.rate),
        }
    finally:
        await relay.terminate()
    result = {"relay": ours, "durable_streams": durable}
    for side in result.values():
        side["sse"]["samples"] = len(side["sse"].pop("samples_ms"))
        for name, record in side.items():
            side[name] = {key: round(value, 3) for key, value in record.items()}
    return result


def table(result: dict[str, Any]) -> str:
    """The figures side by side, and relay / durable-streams."""
    ours, peer = result["relay"], result["durable_streams"]
    rows = [
        ("completed messages/s, sequential POSTs", ours["publish"]["messages_per_second"],
         peer["appends"]["appends_per_second"]),
        ("SSE latency p50 (ms)", ours["sse"]["p50_ms"], peer["sse"]["p50_ms"]),
        ("SSE latency p99 (ms)", ours["sse"]["p99_ms"], peer["sse"]["p99_ms"]),
    ]  # fmt: skip
    lines = [f"{'':40} {'relay':>10} {'durable':>10} {'ratio':>7}"]
    lines += [f"{name:40} {a:>10,.6g} {b:>10,.6g} {a / b:>7.3f}" for name, a, b in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.durable", description=__doc__)
    parser.add_argument("--messages", type=int, default=2000, help="for the append rates")
    parser.add_argument("--latency-messages", type=int, default=300, help="for SSE latency")
    parser.add_argument("--rate", type=float, default=200.0, help="messages per second (SSE)")
    parser.add_argument("--deltas", type=int, default=20)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
