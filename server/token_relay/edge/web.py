"""Serve a folder of static files (the demo page and browser client) over plain HTTP.

Files are read once, at start-up, from one folder and its sub-folders (a linked folder
included, as the demo links the JS package's files): nothing is read per request, so no
request can reach outside what was read. ``/`` serves ``index.html``. At most
``MAX_FILES`` files of ``MAX_FILE_BYTES`` each, ``MAX_DEPTH`` folders deep, are kept;
other files are not served.
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import ConfigError

__all__ = ["StaticFiles"]

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
}

MAX_FILE_BYTES = 1024 * 1024
MAX_FILES = 256
MAX_DEPTH = 4


class StaticFiles:
    """The files of one folder tree, held in memory, keyed by URL path."""

    def __init__(self, root: Path) -> None:
        if not root.is_dir():
            raise ConfigError(f"--web-root {str(root)!r} is not a folder")
        self.files: dict[str, tuple[str, bytes]] = {}
        self._read(root, "/", 0)
        if "/index.html" in self.files:
            self.files["/"] = self.files["/index.html"]

    def _read(self, folder: Path, prefix: str, depth: int) -> None:
        for path in sorted(folder.iterdir()):
            if len(self.files) >= MAX_FILES or path.name.startswith("."):
                continue
            if path.is_dir():
                if depth < MAX_DEPTH:
                    self._read(path, f"{prefix}{path.name}/", depth + 1)
                continue
            content_type = CONTENT_TYPES.get(path.suffix)
            if content_type is None or not path.is_file():
                continue
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            self.files[prefix + path.name] = (content_type, path.read_bytes())
