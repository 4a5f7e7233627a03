"""Durable Streams subscriptions kept in Redis (``--broker redis://``): every relay process
serves every subscription, its callbacks, acks, claims and releases, and wakes it on an append
made through it.

Theory of operation
-------------------
Subscriptions are a control plane, at a low rate: each operation on them (a control request,
a stream append that concerns one, a webhook's answer, the sweep of retries and leases) reads
them all from ``tr:ds:subs`` (a hash: a subscription's id to its state as JSON,
:func:`~token_relay.core.durablesubs.dump`), applies the core's rules
(:mod:`token_relay.core.durablesubs`), and writes back what changed, all under one lock
(``tr:ds:subs:lock``: ``SET NX PX`` with a token of the operation, for at most
:data:`LOCK_MS`). The write is made only while the lock is still the operation's
(:data:`SAVE`), so two processes never both change the same state. The tails the rules ask
for are read before the rules run, in one script (:data:`TAILS`): those of the streams
linked to the subscriptions the operation concerns.

The signing key (Ed25519) and the wake tokens' HMAC key are made by the first process that
needs them (``HSETNX tr:ds:subs:keys``) and read by every other, so a JWKS and a token check
agree whichever process answers.

An append asks Redis nothing more when there is no subscription: the append's own script
says how many there are (:attr:`~token_relay.brokers.redis.durable.RedisStore.subscribed`).
A webhook is POSTed by the process whose operation started its wake; a retry or a lease that
ran out is handled by whichever process sweeps first.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import secrets
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from ...core.durablesubs import Held, Select, Subscriptions, dump, load
from ...core.errors import StreamRefused
from .durable import RedisStore

__all__ = ["LOCK_MS", "SAVE", "TAILS", "RedisSubscriptions"]

SUBS = "tr:ds:subs"
LOCK = "tr:ds:subs:lock"
KEYS = "tr:ds:subs:keys"
LOCK_MS = 5000
"""How long the lock is held at most (an operation takes a few round trips)."""
LOCK_ATTEMPTS = 1000
"""Tries to take the lock (a few milliseconds apart) before 503 (``stream_busy``)."""
RECHECK = 1.0
"""Seconds between two looks at whether there are subscriptions, when the last said none."""

TAILS = """
local out = {}
for i = 1, #ARGV do
  local id = redis.call('GET', 'tr:ds:p:' .. ARGV[i])
  local state = false
  if id then
    local fields = redis.call('HMGET', 'tr:ds:s:' .. id, 'state', 'deleted')
    if fields[1] and fields[2] ~= '1' then
      state = fields[1]
    end
  end
  out[i] = state or ''
end
return out
"""
"""Each path's stream state (JSON), or ``''`` for no live stream there (``PATH...``)."""

SAVE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local n = tonumber(ARGV[2])
for i = 3, 2 + 2 * n, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
for i = 3 + 2 * n, #ARGV do
  redis.call('HDEL', KEYS[2], ARGV[i])
end
return redis.call('HLEN', KEYS[2])
"""
"""Write the subscriptions that changed and drop those that went, if the lock is still the
operation's (``TOKEN, N, ID, STATE, ... (N pairs), GONE_ID...``); how many there are, or -1."""

UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisSubscriptions:
    """The :class:`~token_relay.edge.durablehooks.SubscriptionState` contract over Redis."""

    def __init__(
        self, store: RedisStore, limit: int, prefix: str, clock: Any = time.monotonic
    ) -> None:
        self.store = store
        self.prefix = prefix
        """The streams' root, before the stream-root-relative paths subscriptions name."""
        self.limit = limit
        self.clock = clock
        self._keys: tuple[bytes, bytes] | None = None
        self._looked = -RECHECK

    async def keys(self) -> tuple[bytes, bytes]:
        """The shared keys, made by the first process that asks."""
        if self._keys is None:
            for field in ("ed25519", "hmac"):
                made = base64.b64encode(secrets.token_bytes(32)).decode()
                await self.store.command("HSETNX", KEYS, field, made)
            ed25519, token = await self.store.command("HMGET", KEYS, "ed25519", "hmac")
            self._keys = (base64.b64decode(ed25519), base64.b64decode(token))
        return self._keys

    async def any(self) -> bool:
        """Whether there were subscriptions at this process's last write, or at its last look
        (at most :data:`RECHECK` seconds ago)."""
        if self.store.subscribed:
            return True
        now = self.clock()
        if now - self._looked >= RECHECK:
            self._looked = now
            self.store.subscribed = int(await self.store.command("HLEN", SUBS)) > 0
        return self.store.subscribed

    def surely_none(self) -> bool:
        """Whether there were none at the last look, and it is not time to look again."""
        return not self.store.subscribed and self.clock() - self._looked < RECHECK

    async def paths(self) -> list[str]:
        """The stream-root-relative paths of every live stream."""
        found: list[str] = []
        cursor: Any = 0
        prefix = "tr:ds:p:" + self.prefix
        while True:
            cursor, keys = await self.store.command(
                "SCAN", cursor, "MATCH", prefix + "*", "COUNT", 1000
            )
            found.extend(_text(key).removeprefix(prefix) for key in keys)
            if int(cursor) == 0:
                break
        tails = await self._tails(set(found))
        return sorted(path for path in set(found) if tails.get(path) is not None)

    async def _tails(self, paths: Iterable[str]) -> dict[str, int]:
        wanted = sorted(set(paths))
        if not wanted:
            return {}
        states = await self.store.script(TAILS, [], [self.prefix + path for path in wanted])
        return {
            path: int(json.loads(state)["tail"])
            for path, state in zip(wanted, map(_text, states), strict=True)
            if state
        }

    @asynccontextmanager
    async def hold(
        self, paths: Iterable[str] = (), select: Select = lambda subscription: True
    ) -> AsyncIterator[Held]:
        """Every subscription, under the lock; what changed is written when the operation
        ends without an exception."""
        hmac_key = (await self.keys())[1]
        token = secrets.token_hex(16)
        await self._lock(token)
        try:
            rows = await self.store.command("HGETALL", SUBS)
            stored = {_text(name): _text(text) for name, text in dict(rows).items()}
            core = Subscriptions(
                key=hmac_key, new_id=lambda: secrets.token_hex(8), limit=self.limit
            )
            bases: dict[str, str] = {}
            for subscription_id, text in stored.items():
                record = json.loads(text)
                core.subscriptions[subscription_id] = load(record["subscription"])
                bases[subscription_id] = record["base"]
            needed = set(paths)
            for subscription in core.subscriptions.values():
                if select(subscription):
                    needed.update(subscription.links)
            tails = await self._tails(needed)
            yield Held(core, bases, tails.get)
            changed: list[str] = []
            for subscription_id, subscription in core.subscriptions.items():
                text = json.dumps(
                    {"base": bases.get(subscription_id, ""), "subscription": dump(subscription)}
                )
                if stored.get(subscription_id) != text:
                    changed += [subscription_id, text]
            gone = [name for name in stored if name not in core.subscriptions]
            if changed or gone:
                held = await self.store.script(
                    SAVE, [LOCK, SUBS], [token, len(changed) // 2, *changed, *gone]
                )
                if int(held) < 0:
                    raise StreamRefused(
                        503, "stream_busy", "the subscriptions change too fast: try again"
                    )
                self.store.subscribed = int(held) > 0
        finally:
            await self.store.script(UNLOCK, [LOCK], [token])

    async def _lock(self, token: str) -> None:
        for _ in range(LOCK_ATTEMPTS):
            if await self.store.command("SET", LOCK, token, "NX", "PX", LOCK_MS):
                return
            await asyncio.sleep(random.uniform(0.002, 0.01))
        raise StreamRefused(503, "stream_busy", "the subscriptions change too fast: try again")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
