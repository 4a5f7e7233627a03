"""What both clients share: URLs, backoff with jitter, and a connection run in the background."""

from __future__ import annotations

import asyncio
import contextlib
import random
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self
from urllib.parse import urlencode

__all__ = ["Background", "Backoff", "relay_url"]


def relay_url(base: str, path: str, **params: str | None) -> str:
    """``base`` + ``path``, with the parameters that have a value as the query string."""
    query = urlencode({name: value for name, value in params.items() if value})
    return f"{base.rstrip('/')}{path}" + (f"?{query}" if query else "")


class Backoff:
    """Exponential backoff with jitter: half the delay, plus up to half again at random."""

    def __init__(self, initial: float, ceiling: float) -> None:
        self.initial, self.ceiling, self.attempt = initial, ceiling, 0

    def reset(self) -> None:
        """Start again from the initial delay."""
        self.attempt = 0

    async def wait(self) -> None:
        """Sleep for the next delay."""
        delay = min(self.ceiling, self.initial * 2**self.attempt)
        self.attempt += 1
        await asyncio.sleep(delay / 2 + random.random() * delay / 2)


class Background(ABC):
    """A client whose connection lives in a background task, restarted after each drop."""

    _runner: asyncio.Task[None] | None = None

    def __init__(self) -> None:
        self._started = asyncio.Event()

    @abstractmethod
    async def _run(self) -> None:
        """Connect, serve, and reconnect after each drop, until cancelled."""

    async def __aenter__(self) -> Self:
        self._runner = asyncio.create_task(self._run())
        await asyncio.wait_for(self._started.wait(), 30)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the background task and its connection."""
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
