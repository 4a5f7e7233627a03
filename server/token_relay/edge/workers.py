"""Serving: one relay process until a signal, or several sharing one port (``--workers N``).

A lone process announces its URLs itself. With ``--workers N`` a supervisor reserves
the port (``SO_REUSEPORT``), starts N worker processes that each run a relay on it,
announces once they all listen, and passes SIGTERM and SIGINT on. A worker that dies
any other way (a crash, SIGKILL, the OOM killer) is logged and started again, at most
once per :data:`RESTART_SECONDS` each. A worker asks Linux to stop it if its
supervisor dies, so none is ever orphaned. The workers share a folder for their
metrics (see :mod:`token_relay.edge.metrics`), removed when the supervisor ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import dataclasses
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..core.settings import Settings
from .logs import configure as configure_logs
from .relay import PRODUCE_PATH, SUBSCRIBE_PATH, Relay

__all__ = ["freeze_start", "loop_factory", "run", "run_workers"]

log = logging.getLogger("token_relay")

PR_SET_PDEATHSIG = 1

RESTART_SECONDS = 1.0
"""The least time between two starts of one worker: a worker that keeps dying is not
started in a tight loop."""


def _announce(host: str, port: int, workers: int, web_root: str) -> None:
    display = f"[{host}]" if ":" in host else host
    log.info(
        "token-relay listening on port %d: producers ws://%s:%d%s, subscribers ws://%s:%d%s%s",
        port,
        display,
        port,
        PRODUCE_PATH,
        display,
        port,
        SUBSCRIBE_PATH,
        f" ({workers} worker processes)" if workers > 1 else "",
    )
    if web_root:
        log.info("token-relay serving the page in %s: open http://%s:%d/", web_root, display, port)


async def run(relay: Relay, ready: Any = None) -> None:
    """Serve until SIGINT or SIGTERM, then close every connection with 1001.

    A worker process reports to its supervisor through ``ready`` once it listens;
    a lone process announces its URLs itself.
    """
    relay.metrics.gc_frozen.set(freeze_start())
    server = await relay.start()
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    if ready is None:
        host, port = server.sockets[0].getsockname()[:2]
        _announce(host, port, 1, relay.settings.web_root)
    else:
        ready.put(os.getpid())
    closed = asyncio.ensure_future(server.wait_closed())
    signalled = asyncio.ensure_future(stopping.wait())
    await asyncio.wait([closed, signalled], return_when=asyncio.FIRST_COMPLETED)
    signalled.cancel()
    await relay.stop()
    closed.cancel()
    log.info("token-relay stopped")


def freeze_start() -> int:
    """Take what the process holds so far (its modules, classes, settings, the relay's
    structures) out of the cyclic garbage collector's sight, for good; how many objects.

    Every full collection scans every tracked object. Without this, each one scanned the
    tens of thousands the process made to start, for as long as it lives: a pause of tens
    of milliseconds each time, and most of the collector's share of the relay's CPU. What
    is frozen is never collected as a cycle, so the garbage there is collected first; what
    the relay makes from here on (connections, messages) is collected as before.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _die_with_parent() -> None:
    """Ask Linux to stop this worker if its supervisor dies, so no worker is orphaned."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _worker(settings: Settings, ready: Any, metrics: str, number: int) -> None:
    """One of several processes sharing the port."""
    _die_with_parent()
    configure_logs(settings.log_format)
    with (
        contextlib.suppress(KeyboardInterrupt),
        asyncio.Runner(loop_factory=loop_factory(settings)) as runner,
    ):
        relay = Relay(settings)
        relay.metrics.share(Path(metrics), number)
        runner.run(run(relay, ready))


def run_workers(settings: Settings) -> int:
    """Start ``settings.workers`` processes on one port (SO_REUSEPORT) and supervise them."""
    # Reserve the port here, so that with --port 0 every worker binds the same one.
    reservation = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET)
    reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    reservation.bind((settings.host, settings.port))
    port = reservation.getsockname()[1]
    shared = dataclasses.replace(settings, port=port)
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    with tempfile.TemporaryDirectory(prefix="token-relay-metrics-") as metrics:

        def start(number: int) -> multiprocessing.process.BaseProcess:
            (Path(metrics) / f"worker-{number}.prom").unlink(missing_ok=True)
            worker = context.Process(
                target=_worker, args=(shared, ready, metrics, number), name=f"relay-worker-{number}"
            )
            worker.start()
            log.info(
                "worker %d started (pid %s)",
                number,
                worker.pid,
                extra={"event": "worker_start", "worker": number, "pid": worker.pid},
            )
            return worker

        workers = [start(number) for number in range(settings.workers)]
        started_at = [time.monotonic()] * len(workers)
        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True
            for worker in workers:
                if worker.pid is not None and worker.is_alive():
                    worker.terminate()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        started = 0
        while started < len(workers) and not stopping:
            try:
                ready.get(timeout=0.2)
                started += 1
            except queue.Empty:
                if any(not worker.is_alive() for worker in workers):
                    log.error("a worker process exited while starting")
                    stop(signal.SIGTERM, None)
        if not stopping:
            _announce(settings.host, port, settings.workers, settings.web_root)
        while not stopping:
            multiprocessing.connection.wait([w.sentinel for w in workers], timeout=0.5)
            for number, worker in enumerate(workers):
                if stopping or worker.is_alive():
                    continue
                if time.monotonic() - started_at[number] < RESTART_SECONDS:
                    continue  # it died at once: wait a little before the next try
                log.error(
                    "worker %d (pid %s) exited with %s; starting it again",
                    number,
                    worker.pid,
                    _exit_status(worker.exitcode),
                    extra={
                        "event": "worker_restart",
                        "worker": number,
                        "pid": worker.pid,
                        "exitcode": worker.exitcode,
                    },
                )
                workers[number] = start(number)
                started_at[number] = time.monotonic()
        for worker in workers:
            worker.join()
        with contextlib.suppress(queue.Empty, OSError, ValueError):
            while True:
                ready.get_nowait()
    reservation.close()
    failed = [worker.exitcode for worker in workers if worker.exitcode not in (0, -signal.SIGTERM)]
    log.info("token-relay stopped")
    return 1 if failed or started < len(workers) else 0


def _exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
    return f"exit code {code}"


def loop_factory(settings: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``--loop`` asks for; uvloop is imported only then."""
    if settings.loop != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        raise ConfigError("--loop uvloop needs uvloop: pip install 'token-relay[fast]'") from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
