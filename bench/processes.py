"""The processes a run needs: a private ``redis-server`` and ``python -m server`` relays.

Every process is stopped by :func:`running_cluster` on the way out, whether the run
finished, failed or was interrupted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from .errors import BenchError

__all__ = ["Cluster", "RedisServer", "RelayProcess", "Route", "free_port", "running_cluster"]

LISTENING = re.compile(rb"listening on port (\d+):")
NOTABLE = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback")
START_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0
LOG_LINES_KEPT = 200
RELAY_ENVIRONMENT = {
    # The throughput case saturates one producer connection on purpose, so the relay's
    # per-connection event rate limit is lifted; a relay without that limit ignores this.
    "RELAY_MAX_EVENTS_PER_SECOND": "1000000000",
}
"""Settings every benchmarked relay gets; otherwise they run with their defaults."""


def _relay_environment() -> dict[str, str]:
    """This process's environment without any ``RELAY_*`` setting, plus ``RELAY_ENVIRONMENT``."""
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("RELAY_")
    }
    environment.update(RELAY_ENVIRONMENT)
    return environment


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


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


class RelayProcess:
    """One ``python -m server --port 0 ...`` process; its log is kept for the report."""

    def __init__(self, name: str, *args: str) -> None:
        self.name = name
        self.args = args
        self.port = 0
        self.process: asyncio.subprocess.Process | None = None
        self.log: collections.deque[str] = collections.deque(maxlen=LOG_LINES_KEPT)
        self.notable: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """The relay's WebSocket base URL."""
        return f"ws://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Start the relay and wait for the log line that names its port."""
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "server",
            "--port",
            "0",
            *self.args,
            env=_relay_environment(),
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
                            f"relay {self.name} exited before listening:\n" + "".join(self.log)
                        )
                    self._keep(line)
                    match = LISTENING.search(line)
                    if match:
                        self.port = int(match.group(1))
        except TimeoutError:
            raise BenchError(
                f"relay {self.name} did not start within {START_TIMEOUT:g} s"
            ) from None
        # Keep reading its log, so that a full pipe never blocks it.
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

    async def stop(self) -> None:
        """Stop the relay (SIGTERM, then SIGKILL if needed) and finish reading its log."""
        await _stop(self.process)
        if self._reader is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reader, STOP_TIMEOUT)


@dataclass(frozen=True, slots=True)
class Route:
    """A path through the relays: where the producer connects and where the subscriber does."""

    key: str
    label: str
    producer: RelayProcess
    subscriber: RelayProcess


@dataclass(frozen=True, slots=True)
class Cluster:
    """Everything :func:`running_cluster` started."""

    redis: RedisServer
    single: RelayProcess
    a: RelayProcess
    b: RelayProcess

    @property
    def relays(self) -> tuple[RelayProcess, ...]:
        """The three relay processes."""
        return (self.single, self.a, self.b)

    def routes(self) -> list[Route]:
        """The measured paths, baseline first."""
        return [
            Route("single", "single instance (S->S)", self.single, self.single),
            Route("redis-same", "same instance via Redis (A->A)", self.a, self.a),
            Route("redis-cross", "cross-instance via Redis (A->B)", self.a, self.b),
        ]

    def check_alive(self) -> None:
        """Fail if a relay has exited."""
        for relay in self.relays:
            if not relay.alive:
                raise BenchError(f"relay {relay.name} exited:\n" + "".join(relay.log))


@contextlib.asynccontextmanager
async def running_cluster() -> AsyncIterator[Cluster]:
    """Start redis-server, relay S (memory broker) and relays A and B (Redis); stop them all."""
    with tempfile.TemporaryDirectory(prefix="token-relay-bench-") as directory:
        redis = RedisServer(Path(directory))
        single = RelayProcess("S")
        a = RelayProcess("A", "--broker", redis.url)
        b = RelayProcess("B", "--broker", redis.url)
        try:
            await redis.start()
            await asyncio.gather(single.start(), a.start(), b.start())
            yield Cluster(redis, single, a, b)
        finally:
            await asyncio.gather(single.stop(), a.stop(), b.stop(), return_exceptions=True)
            await redis.stop()
