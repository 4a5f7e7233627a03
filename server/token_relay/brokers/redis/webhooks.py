"""The webhook outbox in Redis: a Stream with a consumer group, delivered by one process.

Keys:

* ``tr:wh`` — the outbox, a Stream. The terminal script adds each frame a webhook takes
  (fields ``c`` channel, ``f`` frame, ``p`` producer identity, ``t`` completion time in
  ms, ``u`` one URL for a revived dead letter) in the same step that gives it its offset,
  so offset order is stream order, and nothing completes without its entry.
* ``tr:wh:bytes`` — the bytes of the entries in it (the outbox's byte bound).
* ``tr:wh:lease`` — which process delivers now: it holds the lease for ``--lease-seconds``
  and renews it three times as often. While it does, it reads the Stream in order through
  the group ``relay`` as the one consumer ``deliverer``, and removes (``XACK``, ``XDEL``)
  each entry once every URL is done with it.
* ``tr:wh:dead`` — the dead letters, a list, newest first, at most ``--webhook-max-dead``
  of them and ``--webhook-max-dead-bytes`` in all; past either the oldest are dropped.
* ``tr:wh:dead:bytes`` — the bytes of the dead letters (counted again from the list if it
  is missing).

When the delivering process dies, its lease lapses and another process takes it: it reads
the consumer's pending entries first (what the dead one read but never settled), then the
new ones, so nothing is lost and a channel's order holds. What was in flight may arrive
twice; receivers dedupe by ``webhook-id``. Redis's own persistence decides what a restart
of Redis loses: the outbox lives in it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from ...core.errors import BrokerUnavailable
from ...core.settings import Settings
from ...core.webhooks import DeadLetter, WebhookEntry
from ..memory import revived_frame
from .connections import DOWN
from .keys import text

__all__ = ["DEAD", "DEAD_BYTES", "GROUP", "LEASE", "OUTBOX", "OUTBOX_BYTES", "RedisWebhooks"]

log = logging.getLogger("token_relay.brokers.redis_webhooks")
"""Named as when this was a module of its own: JSON logs' ``logger`` and filters on it hold."""

OUTBOX = "tr:wh"
OUTBOX_BYTES = "tr:wh:bytes"
LEASE = "tr:wh:lease"
DEAD = "tr:wh:dead"
DEAD_BYTES = "tr:wh:dead:bytes"
GROUP = "relay"
CONSUMER = "deliverer"

Runner = Callable[[str, list[str], list[Any]], Awaitable[Any]]


def _stream_id(key: str) -> tuple[int, int]:
    millis, _, sequence = key.partition("-")
    return int(millis), int(sequence or 0)


