"""The benchmark's one exception: a run that cannot be trusted."""

from __future__ import annotations

__all__ = ["BenchError"]


class BenchError(Exception):
    """A process did not start, a message was wrong or missing, or a case timed out."""
