"""Whether Redis answers, kept as a fact by probing it, and the outages seen so far."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis import exceptions as redis_errors

from .connections import DOWN, Connections

__all__ = ["PROBE_EVERY", "PROBE_WHEN_DOWN", "Health"]

log = logging.getLogger("token_relay.redis")

PROBE_EVERY = 1.0
"""Seconds between health probes (PING) while Redis answers."""
PROBE_WHEN_DOWN = 0.2
"""Seconds between health probes while it does not."""


class Health:
    """The broker's link to Redis as its tasks see it: probed up, pub/sub listening, the
    outages seen, and whether the broker is closing (every task's loop ends then)."""

    __slots__ = ("closing", "had_answer", "listening", "outages", "probe_now", "up")

    def __init__(self) -> None:
        self.up = False
        """The last probe (or connect) reached Redis."""
        self.listening = False
        """The pub/sub connection is subscribed and reading."""
        self.had_answer = False
        self.outages = 0
        """Times Redis was seen gone; the writer reconnects after each."""
        self.closing = False
        self.probe_now = asyncio.Event()

    @property
    def healthy(self) -> bool:
        """A fact about Redis, probed: it answers PING and the pub/sub connection is up.

        A failed command does not clear it; it only makes the next probe come at once.
        """
        return self.up and self.listening

    def suspect(self) -> None:
        """A command failed: probe Redis now rather than at the next round."""
        self.probe_now.set()

    def lost_pubsub(self) -> None:
        """The pub/sub connection failed: an outage, and a probe at once."""
        self.listening = False
        self.outages += 1
        self.suspect()

    async def probe_forever(self, connections: Connections) -> None:
        """Keep :attr:`healthy` a fact: PING Redis every second, five times that when down."""
        while not self.closing:
            try:
                async with asyncio.timeout(2):
                    await connections.client().ping()
                up = True
            except (*DOWN, TimeoutError, redis_errors.RedisError):
                up = False
            if not up and self.up:
                self.outages += 1
            if up != self.up and (up is False or self.had_answer):
                log.warning("Redis %s", "answers again" if up else "does not answer")
            self.had_answer = self.had_answer or up
            self.up = up
            self.probe_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.probe_now.wait(), PROBE_EVERY if up else PROBE_WHEN_DOWN
                )
