"""Chat requests between processes: which producers take a channel's requests, and handing
one to the newest of them, wherever it is connected.

``tr:q:C`` is a sorted set of the owners (producer sessions) that take channel ``C``'s
requests, each scored by a number drawn from ``tr:qseq`` when it registered, so the
newest registration has the highest score. ``tr:qc:INSTANCE`` is the set of channels a
process registered owners on, so that the process that reaps a gone one (see
:mod:`.leases`) can remove its owners. Neither expires: an entry lives while its producer
is connected, and is removed when it disconnects, when a process finds the owner's process
gone (nobody reads its inbox), or when the gone process is reaped. Each process also keeps
its own registrations and makes them again when Redis comes back after an outage (Redis
may have restarted empty).

Handing a request: the process that serves it tries the owners newest first (at most
:data:`MAX_TRIES`). For an owner of its own it asks its listener directly; for another
process's it publishes a note to that process's inbox, ``q|OWNER|ORIGIN|TOKEN|LEN|CHANNEL
FRAME``, and waits (at most :data:`ANSWER_SECONDS`) for the answer note ``r|TOKEN|CODE`` in
its own inbox: empty once handed, else the error code. A note nobody received (the process
is gone) removes the owner and tries the next; so does ``no_producer`` (the owner
disconnected meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Coroutine
from typing import Any

from ...core.errors import BrokerUnavailable, ErrorCode
from .. import BrokerListener
from .connections import DOWN, Connections
from .health import Health
from .keys import key, text

__all__ = ["ANSWER_SECONDS", "MAX_TRIES", "Requests"]

MAX_TRIES = 8
"""Owners tried, newest first, before a request is ``no_producer``."""
ANSWER_SECONDS = 5.0
"""How long a process waits for another to say whether it handed a request over."""


class Requests:
    """This process's side of chat requests on Redis."""

    def __init__(self, connections: Connections, health: Health, instance: str) -> None:
        self._connections = connections
        self._health = health
        self._instance = instance
        self.listener: BrokerListener | None = None
        self._mine: dict[str, set[str]] = {}
        """Per channel, the local owners registered (kept across outages)."""
        self._waiting: dict[str, asyncio.Future[str]] = {}
        """Requests handed to another process, until it answers (by token)."""
        self._answers: set[asyncio.Task[None]] = set()
        self._order = asyncio.Lock()
        """Registrations reach Redis in the order they were asked for."""

    async def take(self, channel: str, owner: str, taking: bool) -> None:
        """Register or unregister a local owner for ``channel``'s requests."""
        owners = self._mine.setdefault(channel, set())
        if taking:
            owners.add(owner)
        else:
            owners.discard(owner)
            if not owners:
                del self._mine[channel]
        try:
            async with self._order:
                if taking:
                    await self._register(channel, owner)
                    return
                await self._unregister(channel, owner)
        except DOWN as exc:
            self._health.suspect()
            raise BrokerUnavailable(str(exc)) from None

    async def _register(self, channel: str, owner: str) -> None:
        await self._connections.run(
            "register",
            [key("q", channel), "tr:qseq", key("qc", self._instance)],
            [owner, channel],
        )

    async def _unregister(self, channel: str, owner: str) -> None:
        pipe = self._connections.client().pipeline(transaction=False)
        pipe.zrem(key("q", channel), owner)
        if channel not in self._mine:
            pipe.srem(key("qc", self._instance), channel)
        await pipe.execute()

    def _forget_stale(self, channel: str, owner: str) -> None:
        """A local owner listed for ``channel`` that does not take its requests (its
        unregistration failed during an outage): remove it."""
        if owner not in self._mine.get(channel, ()):
            self._spawn(self._quietly(self._unregister(channel, owner)))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._answers.add(task)
        task.add_done_callback(self._answers.discard)

    @staticmethod
    async def _quietly(work: Coroutine[Any, Any, None]) -> None:
        with contextlib.suppress(*DOWN, BrokerUnavailable):
            await work

    async def restore(self) -> None:
        """Make every local registration again (Redis came back, maybe empty)."""
        with contextlib.suppress(*DOWN, BrokerUnavailable):
            async with self._order:
                for channel, owners in list(self._mine.items()):
                    for owner in list(owners):
                        await self._register(channel, owner)

    async def hand(self, channel: str, payload: str) -> ErrorCode | None:
        """Hand a request to the newest owner registered for ``channel``."""
        try:
            for owner in await self._members(channel, MAX_TRIES):
                instance = owner.rsplit(".", 1)[0]
                if instance == self._instance:
                    code = self._local(owner, channel, payload)
                else:
                    code = await self._hand_over(instance, owner, channel, payload)
                if code is not ErrorCode.NO_PRODUCER:
                    return code
        except DOWN as exc:
            self._health.suspect()
            raise BrokerUnavailable(str(exc)) from None
        return ErrorCode.NO_PRODUCER

    async def _hand_over(
        self, instance: str, owner: str, channel: str, payload: str
    ) -> ErrorCode | None:
        token = secrets.token_hex(8)
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[token] = waiter
        note = f"q|{owner}|{self._instance}|{token}|{len(channel.encode())}|{channel}{payload}"
        try:
            client = self._connections.client()
            if not await client.publish(key("i", instance), note):
                # Nobody reads that inbox: its process is gone.
                await client.zrem(key("q", channel), owner)
                return ErrorCode.NO_PRODUCER
            try:
                answer = await asyncio.wait_for(waiter, ANSWER_SECONDS)
            except TimeoutError:
                raise BrokerUnavailable(
                    f"relay process {instance} did not answer within {ANSWER_SECONDS:g} s"
                ) from None
        finally:
            self._waiting.pop(token, None)
        return ErrorCode(answer) if answer else None

    def on_note(self, kind: bytes, name: bytes, payload: bytes) -> None:
        """A note in this process's inbox: a request for a local owner (``q``), or the
        answer about one this process handed over (``r``)."""
        if kind == b"r":
            waiter = self._waiting.get(name.decode())
            if waiter is not None and not waiter.done():
                waiter.set_result(payload.decode())
            return
        origin, token, size, rest = payload.split(b"|", 3)
        cut = int(size)
        channel, frame = rest[:cut].decode(), rest[cut:].decode()
        code = self._local(name.decode(), channel, frame)
        answer = f"r|{token.decode()}|{'' if code is None else code.value}"
        # Unanswered, the origin times out and says so.
        self._spawn(self._quietly(self._publish(key("i", origin.decode()), answer)))

    def _local(self, owner: str, channel: str, payload: str) -> ErrorCode | None:
        listener = self.listener
        code = (
            ErrorCode.NO_PRODUCER
            if listener is None
            else listener.on_request(owner, channel, payload)
        )
        if code is ErrorCode.NO_PRODUCER:
            self._forget_stale(channel, owner)
        return code

    async def _publish(self, topic: str, note: str) -> None:
        await self._connections.client().publish(topic, note)

    async def _members(self, channel: str, most: int = 0) -> list[str]:
        """The owners registered for ``channel``, newest first (``most`` of them, or all)."""
        found = await self._connections.client().zrevrange(key("q", channel), 0, most - 1)
        return [text(raw) for raw in found if isinstance(raw, bytes | str)]

    async def reap(self, instance: str) -> None:
        """Remove a gone process's registrations."""
        redis = self._connections.client()
        prefix = instance + "."
        for raw in await redis.smembers(key("qc", instance)):
            channel = text(raw)
            stale = [member for member in await self._members(channel) if member.startswith(prefix)]
            if stale:
                await redis.zrem(key("q", channel), *stale)
        await redis.delete(key("qc", instance))
