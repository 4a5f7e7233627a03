"""Small facts about the machine (a free port, a process's memory and CPU time), and
:func:`eventually`, which polls a condition until it holds."""

from __future__ import annotations

import asyncio
import collections
import os
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

START_TIMEOUT = 15.0
"""Seconds a server started by the harness has to be ready."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


PORTS_KEPT = 4096
"""Ports :func:`free_port` handed out that it does not hand out again, the most recent."""
_handed: collections.deque[int] = collections.deque(maxlen=PORTS_KEPT)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now, and that this process was
    not handed lately: two ports asked for before either is bound are never the same one
    (the system may offer a port again as soon as its probe is closed)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        if port not in _handed:
            _handed.append(port)
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
