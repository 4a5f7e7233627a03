"""Pinned npm packages for the tests: a folder of ``package.json`` (and its lockfile) copied
and installed, so Node runs real clients and suites from the JavaScript ecosystem."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["npm_installed"]

NPM_SECONDS = 300.0
"""How long one install may take (npm reaches the registry)."""


def npm_installed(source: Path, folder: Path, command: str = "ci") -> Path:
    """``source``'s files copied into ``folder``, with their packages installed by
    ``npm COMMAND`` (``ci``: exactly the lockfile's); returns ``folder``."""
    npm = shutil.which("npm")
    assert npm is not None, "these tests need Node and npm (scripts/test installs nodejs)"
    for path in source.iterdir():
        if path.is_file():
            shutil.copy(path, folder / path.name)
    subprocess.run(
        [npm, command, "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=folder,
        check=True,
        timeout=NPM_SECONDS,
    )
    return folder
