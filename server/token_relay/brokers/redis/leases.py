"""Leases: each process holds one while it runs; the sessions of a process whose lease
lapsed are reaped by another, which aborts what their producers did not resume."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pydantic import MISSING
from redis import exceptions as redis_errors

from ...core.errors import BrokerUnavailable
from ...core.parts import MessageParts
from ...core.protocol import Aborted, AbortReason, encode_unpositioned
from ...core.sessions import replay
from ...core.settings import Settings
from .connections import DOWN, Connections
from .health import Health
from .keys import INSTANCES, KEY_TTL, key, session_keys, text
from .partlog import PartLog, read_value
from .pipeline import Pipeline
from .writes import Target, Write

__all__ = ["Leases", "identity"]

log = logging.getLogger("token_relay.redis")


class TerminalWrites(Protocol):
    """Builds the TERMINAL write of a message's frame (the broker's, which knows which
    channels' webhooks take it)."""

    def __call__(
        self,
        target: Target,
        body: str,
        done: asyncio.Future[Any] | None,
        seq: int = 0,
        aborted: bool = False,
        strict: int = 0,
        producer: str = "",
    ) -> Write: ...


def identity(grant: str, settings: Settings) -> str:
    """A session's producer identity for its webhooks, from the grant key it was saved
    with (``[role, channels]``); "" without auth."""
    if settings.open_access or not grant:
        return ""
    try:
        role, channels = json.loads(grant)
    except ValueError:
        return ""
    return json.dumps({"role": role, "channels": channels})


class Leases:
    """This process's lease (``tr:lease:INSTANCE``), and the reaping of the others'."""

    def __init__(
        self,
        connections: Connections,
        health: Health,
        pipeline: Pipeline,
        settings: Settings,
        instance: str,
        terminal_write: TerminalWrites,
        reap_requests: Callable[[str], Awaitable[None]],
    ) -> None:
        self._connections = connections
        self._health = health
        self._pipeline = pipeline
        self._settings = settings
        self._instance = instance
        self._terminal_write = terminal_write
        self._reap_requests = reap_requests
        self._lease = settings.lease_seconds
        self.leaving = False
        """This process handed its sessions over: it holds no lease and reaps nothing."""

    async def leave(self) -> None:
        """Give the lease up, marked as leaving (not lost)."""
        with contextlib.suppress(*DOWN, redis_errors.RedisError):
            pipe = self._connections.client().pipeline(transaction=True)
            pipe.set(key("leaving", self._instance), 1, ex=KEY_TTL)
            pipe.delete(key("lease", self._instance))
            await pipe.execute()
        self.leaving = True

    async def lease_forever(self) -> None:
        """Hold this process's lease; reap the sessions of processes whose lease lapsed."""
        lapsed: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        instance = self._instance
        while not self._health.closing:
            try:
                redis = self._connections.client()
                if not self.leaving:
                    pipe = redis.pipeline(transaction=False)
                    pipe.set(key("lease", instance), 1, px=int(self._lease * 1000))
                    pipe.sadd(INSTANCES, instance)
                    await pipe.execute()
                now = loop.time()
                for raw in await redis.smembers(INSTANCES):
                    other = text(raw)
                    if other == instance or await redis.exists(key("lease", other)):
                        lapsed.pop(other, None)
                        continue
                    since = lapsed.setdefault(other, now)
                    if now - since >= self._settings.session_grace and not self.leaving:
                        if await redis.set(key("reap", other), instance, nx=True, ex=60):
                            await self._reap(other)
                        lapsed.pop(other, None)
            except asyncio.CancelledError:
                raise
            except (*DOWN, redis_errors.RedisError, BrokerUnavailable) as exc:
                self._health.suspect()
                log.info("lease round failed (%s)", exc)
            await asyncio.sleep(self._lease / 3)

    async def _reap(self, instance: str) -> None:
        """Abort, once, what a gone process's sessions left unfinished, then forget them."""
        redis = self._connections.client()
        leaving = bool(await redis.exists(key("leaving", instance)))
        reason = AbortReason.SHUTDOWN if leaving else AbortReason.RELAY_LOST
        aborted = 0
        for raw_token in await redis.smembers(key("sessions", instance)):
            token = text(raw_token)
            session = await redis.hgetall(key("session", token))
            values = {text(k): text(v) for k, v in session.items()}
            owner = values.get("owner")
            if owner is None or values.get("instance") != instance:
                continue  # resumed elsewhere meanwhile
            producer = identity(values.get("grant", ""), self._settings)
            messages = await redis.hgetall(key("msg", owner))
            kept = await redis.hgetall(key("meta", owner))
            metas = {text(k): text(v) for k, v in kept.items()}
            for raw_id, raw_value in messages.items():
                message_id = text(raw_id)
                seq, _, channel = text(raw_value).partition("|")
                kept_text = await redis.get(key("text", f"{owner}|{message_id}"))
                so_far, parts = _so_far(kept_text)
                body = encode_unpositioned(
                    Aborted(
                        channel=channel,
                        id=message_id,
                        text=so_far,
                        parts=MISSING if parts is None else parts,
                        reason=reason,
                        meta=json.loads(metas[message_id]) if message_id in metas else MISSING,
                        offset=0,
                        epoch="",
                    )
                )
                done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                target: Target = (channel, owner, message_id)
                self._pipeline.put(
                    self._terminal_write(
                        target, body, done, int(seq), True, strict=1, producer=producer
                    )
                )
                with contextlib.suppress(BrokerUnavailable):
                    if not isinstance(await done, int):
                        aborted += 1
            await redis.delete(*session_keys(token, owner))
        await self._reap_requests(instance)
        await redis.delete(key("sessions", instance), key("leaving", instance))
        await redis.srem(INSTANCES, instance)
        log.warning(
            "relay %s is gone (%s): aborted %d messages its producers did not resume",
            instance,
            "left" if leaving else "lease lapsed",
            aborted,
        )


def _so_far(value: bytes | str | None) -> tuple[str, list[dict[str, Any]] | None]:
    """The text, and parts if it is structured, of a message from its ``tr:text:`` value:
    a structured one's parts are rebuilt from its log (none if the log was cut)."""
    if value is None or isinstance(value, str):
        return value or "", None
    kept = read_value(value)
    if not isinstance(kept, PartLog):
        return kept, None
    parts = None if kept.cut else replay(MessageParts(), kept.text, (kept.implicit, kept.entries))
    if parts is None:
        return kept.text, None
    return parts.text(), parts.parts()
