"""``python -m MODULE --port 0 ...`` as a real subprocess, ready once it logs the port it
listens on; :func:`relay_process` is one for ``token_relay``."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

from .machine import START_TIMEOUT

LISTENING = re.compile(rb"listening on port (\d+):")
WARNING = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback")
STOP_TIMEOUT = 5.0
LOG_LINES_KEPT = 500


class ServiceProcess:
    """``python -m MODULE --port 0 ARGS``, ready once it logs ``listening on port N:``.

    Its log (stderr) is read all along, so that a full pipe never blocks it; the last
    :data:`LOG_LINES_KEPT` lines are kept, and apart from them the first
    :data:`LOG_LINES_KEPT` warnings and errors, which a busy log would otherwise push out.
    """

    def __init__(
        self, module: str, *args: str, name: str | None = None, python: str | None = None
    ) -> None:
        self.module = module
        self.python = python or sys.executable
        """The interpreter to run it with (another installation, to compare versions)."""
        self.args = args
        self.name = name or module
        self.port = 0
        self.process: asyncio.subprocess.Process | None = None
        self.lines: collections.deque[str] = collections.deque(maxlen=LOG_LINES_KEPT)
        self.warnings: list[str] = []
        self.log_lines = 0
        """Lines logged in all, kept or not."""
        self.log_bytes = 0
        """Bytes logged in all."""
        self.tracebacks = 0
        """Tracebacks logged in all."""
        """Log lines at WARNING or above, and tracebacks, without their line ends."""
        self._reader: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """The service's WebSocket base URL."""
        return f"ws://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The process id (the process must have started)."""
        if self.process is None:
            raise RuntimeError(f"{self.name} has not started")
        return self.process.pid

    @property
    def log(self) -> str:
        """The log lines kept so far."""
        return "".join(self.lines)

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process is not None and self.process.returncode is None

    async def start(self) -> ServiceProcess:
        """Start the process and wait for the log line that names its port."""
        environment = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        self.process = await asyncio.create_subprocess_exec(
            self.python,
            *("-m", self.module, "--port", "0", *self.args),
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # Its own process group, so that kill() takes worker processes down with it.
            start_new_session=True,
        )
        stderr = self.process.stderr
        assert stderr is not None
        try:
            async with asyncio.timeout(START_TIMEOUT):
                while not self.port:
                    line = await stderr.readline()
                    if not line:
                        raise RuntimeError(f"{self.name} exited before listening:\n{self.log}")
                    self._keep(line)
                    match = LISTENING.search(line)
                    if match:
                        self.port = int(match.group(1))
        except TimeoutError:
            raise RuntimeError(f"{self.name} did not start within {START_TIMEOUT:g} s") from None
        self._reader = asyncio.create_task(self._read_log(stderr))
        return self

    def _keep(self, line: bytes) -> None:
        text = line.decode(errors="replace")
        self.lines.append(text)
        self.log_lines += 1
        self.log_bytes += len(line)
        self.tracebacks += text.startswith("Traceback")
        if WARNING.search(text) and len(self.warnings) < LOG_LINES_KEPT:
            self.warnings.append(text.rstrip())

    async def _read_log(self, stderr: asyncio.StreamReader) -> None:
        while line := await stderr.readline():
            self._keep(line)

    async def wait(self, timeout: float = STOP_TIMEOUT) -> int:  # noqa: ASYNC109
        """Wait for the process to exit and its log to be read; returns its exit code."""
        assert self.process is not None
        code = await asyncio.wait_for(self.process.wait(), timeout)
        if self._reader is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reader, STOP_TIMEOUT)
        return code

    async def terminate(self, timeout: float = STOP_TIMEOUT) -> int:  # noqa: ASYNC109
        """SIGTERM, then SIGKILL if it has not exited within ``timeout``; returns the code."""
        if self.process is None:
            return 0
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
        try:
            return await self.wait(timeout)
        except TimeoutError:
            return await self.kill()

    async def kill(self) -> int:
        """Kill the process, and any worker processes it started, at once, as a crash would."""
        if self.process is None:
            return 0
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        return await self.wait()

    async def stop(self) -> None:
        """Kill it if it still runs (tests' clean-up: nothing to wait for)."""
        await self.kill()

    async def http_status(self, path: str) -> int:
        """The status code of a plain ``GET path``."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        return int(status_line.split()[1])


PARSER_VARIABLE = "TOKEN_RELAY_TEST_HTTP_PARSER"
"""Set by the tests' fixture: the ``--http-parser`` of the relay processes a test starts."""


def relay_process(*args: str, name: str = "relay") -> ServiceProcess:
    """A ``python -m token_relay`` process with ``args`` (and the test's ``--http-parser``)."""
    parser = os.environ.get(PARSER_VARIABLE)
    if parser:
        args = (*args, "--http-parser", parser)
    return ServiceProcess("token_relay", *args, name=name)


@contextlib.asynccontextmanager
async def relays_on(redis_url: str, *args: str) -> AsyncIterator[tuple[ServiceProcess, ...]]:
    """Two relay processes on the Redis at ``redis_url``, with ``args``, started together and
    killed on the way out."""
    relays = (
        relay_process("--broker", redis_url, *args),
        relay_process("--broker", redis_url, *args),
    )
    await asyncio.gather(*(relay.start() for relay in relays))
    try:
        yield relays
    finally:
        await asyncio.gather(*(relay.stop() for relay in relays))
