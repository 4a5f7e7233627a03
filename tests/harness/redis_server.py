"""A private ``redis-server`` on a free port, with no persistence, that a test can kill and
start again (a restart loses everything, as a crash would)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from .machine import START_TIMEOUT, free_port


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
