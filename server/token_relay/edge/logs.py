"""Log output: plain lines or one JSON object per line (``--log-format json``), and the
budget of lines a peer's refusals may write."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from ..core.ratelimit import KeyedBuckets, TokenBucket

__all__ = ["RefusalLog", "configure"]

REFUSAL_LINES_PER_SECOND = 1.0
"""Refusal lines logged per second for one client address, after a burst of
:data:`REFUSAL_BURST`."""
REFUSAL_BURST = 10
ALL_REFUSAL_LINES_PER_SECOND = 50.0
"""Refusal lines logged per second for every address together, after a burst of
:data:`ALL_REFUSAL_BURST`."""
ALL_REFUSAL_BURST = 200
MAX_REFUSING_ADDRESSES = 4096
"""Addresses whose refusal budget is kept; past that the least recently refused is forgotten."""


class RefusalLog:
    """Which refusals are logged: one line per refused request or socket, within a budget
    per client address (and one for all of them), so a flood of bad requests writes a
    bounded number of lines. A line says how many of that address's refusals were left out
    since its last one (``suppressed``); the metrics count every refusal."""

    def __init__(self) -> None:
        now = time.monotonic()
        overall = TokenBucket(ALL_REFUSAL_LINES_PER_SECOND, ALL_REFUSAL_BURST, now)
        self.buckets = KeyedBuckets(
            REFUSAL_LINES_PER_SECOND, REFUSAL_BURST, overall, MAX_REFUSING_ADDRESSES, now
        )

    def log(
        self,
        address: str,
        message: str,
        *args: object,
        level: int = logging.INFO,
        exc_info: bool = False,
        **fields: object,
    ) -> None:
        """Log ``message % args`` with ``fields``, if ``address`` is within budget."""
        suppressed = self.buckets.take(address, time.monotonic())
        if suppressed is None:
            return
        more = f" (and {suppressed} more from this address left out)" if suppressed else ""
        logging.getLogger("token_relay").log(
            level,
            message + "%s",
            *args,
            more,
            exc_info=exc_info,
            extra={"event": "refused", "peer": address, **fields, "suppressed": suppressed},
        )


# Attributes every LogRecord has; anything else was passed as ``extra=`` and is a field.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message and any ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(log_format: str) -> None:
    """Send INFO and above to stderr in ``plain`` or ``json`` format."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
