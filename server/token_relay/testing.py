"""Process control shared by the test suite and the benchmarks.

* :func:`free_port`, :func:`rss_bytes`, :func:`cpu_seconds`: small facts about the machine.
* :func:`eventually`: poll a condition until it holds, or fail after a timeout.
* :class:`RedisServer`: a private ``redis-server`` on a free port, with no persistence,
  that a test can kill and start again (a restart loses everything, as a crash would).
* :class:`ServiceProcess`: ``python -m MODULE --port 0 ...`` as a real subprocess, ready once
  it logs the port it listens on; :func:`relay_process` is one for ``token_relay``.
* :class:`SseReader`: a minimal Server-Sent Events client over one real socket (h11), that
  can cut its connection with no goodbye.
* :class:`Nginx`: a real ``nginx`` running the repository's ``deploy/nginx.conf``, on a
  free port, in front of relays.
* :class:`Proxy`: a TCP proxy that can cut every connection at once, with no close frame, as
  a network failure would; :class:`Balancer`, one that spreads connections over backends that
  may change (a rolling restart).

Nothing here is used by the relay itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import h11

__all__ = [
    "Balancer",
    "Nginx",
    "Proxy",
    "RedisServer",
    "ServiceProcess",
    "SseEvent",
    "SseReader",
    "WebhookReceiver",
    "cpu_seconds",
    "eventually",
    "free_port",
    "relay_process",
    "rss_bytes",
]

LISTENING = re.compile(rb"listening on port (\d+):")
WARNING = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback")
START_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0
LOG_LINES_KEPT = 500
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def rss_bytes(pid: int) -> int:
    """A process's resident set size."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]],
    timeout: float = 5.0,  # noqa: ASYNC109 - a bound on polling, not on one await
    interval: float = 0.01,
    what: str = "condition",
) -> None:
    """Wait until ``condition()`` is true (it may be async); raise ``AssertionError`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout:g} s")
        await asyncio.sleep(interval)


class RedisServer:
    """One ``redis-server`` process on a free port, with no persistence."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The broker URL relays connect to."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server (again, on the same port) and wait until it answers ``PING``."""
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server") or "/usr/bin/redis-server",
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.directory)),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        """Kill the server at once, as a crash would."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@dataclasses.dataclass(frozen=True)
class SseEvent:
    """One Server-Sent Event: its ``event:``, ``id:`` (or None) and ``data:``."""

    event: str
    id: str | None
    data: str

    def json(self) -> Any:
        """The data, decoded."""
        return json.loads(self.data)


