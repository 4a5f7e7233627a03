"""Relay processes for end-to-end tests: ``python -m server`` started as a real subprocess."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

LISTENING = re.compile(rb"listening on port (\d+): producers (ws://\S+), subscribers (ws://\S+)")


class RelayProcess:
    """One ``python -m server`` process."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.process: asyncio.subprocess.Process | None = None
        self.port = 0
        self.log = b""

    @property
    def url(self) -> str:
        """The relay's WebSocket base URL."""
        return f"ws://127.0.0.1:{self.port}"

    async def start(self) -> RelayProcess:
        """Start it and wait for the line that names its port."""
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "server",
            "--port",
            "0",
            *self.args,
            stderr=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.process.stderr is not None
        while True:
            line = await asyncio.wait_for(self.process.stderr.readline(), 15)
            assert line, f"relay exited before listening: {self.log!r}"
            self.log += line
            match = LISTENING.search(line)
            if match:
                self.port = int(match.group(1))
                return self

    async def stop(self) -> None:
        """Kill it if it still runs."""
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process is not None and self.process.returncode is None

    async def http_status(self, path: str) -> int:
        """The status code of a plain ``GET path``."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        return int(status_line.split()[1])
