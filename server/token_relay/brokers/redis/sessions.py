"""Producer sessions in Redis: saved by the process that opened them, taken over by any
process a producer resumes on, forgotten when they end."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from redis import exceptions as redis_errors

from ...core.errors import BrokerUnavailable
from ...core.sessions import SessionState
from .connections import DOWN, Connections
from .health import Health
from .keys import KEY_TTL, key, session_keys, text
from .partlog import PartLog, read_value
from .pipeline import Pipeline

__all__ = ["Sessions"]


class Sessions:
    """The sessions of one process (``tr:sessions:INSTANCE``, ``tr:session:TOKEN``)."""

    def __init__(
        self,
        connections: Connections,
        health: Health,
        pipeline: Pipeline,
        instance: str,
        text_ttl: int,
    ) -> None:
        self._connections = connections
        self._health = health
        self._pipeline = pipeline
        self._instance = instance
        self._text_ttl = text_ttl

    async def save(self, token: str, owner: str, grant: str) -> None:
        """Record a new session, so that any process can take it over."""
        try:
            pipe = self._connections.client().pipeline(transaction=True)
            pipe.hset(key("session", token), mapping={
                "owner": owner, "instance": self._instance, "grant": grant,
            })  # fmt: skip
            pipe.expire(key("session", token), KEY_TTL)
            pipe.sadd(key("sessions", self._instance), token)
            await pipe.execute()
        except (*DOWN, redis_errors.RedisError) as exc:
            self._health.suspect()
            raise BrokerUnavailable(str(exc)) from None

    async def take(self, token: str, grant: str, owner: str) -> SessionState | None:
        """Move a session to ``owner`` on this process; None if there is none to take.

        The process that had it is told, so it lets go of it without aborting anything.
        """
        await self._pipeline.flush_writes()
        try:
            reply = await self._connections.run(
                "take",
                [key("session", token)],
                [owner, self._instance, grant, self._text_ttl, KEY_TTL, token],
            )
        except (*DOWN, redis_errors.RedisError) as exc:
            self._health.suspect()
            raise BrokerUnavailable(str(exc)) from None
        if not reply:
            return None
        raw_owner, raw_instance, flat, ended_flat = reply
        old_owner, old_instance = text(raw_owner), text(raw_instance)
        streaming = []
        logs: dict[str, tuple[bool, list[Any]] | None] = {}
        for index in range(0, len(flat), 3):
            message_id = text(flat[index])
            seq, _, channel = text(flat[index + 1]).partition("|")
            so_far = read_value(flat[index + 2])
            if isinstance(so_far, PartLog):
                logs[message_id] = None if so_far.cut else (so_far.implicit, so_far.entries)
                so_far = so_far.text
            streaming.append((message_id, channel, int(seq), so_far))
        ended = []
        for index in range(0, len(ended_flat), 2):
            outcome, seq, channel = text(ended_flat[index + 1]).split("|", 2)
            ended.append((text(ended_flat[index]), channel, int(seq), outcome == "a"))
        meta: dict[str, dict[str, Any]] = {}
        client = self._connections.client
        with contextlib.suppress(*DOWN, redis_errors.RedisError, ValueError):
            kept = await client().hgetall(key("meta", old_owner))
            meta = {text(k): json.loads(text(v)) for k, v in kept.items()}
            if kept:
                await client().rename(key("meta", old_owner), key("meta", owner))
        if old_instance and old_instance != self._instance:
            with contextlib.suppress(*DOWN, redis_errors.RedisError):
                await client().publish(key("i", old_instance), f"x|{old_owner}|")
        return SessionState(old_owner, old_instance, streaming, ended, meta, logs)

    async def end(self, token: str, owner: str) -> None:
        """Forget a session that ended here (its aborts are already published)."""
        with contextlib.suppress(*DOWN, redis_errors.RedisError):
            client = self._connections.client()
            await client.delete(*session_keys(token, owner))
            await client.srem(key("sessions", self._instance), token)