class RedisWebhooks:
    """The webhook outbox of a Redis broker (see the module docstring)."""

    def __init__(
        self, settings: Settings, instance: str, client: Callable[[], Redis], run: Runner
    ) -> None:
        self.settings = settings
        self.instance = instance
        self._client = client
        self._run = run
        self.not_queued = 0
        self.active = False
        self._pending: str | None = "0"
        """Where the reading of unsettled entries is, after taking the lease; None once done."""
        self._group_ready = False
        self.depth = 0
        self.dead_count = 0
        self.dead_bytes = 0

    async def take(self, limit: int, wait: float) -> list[WebhookEntry]:
        """Keep the lease (or take it), then read: first the consumer's unsettled entries,
        then new ones, blocking up to ``wait``."""
        try:
            return await self._take(limit, wait)
        except (*DOWN, redis_errors.RedisError) as exc:
            self._lost()
            self._group_ready = False
            raise BrokerUnavailable(str(exc)) from None

    async def _take(self, limit: int, wait: float) -> list[WebhookEntry]:
        lease_ms = int(self.settings.lease_seconds * 1000)
        held = await self._run("webhook_lease", [LEASE], [self.instance, lease_ms])
        redis = self._client()
        self.depth = int(await redis.xlen(OUTBOX))
        self.dead_count = int(await redis.llen(DEAD))
        self.dead_bytes = int(await redis.get(DEAD_BYTES) or 0)
        if not held:
            self._lost()
            return []
        if not self.active or held == 2:
            log.info("this process delivers the webhook outbox now")
            self.active = True
            self._pending = "0"
        if limit <= 0:
            return []
        if not self._group_ready:
            try:
                await redis.xgroup_create(OUTBOX, GROUP, id="0", mkstream=True)
            except redis_errors.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._group_ready = True
        if self._pending is not None:
            # What an earlier deliverer read and never settled, once through, in order.
            reply = await redis.xreadgroup(GROUP, CONSUMER, {OUTBOX: self._pending}, count=limit)
            entries, stale = self._entries(reply)
            for key in stale:  # deleted from the stream, still pending: settle it
                await redis.xack(OUTBOX, GROUP, key)
            keys = [entry.key for entry in entries] + stale
            if keys:
                self._pending = max(keys, key=_stream_id)
                return entries
            self._pending = None
        block = max(1, int(wait * 1000)) if wait > 0 else None
        reply = await redis.xreadgroup(GROUP, CONSUMER, {OUTBOX: ">"}, count=limit, block=block)
        entries, _ = self._entries(reply)
        return entries

    def _entries(self, reply: Any) -> tuple[list[WebhookEntry], list[str]]:
        entries: list[WebhookEntry] = []
        stale: list[str] = []
        for _stream, items in reply or []:
            for raw_key, raw_fields in items:
                key = text(raw_key)
                if not raw_fields:
                    stale.append(key)
                    continue
                values = {text(k): text(v) for k, v in raw_fields.items()}
                entries.append(
                    WebhookEntry(
                        key,
                        values["c"],
                        values["f"],
                        values.get("p", ""),
                        int(values.get("t", "0")) / 1000,
                        values.get("u", ""),
                    )
                )
        return entries, stale

    def _lost(self) -> None:
        if self.active:
            log.info("this process no longer delivers the webhook outbox")
        self.active = False

    async def settle(self, entry: WebhookEntry) -> None:
        """XACK and XDEL the entry, and take its bytes off the count."""
        try:
            await self._run(
                "webhook_settle", [OUTBOX, OUTBOX_BYTES], [GROUP, entry.key, entry.size]
            )
        except (*DOWN, redis_errors.RedisError) as exc:
            raise BrokerUnavailable(str(exc)) from None

    async def bury(self, letter: DeadLetter) -> int:
        settings = self.settings
        try:
            dropped = await self._run(
                "webhook_bury",
                [DEAD, DEAD_BYTES],
                [
                    letter.model_dump_json(),
                    settings.webhook_max_dead,
                    settings.webhook_max_dead_bytes,
                ],
            )
        except (*DOWN, redis_errors.RedisError) as exc:
            raise BrokerUnavailable(str(exc)) from None
        return int(dropped)

    async def dead(self) -> list[DeadLetter]:
        try:
            raw = await self._client().lrange(DEAD, 0, -1)
        except (*DOWN, redis_errors.RedisError) as exc:
            raise BrokerUnavailable(str(exc)) from None
        return [DeadLetter.model_validate_json(item) for item in raw]

    async def revive(self) -> int:
        """Queue every dead letter again, the oldest first, while the outbox has room."""
        revived = 0
        try:
            raw = await self._client().lrange(DEAD, 0, -1)
            for item in reversed(raw):
                letter = DeadLetter.model_validate_json(item)
                frame, producer = revived_frame(letter)
                added = await self._run(
                    "webhook_add",
                    [OUTBOX, OUTBOX_BYTES, DEAD, DEAD_BYTES],
                    [
                        letter.payload.channel,
                        frame,
                        producer,
                        int(time.time() * 1000),
                        letter.url,
                        self.settings.webhook_max_pending,
                        self.settings.webhook_max_pending_bytes,
                        text(item),
                    ],
                )
                if not added:
                    break
                revived += 1
        except (*DOWN, redis_errors.RedisError) as exc:
            raise BrokerUnavailable(str(exc)) from None
        return revived

    async def release(self) -> None:
        """Give the lease up, so another process delivers at once."""
        if not self.active:
            return
        self.active = False
        try:
            redis = self._client()
            if text(await redis.get(LEASE) or b"") == self.instance:
                await redis.delete(LEASE)
        except (*DOWN, redis_errors.RedisError, BrokerUnavailable):
            pass
