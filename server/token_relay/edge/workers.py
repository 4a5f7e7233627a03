"""Serving: one relay process until a signal, or several sharing one port (``--workers N``).

A lone process announces its URLs itself. With ``--workers N`` a supervisor reserves
the port (``SO_REUSEPORT``), starts N worker processes that each run a relay on it,
announces once they all listen, and passes SIGTERM and SIGINT on. A worker asks
Linux to stop it if its supervisor dies, so none is ever orphaned.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import dataclasses
import logging
import multiprocessing
import os
import queue
import signal
import socket
from collections.abc import Callable
from typing import Any

from ..core.errors import ConfigError
from ..core.settings import Settings
from .logs import configure as configure_logs
from .relay import PRODUCE_PATH, SUBSCRIBE_PATH, Relay

__all__ = ["loop_factory", "run", "run_workers"]

log = logging.getLogger("token_relay")

PR_SET_PDEATHSIG = 1


def _announce(host: str, port: int, workers: int) -> None:
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


async def run(relay: Relay, ready: Any = None) -> None:
    """Serve until SIGINT or SIGTERM, then close every connection with 1001.

    A worker process reports to its supervisor through ``ready`` once it listens;
    a lone process announces its URLs itself.
    """
    server = await relay.start()
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    if ready is None:
        host, port = server.sockets[0].getsockname()[:2]
        _announce(host, port, 1)
    else:
        ready.put(os.getpid())
    closed = asyncio.ensure_future(server.wait_closed())
    signalled = asyncio.ensure_future(stopping.wait())
    await asyncio.wait([closed, signalled], return_when=asyncio.FIRST_COMPLETED)
    signalled.cancel()
    log.info("token-relay stopping: aborting messages in progress, closing connections")
    await relay.stop()
    closed.cancel()
    log.info("token-relay stopped")


def _die_with_parent() -> None:
    """Ask Linux to stop this worker if its supervisor dies, so no worker is orphaned."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _worker(settings: Settings, ready: Any) -> None:
    """One of several processes sharing the port."""
    _die_with_parent()
    configure_logs(settings.log_format)
    with (
        contextlib.suppress(KeyboardInterrupt),
        asyncio.Runner(loop_factory=loop_factory(settings)) as runner,
    ):
        runner.run(run(Relay(settings), ready))


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
    workers = [
        context.Process(target=_worker, args=(shared, ready), name=f"relay-worker-{n}")
        for n in range(settings.workers)
    ]
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.pid is not None and worker.is_alive():
                worker.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for worker in workers:
        worker.start()
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
        _announce(settings.host, port, settings.workers)
    for worker in workers:
        worker.join()
    reservation.close()
    failed = [worker.exitcode for worker in workers if worker.exitcode not in (0, -signal.SIGTERM)]
    log.info("token-relay stopped")
    return 1 if failed or started < len(workers) else 0


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