class SseReader:
    """``GET path`` as an SSE stream on ``port``: the response head, then events one by one.

    Comment lines are counted in :attr:`comments`; ``retry:`` is kept in :attr:`retry`.
    """

    def __init__(self, port: int, path: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        self.port, self.path, self.headers = port, path, list(headers)
        self.status = 0
        self.response_headers: dict[str, str] = {}
        self.comments = 0
        self.retry: int | None = None
        self.ended = False
        self._http = h11.Connection(h11.CLIENT)
        self._buffer = ""
        self._events: collections.deque[SseEvent] = collections.deque()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> SseReader:
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        request = h11.Request(
            method="GET",
            target=self.path,
            headers=[("Host", "relay"), ("Accept", "text/event-stream"), *self.headers],
        )
        self._writer.write(self._http.send(request) + self._http.send(h11.EndOfMessage()))
        while self.status == 0:
            event = await self._next_http()
            if isinstance(event, h11.Response):
                self.status = event.status_code
                self.response_headers = {k.decode().lower(): v.decode() for k, v in event.headers}
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()

    def cut(self) -> None:
        """Drop the connection at once, as a network would."""
        if self._writer is not None:
            self._writer.transport.abort()

    async def _next_http(self) -> Any:
        assert self._reader is not None
        while True:
            event = self._http.next_event()
            if event is not h11.NEED_DATA:
                return event
            self._http.receive_data(await self._reader.read(65536))

    async def next(self, timeout: float = 5.0) -> SseEvent:  # noqa: ASYNC109
        """The next event; raises ``EOFError`` once the stream has ended."""
        async with asyncio.timeout(timeout):
            while not self._events:
                if self.ended:
                    raise EOFError("the stream ended")
                event = await self._next_http()
                if isinstance(event, h11.Data):
                    self._feed(bytes(event.data).decode())
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    self.ended = True
            return self._events.popleft()

    def _feed(self, text: str) -> None:
        self._buffer += text
        while "\n\n" in self._buffer:
            block, self._buffer = self._buffer.split("\n\n", 1)
            fields: dict[str, str] = {}
            data: list[str] = []
            for line in block.split("\n"):
                if line.startswith(":"):
                    self.comments += 1
                    continue
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "data":
                    data.append(value)
                elif name == "retry":
                    self.retry = int(value)
                else:
                    fields[name] = value
            if data:
                event = SseEvent(fields.get("event", "message"), fields.get("id"), "\n".join(data))
                self._events.append(event)


class Nginx:
    """A real ``nginx`` with a deployment's configuration, in front of relays on ``backends``.

    The configuration's ``listen`` line becomes a free port on 127.0.0.1 and its upstream
    becomes one ``server`` line per backend, with the options of the first; everything
    else is used as it is written. nginx runs with ``directory`` as its prefix (``-p``),
    where the configuration names its pid, logs and temporary files.
    """

    def __init__(self, config: Path, backends: list[int], directory: Path) -> None:
        self.config = config
        self.backends = backends
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The WebSocket base URL clients use."""
        return f"ws://127.0.0.1:{self.port}"

    def render(self) -> str:
        """The configuration as it runs here."""
        text = self.config.read_text()
        text, listens = re.subn(
            r"(?m)^(\s*)listen \d+( ssl)?;", rf"\1listen 127.0.0.1:{self.port}\2;", text
        )
        upstream = re.compile(r"(?m)^(\s*)server 127\.0\.0\.1:\d+( [^;]*)?;\n")
        servers = upstream.findall(text)
        if listens != 1 or not servers:
            raise RuntimeError(f"{self.config} has no single 'listen PORT;' or no upstream")
        indent, options = servers[0]
        lines = "".join(f"{indent}server 127.0.0.1:{port}{options};\n" for port in self.backends)
        text = upstream.sub("", text, count=len(servers) - 1)
        return upstream.sub(lines.replace("\\", "\\\\"), text, count=1)

    def start(self) -> None:
        """Start nginx and wait until it accepts connections."""
        path = self.directory / "nginx.conf"
        path.write_text(self.render())
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        # As root, the workers stay root: nginx's own user could not reach a private folder.
        options = "daemon off; user root;" if os.geteuid() == 0 else "daemon off;"
        self.process = subprocess.Popen(
            [binary, "-p", f"{self.directory}/", "-e", "stderr", "-c", str(path), "-g", options],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and self.process.poll() is None:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.5),
            ):
                return
            time.sleep(0.02)
        error = self.process.stderr.read().decode() if self.process.stderr else ""
        self.stop()
        raise RuntimeError(f"nginx did not start on port {self.port}: {error}")

    @property
    def errors(self) -> str:
        """nginx's error log so far."""
        log = self.directory / "error.log"
        return log.read_text() if log.exists() else ""

    def stop(self) -> None:
        """Stop nginx at once."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self.process = None


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


def relay_process(*args: str, name: str = "relay") -> ServiceProcess:
    """A ``python -m token_relay`` process with ``args``."""
    return ServiceProcess("token_relay", *args, name=name)


class Proxy:
    """Listens on a free port and pipes each connection to ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._frozen: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """The WebSocket base URL to give clients instead of the relay's."""
        return f"ws://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def cut(self) -> int:
        """Drop every connection abruptly (no close frame, as a network failure would)."""
        pairs = list(self._pairs)
        for client, upstream in pairs:
            for writer in (client, upstream):
                writer.transport.abort()
        self._pairs.clear()
        self._frozen.clear()
        self.cuts += 1
        return len(pairs)

    def freeze(self) -> int:
        """Stop every open connection's bytes both ways, leaving it open: a network path
        that went dead without a reset. New connections pass as before."""
        self._frozen |= self._pairs
        return len(self._pairs)

    def _ports(self) -> list[int]:
        """The ports to try for a new connection, in order."""
        return [self.target_port]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for port in self._ports():
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            pair = (writer, up_writer)
            self._pairs.add(pair)
            for source, sink in ((reader, up_writer), (up_reader, writer)):
                task = asyncio.create_task(self._pipe(source, sink, pair))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return
        writer.transport.abort()  # no backend answers

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await source.read(65536):
                if pair in self._frozen:
                    continue  # lost on the way
                sink.write(data)
                await sink.drain()
        self._pairs.discard(pair)
        self._frozen.discard(pair)
        with contextlib.suppress(Exception):
            sink.close()


class Balancer(Proxy):
    """A load balancer for tests: each new connection goes to the next backend that answers.

    ``backends`` may be changed at any time (a rolling restart replaces them one by one);
    :meth:`cut` is inherited, so it can also drop every connection at once.
    """

    def __init__(self, backends: list[int]) -> None:
        super().__init__(backends[0])
        self.backends = list(backends)
        self._next = 0

    def _ports(self) -> list[int]:
        start = self._next
        self._next += 1  # before any await: connections arriving together spread out
        count = len(self.backends)
        return [self.backends[(start + attempt) % count] for attempt in range(count * 2)]


@dataclasses.dataclass(frozen=True)
class Received:
    """One POST a :class:`WebhookReceiver` got, and what it answered."""

    headers: dict[str, str]
    body: bytes
    status: int
    """The status answered; 0 if the receiver stalled and dropped the connection."""
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


class WebhookReceiver:
    """A real HTTP server taking webhook POSTs, on a thread of its own.

    ``answer(n, body)`` decides each answer (``n`` counts POSTs from 0): an HTTP status,
    or a negative number of seconds to stall before dropping the connection unanswered.
    """

    def __init__(self, answer: Callable[[int, bytes], float] | None = None) -> None:
        self.answer: Callable[[int, bytes], float] = answer or (lambda n, body: 200)
        self.received: list[Received] = []
        self.posts = 0
        """POSTs that arrived (a stalled one is in ``received`` only once it ends)."""
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if len(body) < length:  # the sender died mid-request: nothing arrived
                    self.close_connection = True
                    return
                with receiver._lock:
                    n = receiver.posts
                    receiver.posts += 1
                    decision = receiver.answer(n, body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                if decision < 0:
                    time.sleep(-decision)
                    with receiver._lock:
                        receiver.received.append(Received(headers, body, 0, time.time()))
                    self.close_connection = True
                    return
                status = int(decision)
                with receiver._lock:
                    receiver.received.append(Received(headers, body, status, time.time()))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def delivered(self) -> list[Any]:
        """The payloads answered with a 2xx, in arrival order."""
        with self._lock:
            return [r.json() for r in self.received if 200 <= r.status < 300]

    def unique(self) -> list[Any]:
        """The delivered payloads, once each by ``webhook-id``, in first-arrival order."""
        seen: set[str] = set()
        out: list[Any] = []
        with self._lock:
            for r in self.received:
                if 200 <= r.status < 300 and r.headers["webhook-id"] not in seen:
                    seen.add(r.headers["webhook-id"])
                    out.append(r.json())
        return out
