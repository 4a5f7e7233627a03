"""The processes a run needs, each in its own process, and their clean-up.

* a private ``redis-server``;
* relays (``python -m token_relay``): S on the memory broker, A and B sharing Redis, F for the
  fan-out case, and a fresh one per repetition for the memory case;
* the peers: a no-op websockets server (:mod:`bench.noop_server`) and a python-socketio
  relay (:mod:`bench.sio_server`);
* subscriber client processes (:mod:`bench.subscribers`), a few at a time.

Every process is stopped on the way out, whether the run finished, failed or was
interrupted: :func:`running_cluster` and :class:`SubscriberPool` are context managers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BenchError
from .subscribers import raise_fd_limit

__all__ = [
    "RELAY_FLAGS",
    "Cluster",
    "RedisServer",
    "Route",
    "ServiceProcess",
    "SubscriberPool",
    "cpu_seconds",
    "free_port",
    "relay",
    "rss_bytes",
    "running_cluster",
]

LISTENING = re.compile(rb"listening on port (\d+):")
NOTABLE = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback")
START_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0
LOG_LINES_KEPT = 200
RESUBSCRIBE_WITHIN = 60.0
RELAY_FLAGS = (
    # One producer connection is saturated on purpose: lift its event rate limit.
    "--max-events-per-second",
    "1000000000",
    # Thousands of subscribers come from 127.0.0.1.
    "--max-connections-per-ip",
    "100000",
)
"""Flags every benchmarked relay gets; otherwise they run with their defaults."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def _environment() -> dict[str, str]:
    """This process's environment without any ``RELAY_*`` setting."""
    return {name: value for name, value in os.environ.items() if not name.startswith("RELAY_")}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far (in clock ticks of 10 ms)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    """A process's resident set size."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE


async def _stop(process: asyncio.subprocess.Process | None) -> None:
    """Ask a process to exit (SIGTERM), and kill it if it has not within ``STOP_TIMEOUT``."""
    if process is None or process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


class RedisServer:
    """A ``redis-server`` on a free port, with no persistence."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        """The broker URL relays connect to."""
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        """Start the server and wait until it answers ``PING``."""
        executable = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.process = await asyncio.create_subprocess_exec(
            executable,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.directory),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT
        while loop.time() < deadline:
            if self.process.returncode is not None:
                break
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.02)
                continue
            try:
                writer.write(b"PING\r\n")
                if (await asyncio.wait_for(reader.readline(), 1)).startswith(b"+PONG"):
                    return
            except (OSError, TimeoutError):
                pass
            finally:
                writer.close()
            await asyncio.sleep(0.02)
        raise BenchError(f"redis-server did not start on port {self.port}")

    async def stop(self) -> None:
        """Stop the server if it runs."""
        await _stop(self.process)


class ServiceProcess:
    """``python -m MODULE --port 0 ...``, ready once it logs ``listening on port N:``.

    Its log (stderr) is read all along, so that a full pipe never blocks it, and its
    warnings and errors are kept for the report.
    """

    def __init__(self, name: str, module: str, *args: str) -> None:
        self.name = name
        self.module = module
        self.args = args
        self.port = 0
        self.process: asyncio.subprocess.Process | None = None
        self.log: collections.deque[str] = collections.deque(maxlen=LOG_LINES_KEPT)
        self.notable: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """The service's WebSocket base URL."""
        return f"ws://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The process id (the process must have started)."""
        if self.process is None:
            raise BenchError(f"{self.name} has not started")
        return self.process.pid

    async def start(self) -> None:
        """Start the process and wait for the log line that names its port."""
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.module,
            "--port",
            "0",
            *self.args,
            env=_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        stderr = self.process.stderr
        assert stderr is not None
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while not self.port:
                    line = await stderr.readline()
                    if not line:
                        raise BenchError(
                            f"{self.name} exited before listening:\n" + "".join(self.log)
                        )
                    self._keep(line)
                    match = LISTENING.search(line)
                    if match:
                        self.port = int(match.group(1))
        except TimeoutError:
            raise BenchError(f"{self.name} did not start within {START_TIMEOUT:g} s") from None
        self._reader = asyncio.create_task(self._read_log(stderr))

    def _keep(self, line: bytes) -> None:
        text = line.decode(errors="replace")
        self.log.append(text)
        if NOTABLE.search(text) and len(self.notable) < LOG_LINES_KEPT:
            self.notable.append(text.rstrip())

    async def _read_log(self, stderr: asyncio.StreamReader) -> None:
        while line := await stderr.readline():
            self._keep(line)

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process is not None and self.process.returncode is None

    def check_alive(self) -> None:
        """Fail if the process has exited."""
        if not self.alive:
            raise BenchError(f"{self.name} exited:\n" + "".join(self.log))

    async def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL if needed) and finish reading its log."""
        await _stop(self.process)
        if self._reader is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reader, STOP_TIMEOUT)


def relay(name: str, *args: str) -> ServiceProcess:
    """A relay process with :data:`RELAY_FLAGS` and ``args``."""
    return ServiceProcess(name, "token_relay", *RELAY_FLAGS, *args)


@dataclass(frozen=True, slots=True)
class Route:
    """A path through the relays: where the producer connects and where the subscriber does."""

    key: str
    label: str
    producer: ServiceProcess
    subscriber: ServiceProcess


@dataclass(frozen=True, slots=True)
class Cluster:
    """Everything :func:`running_cluster` started."""

    redis: RedisServer
    single: ServiceProcess
    a: ServiceProcess
    b: ServiceProcess
    fan: ServiceProcess
    noop: ServiceProcess
    socketio: ServiceProcess

    @property
    def services(self) -> tuple[ServiceProcess, ...]:
        """Every long-lived process but redis-server."""
        return (self.single, self.a, self.b, self.fan, self.noop, self.socketio)

    def routes(self) -> list[Route]:
        """The paths of the Redis case, baseline first."""
        return [
            Route("single", "single instance (S->S)", self.single, self.single),
            Route("redis-same", "same instance via Redis (A->A)", self.a, self.a),
            Route("redis-cross", "cross-instance via Redis (A->B)", self.a, self.b),
        ]

    def check_alive(self) -> None:
        """Fail if a process has exited."""
        for service in self.services:
            service.check_alive()


@contextlib.asynccontextmanager
async def started(*services: ServiceProcess) -> AsyncIterator[None]:
    """Start the services together; stop them all on the way out."""
    try:
        await asyncio.gather(*(service.start() for service in services))
        yield
    finally:
        await asyncio.gather(*(service.stop() for service in services), return_exceptions=True)


@contextlib.asynccontextmanager
async def running_cluster(relay_args: Sequence[str] = ()) -> AsyncIterator[Cluster]:
    """Start redis-server, the relays and the peers; stop them all on the way out.

    Every relay gets :data:`RELAY_FLAGS` and ``relay_args``.
    """
    raise_fd_limit()  # inherited by every child: the fan-out relay holds 10,000 sockets
    with tempfile.TemporaryDirectory(prefix="token-relay-bench-") as directory:
        redis = RedisServer(Path(directory))
        cluster = Cluster(
            redis=redis,
            single=relay("S", *relay_args),
            a=relay("A", "--broker", redis.url, *relay_args),
            b=relay("B", "--broker", redis.url, *relay_args),
            fan=relay("F", *relay_args),
            noop=ServiceProcess("no-op server", "bench.noop_server"),
            socketio=ServiceProcess("socketio relay", "bench.sio_server"),
        )
        try:
            await redis.start()
            async with started(*cluster.services):
                yield cluster
        finally:
            await redis.stop()


class _Client:
    """One ``python -m bench.subscribers`` process and the lines it wrote."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.errors: collections.deque[str] = collections.deque(maxlen=20)
        assert process.stdout is not None and process.stderr is not None
        self._tasks = [
            asyncio.create_task(self._read_stdout(process.stdout)),
            asyncio.create_task(self._read_stderr(process.stderr)),
        ]

    async def _read_stdout(self, stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            try:
                self.lines.put_nowait(json.loads(line))
            except ValueError:
                self.errors.append(line.decode(errors="replace"))
        await self.process.wait()
        detail = "".join(self.errors).strip()
        self.lines.put_nowait(
            {
                "error": f"exited with status {self.process.returncode}"
                + f": {detail}" * bool(detail)
            }
        )

    async def _read_stderr(self, stderr: asyncio.StreamReader) -> None:
        while line := await stderr.readline():
            self.errors.append(line.decode(errors="replace"))

    async def next(self) -> dict[str, Any]:
        """The next line; an ``error`` line fails."""
        line = await self.lines.get()
        if "error" in line:
            raise BenchError(f"subscriber process: {line['error']}")
        return line

    async def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), STOP_TIMEOUT)
        except TimeoutError:
            await _stop(self.process)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class SubscriberPool:
    """``connections`` subscribers of one channel, spread over ``processes`` processes."""

    def __init__(self, clients: Sequence[_Client], connections: int) -> None:
        self.clients = clients
        self.connections = connections

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls,
        port: int,
        channel: str,
        connections: int,
        processes: int,
        *,
        deltas: bool = False,
        deltas_per_message: int = 10,
        nice: int = 0,
        ready_within: float = 120.0,
    ) -> AsyncIterator[SubscriberPool]:
        """Start the processes and wait until every connection is subscribed."""
        shares = [
            connections // processes + (n < connections % processes) for n in range(processes)
        ]
        clients: list[_Client] = []
        try:
            for share in shares:
                if not share:
                    continue
                process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.subscribers",
                    "--port",
                    str(port),
                    "--channel",
                    channel,
                    "--connections",
                    str(share),
                    "--deltas-per-message",
                    str(deltas_per_message),
                    *(["--deltas"] if deltas else []),
                    "--nice",
                    str(nice),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                clients.append(_Client(process))
            pool = cls(clients, connections)
            await pool._ready(ready_within)
            yield pool
        finally:
            await asyncio.gather(*(client.stop() for client in clients), return_exceptions=True)

    async def _ready(self, seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                for client in self.clients:
                    line = await client.next()
                    if "ready" not in line:
                        raise BenchError(f"subscriber process: unexpected line {line}")
        except TimeoutError:
            raise BenchError(
                f"{self.connections} subscribers were not all subscribed within {seconds:g} s"
            ) from None

    @property
    def pids(self) -> list[int]:
        """The client processes' ids."""
        return [client.process.pid for client in self.clients]

    async def set_deltas(self, deltas: bool) -> None:
        """Subscribe every connection again, with or without live deltas."""
        for client in self.clients:
            assert client.process.stdin is not None
            client.process.stdin.write(b"deltas 1\n" if deltas else b"deltas 0\n")
        await self._ready(RESUBSCRIBE_WITHIN)

    async def delivered(self, message_id: str, seconds: float) -> tuple[float, float]:
        """Wait until every connection holds ``message_id``; its first and last arrival."""
        firsts: list[float] = []
        lasts: list[float] = []
        try:
            async with asyncio.timeout(seconds):
                for client in self.clients:
                    line = await client.next()
                    if line.get("id") != message_id:
                        raise BenchError(f"expected message {message_id!r}, a client got {line}")
                    firsts.append(float(line["first"]))
                    lasts.append(float(line["last"]))
        except TimeoutError:
            raise BenchError(
                f"message {message_id!r} did not reach all {self.connections} subscribers "
                f"within {seconds:g} s"
            ) from None
        return min(firsts), max(lasts)
