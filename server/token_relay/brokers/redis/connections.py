"""The broker's connections to Redis: a pool for commands, the writer's own pool of one,
and the Lua scripts loaded there."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis

from ...core.errors import BrokerUnavailable
from .packing import PACKING
from .scripts import SCRIPTS

__all__ = ["COMMAND_TIMEOUT", "DOWN", "MAX_CONNECTIONS", "Connections"]

MAX_CONNECTIONS = 64
"""Connections to Redis per process; a command waits for a free one (up to 5 s)."""
COMMAND_TIMEOUT = 5.0
"""Seconds a command, or the writer's whole pipeline, may take before Redis counts as hung."""
DOWN = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)
"""The errors that say Redis is out of reach (rather than that it refused a command)."""


def connect(url: str, connections: int, timeout: float | None) -> BlockingConnectionPool:
    """A pool of connections to Redis, packing commands with hiredis; ``timeout`` is
    each reply's (None: the caller times the whole exchange)."""
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=connections,
        timeout=5,
        socket_timeout=timeout,
        socket_connect_timeout=2,
        retry_on_error=[],
    )
    pool.connection_class = PACKING.get(pool.connection_class, pool.connection_class)
    return pool


class Connections:
    """The pools to one Redis server, and the SHA of each script loaded there."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pool: BlockingConnectionPool | None = None
        self.redis: Redis | None = None
        self.writes: BlockingConnectionPool | None = None
        """The writer's own pool of one connection, which it holds (see
        :class:`~token_relay.brokers.redis.pipeline.Pipeline`)."""
        self.shas: dict[str, str] = {}

    def open(self) -> None:
        """Make the pools; they connect on use."""
        self.pool = connect(self.url, MAX_CONNECTIONS, COMMAND_TIMEOUT)
        self.redis = Redis(connection_pool=self.pool)
        # The writer runs one pipeline at a time (a retry after NOSCRIPT included).
        self.writes = connect(self.url, 1, None)

    async def close(self) -> None:
        """Disconnect every pool, each within 2 s."""
        for closing in (
            self.redis.aclose() if self.redis is not None else None,
            self.pool.disconnect() if self.pool is not None else None,
            self.writes.disconnect() if self.writes is not None else None,
        ):
            if closing is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(closing, 2)

    def client(self) -> Redis:
        """The client over the command pool."""
        if self.redis is None:
            raise BrokerUnavailable("the broker is not started")
        return self.redis

    async def ready(self) -> bool:
        """Ping Redis."""
        try:
            await self.client().ping()
        except DOWN:
            return False
        return True

    async def load_scripts(self) -> None:
        """Load every script (again, after Redis forgot them)."""
        redis = self.client()
        for name, source in SCRIPTS.items():
            self.shas[name] = await redis.script_load(source)

    async def run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """Run a loaded script, loading the scripts again if Redis forgot them."""
        redis = self.client()
        if script not in self.shas:
            raise BrokerUnavailable("Redis is unreachable")
        try:
            return await redis.evalsha(self.shas[script], len(keys), *keys, *args)
        except redis_errors.NoScriptError:
            await self.load_scripts()
            return await redis.evalsha(self.shas[script], len(keys), *keys, *args)
