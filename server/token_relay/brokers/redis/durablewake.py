"""Wakes across relay processes for the durable streams kept in Redis: a pub/sub topic per
stream path (``tr:ds:w:PATH``), subscribed only while a reader here waits on that path.

Every change to a stream publishes on its topic, inside the script that makes it. A reader
that starts watching a path is told so (:meth:`Wakes.watch` returns True once Redis confirmed
the subscription), and reads the stream again before it waits: a change made before the
subscription was heard by nobody here, and is seen then. A reader that asks while another's
subscription to the path is still unconfirmed is told so too, once it is; so is one that asks
while the topics are subscribed again after a reconnect. While Redis is out of reach, every
watched path is woken, so that its readers look again (and are answered 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from .connections import DOWN

__all__ = ["TOPIC_PREFIX", "Wakes"]

log = logging.getLogger("token_relay.redis")

TOPIC_PREFIX = "tr:ds:w:"
MAX_WATCHED = 100_000
"""Paths watched at most per process; past it a reader waits for its timeout (or a change
made here) without hearing changes made elsewhere."""
CONFIRM_TIMEOUT = 5.0


class Wakes:
    """This process's pub/sub connection for the durable streams' topics."""

    def __init__(self, client: Callable[[], Redis], wake: Callable[[str], None]) -> None:
        self._client = client
        self.wake = wake
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._topics: set[str] = set()
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        self._connected: asyncio.Future[None] | None = None
        self.closing = False

    async def watch(self, path: str) -> bool:
        """Subscribe to ``path``'s topic unless it is already: True once Redis confirmed a
        new subscription (or could not be reached: the caller looks again either way).

        A subscription another reader asked for and Redis has not confirmed yet is waited
        for too, and answers True: a change made before Redis subscribed is heard by
        nobody here, so this caller must look again as well."""
        topic = TOPIC_PREFIX + path
        if topic in self._topics:
            pending = self._confirmed.get(topic)
            if pending is None:
                return False
            with contextlib.suppress(TimeoutError, *DOWN, redis_errors.RedisError):
                await asyncio.wait_for(asyncio.shield(pending), CONFIRM_TIMEOUT)
            return True
        if len(self._topics) >= MAX_WATCHED:
            return False
        loop = asyncio.get_running_loop()
        if self._task is None:
            self._connected = loop.create_future()
            self._task = asyncio.create_task(self._read_forever())
        try:
            assert self._connected is not None
            await asyncio.wait_for(asyncio.shield(self._connected), CONFIRM_TIMEOUT)
            waiter = self._confirmed.setdefault(topic, loop.create_future())
            self._topics.add(topic)
            await self._pubsub.subscribe(topic)
            await asyncio.wait_for(asyncio.shield(waiter), CONFIRM_TIMEOUT)
        except (TimeoutError, *DOWN, redis_errors.RedisError):
            self._topics.discard(topic)
            self._confirmed.pop(topic, None)
        return True

    async def unwatch(self, keep: set[str]) -> None:
        """Unsubscribe from every topic but those of ``keep``'s paths."""
        dropped = self._topics - {TOPIC_PREFIX + path for path in keep}
        if not dropped:
            return
        self._topics -= dropped
        with contextlib.suppress(*DOWN, redis_errors.RedisError):
            if self._pubsub is not None:
                await self._pubsub.unsubscribe(*dropped)

    async def close(self) -> None:
        """Stop reading and disconnect."""
        self.closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pubsub.aclose(), 2)

    async def _read_forever(self) -> None:
        backoff = 0.1
        while not self.closing:
            try:
                if self._pubsub is not None:
                    with contextlib.suppress(Exception):
                        await self._pubsub.aclose()
                self._pubsub = self._client().pubsub()
                # Topics watched before a reconnect are unconfirmed again until Redis says
                # so: a reader asking meanwhile waits for it and looks again (see watch).
                loop = asyncio.get_running_loop()
                for topic in self._topics:
                    self._confirmed.setdefault(topic, loop.create_future())
                # The bare prefix is nobody's topic: subscribed to it, the connection is
                # open (and read) even before a reader waits.
                await self._pubsub.subscribe(TOPIC_PREFIX, *self._topics)
                if self._connected is not None and not self._connected.done():
                    self._connected.set_result(None)
                backoff = 0.1
                while not self.closing:
                    message = await self._pubsub.get_message(timeout=None)
                    if message is not None:
                        self._take(message)
            except asyncio.CancelledError:
                raise
            except (*DOWN, redis_errors.RedisError) as exc:
                log.warning("durable streams' pub/sub lost (%s); retrying", exc)
                for waiter in self._confirmed.values():
                    if not waiter.done():
                        waiter.set_exception(redis_errors.ConnectionError(str(exc)))
                        waiter.exception()  # taken: no reader may be waiting on it
                self._confirmed.clear()
                for topic in list(self._topics):
                    self.wake(topic.removeprefix(TOPIC_PREFIX))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _take(self, message: dict[str, Any]) -> None:
        topic = message["channel"]
        topic = topic.decode() if isinstance(topic, bytes) else topic
        if message["type"] == "subscribe":
            waiter = self._confirmed.pop(topic, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        elif message["type"] == "message" and topic != TOPIC_PREFIX:
            self.wake(topic.removeprefix(TOPIC_PREFIX))
