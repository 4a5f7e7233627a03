"""A real ``nginx`` running a deployment's configuration (the repository's
``deploy/nginx.conf``), on a free port, in front of relays."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

from .machine import START_TIMEOUT, free_port


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
