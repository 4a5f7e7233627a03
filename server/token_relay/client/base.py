"""What both clients share: URLs, backoff with jitter, and a connection run in the background."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self
from urllib.parse import urlencode

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from ..core.errors import HandshakeRefused, RelayError

__all__ = ["PERMANENT", "STABLE_AFTER", "Background", "Backoff", "relay_url"]


def relay_url(base: str, path: str, **params: str | None) -> str:
    """``base`` + ``path``, with the parameters that have a value as the query string."""
    query = urlencode({name: value for name, value in params.items() if value})
    return f"{base.rstrip('/')}{path}" + (f"?{query}" if query else "")


log = logging.getLogger("token_relay.client")

STABLE_AFTER = 5.0
"""Seconds a connection must stay up before the backoff starts again from its first delay."""

PERMANENT = frozenset({401, 403, 404})
"""Handshake statuses that retrying cannot change."""


class Backoff:
    """Exponential backoff with jitter: half the delay, plus up to half again at random.

    It starts again from the first delay only once a connection has stayed up for
    :data:`STABLE_AFTER` seconds, so a connection that is dropped at once (a frame
    too big for the client, a proxy that cuts it) does not make a tight loop.
    """

    def __init__(self, initial: float, ceiling: float) -> None:
        self.initial, self.ceiling, self.attempt = initial, ceiling, 0
        self._since: float | None = None

    def reset(self) -> None:
        """Start again from the initial delay."""
        self.attempt = 0

    def connected(self) -> None:
        """A connection opened: note when."""
        self._since = time.monotonic()

    def lost(self) -> None:
        """A connection ended: if it had stayed up long enough, start again from the first delay."""
        if self._since is not None and time.monotonic() - self._since >= STABLE_AFTER:
            self.attempt = 0
        self._since = None

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
        self._fatal: BaseException | None = None
        self._connection: ClientConnection | None = None
        self._closed = False

    url: str
    reconnects: int
    _backoff: Backoff
    _role = "client"

    @abstractmethod
    def _target(self) -> str:
        """The URL to connect to now (it may carry what resumes the last connection)."""

    @abstractmethod
    async def _serve(self, ws: ClientConnection) -> None:
        """Use one connection until it drops."""

    @abstractmethod
    async def _dropped(self) -> None:
        """A connection ended: forget it."""

    @abstractmethod
    def _stopping(self) -> bool:
        """Whether to stop reconnecting."""

    async def _run(self) -> None:
        """Connect, serve, and reconnect with backoff after each drop, until cancelled.

        A handshake refused with a status retrying can't change raises
        :class:`HandshakeRefused`.
        """
        while not self._closed and not self._stopping():
            try:
                # No frame size limit: a completed message of --max-message-chars characters
                # is one frame of up to 6 bytes per character (JSON escapes).
                async with connect(self._target(), max_queue=None, max_size=None) as ws:
                    self._connection = ws
                    self._backoff.connected()
                    try:
                        await self._serve(ws)
                    finally:
                        self._connection = None
            except asyncio.CancelledError:
                raise
            except InvalidStatus as exc:
                if exc.response.status_code in PERMANENT:
                    raise HandshakeRefused(exc.response.status_code, self.url) from None
                log.info("%s connection refused (%s); retrying", self._role, exc)
            except (OSError, ConnectionClosed, TimeoutError, InvalidHandshake) as exc:
                # InvalidHandshake: the connection ended (or a proxy answered nonsense)
                # before the relay's answer to the handshake.
                if not self._closed:
                    log.info("%s connection lost (%s); reconnecting", self._role, exc)
            if self._closed:
                break
            await self._dropped()
            self._backoff.lost()
            self.reconnects += 1
            await self._backoff.wait()

    async def _guarded(self) -> None:
        try:
            await self._run()
        except RelayError as exc:
            self._fatal = exc  # a refusal for good: every waiter raises it
            self._started.set()
            self._on_fatal(exc)

    @abstractmethod
    def _on_fatal(self, exc: BaseException) -> None:
        """Wake whatever waits on the connection with ``exc``."""

    def _raise_if_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    async def __aenter__(self) -> Self:
        self._runner = asyncio.create_task(self._guarded())
        await asyncio.wait_for(self._started.wait(), 30)
        self._raise_if_fatal()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection normally (1000), then stop the background task.

        The close handshake comes first: cancelling the task inside the connection would
        close it with 1011 (internal error), which the relay would log as one.
        """
        self._closed = True
        connection = self._connection
        if connection is not None:
            await connection.close()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
