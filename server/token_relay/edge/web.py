"""Serve a folder of static files (the demo page and browser client) over plain HTTP.

Files are read once, at start-up, from the top level of one folder: no
sub-folders, no path traversal, nothing read per request. ``/`` serves
``index.html``.
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


class StaticFiles:
    """The files of one folder, held in memory, keyed by URL path."""

    def __init__(self, root: Path) -> None:
        if not root.is_dir():
            raise ConfigError(f"--web-root {str(root)!r} is not a folder")
        self.files: dict[str, tuple[str, bytes]] = {}
        for path in sorted(root.iterdir()):
            content_type = CONTENT_TYPES.get(path.suffix)
            if content_type is None or not path.is_file():
                continue
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            self.files["/" + path.name] = (content_type, path.read_bytes())
        if "/index.html" in self.files:
            self.files["/"] = self.files["/index.html"]
