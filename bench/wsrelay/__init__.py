"""The Node ``ws`` relay, the WebSocket peer: ``relay.mjs`` on the ``ws`` package pinned in
``package.json``. :func:`install` runs ``npm ci`` here once; ``python -m bench.wsrelay --port
N`` then runs it in place of its own process (so that its pid is Node's), as
:class:`tests.harness.ServiceProcess` starts the other peers.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

from ..wire import BenchError

DIRECTORY = Path(__file__).parent


async def install() -> None:
    """``npm ci`` in ``bench/wsrelay``, unless ``ws`` is already installed there."""
    if (DIRECTORY / "node_modules" / "ws" / "package.json").is_file():
        return
    if shutil.which("node") is None or (npm := shutil.which("npm")) is None:
        raise BenchError("the Node ws relay needs Node.js (node and npm on PATH)")
    process = await asyncio.create_subprocess_exec(
        npm, "ci", "--no-audit", "--no-fund", cwd=DIRECTORY,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await process.communicate()
    if process.returncode:
        raise BenchError(f"npm ci in bench/wsrelay failed:\n{output.decode()}")
