"""The pub/sub reader: the topics this process listens to, the one task that reads them,
reconnecting with backoff, and what each message read means; and the notes other
processes' inboxes read (a cancel for their producers; chat requests, handed to
:mod:`.requests`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from typing import Any, Protocol

from redis import exceptions as redis_errors

from ...core.errors import BrokerUnavailable
from ...core.events import Delta, FrameKind
from .. import BrokerListener
from .connections import DOWN, Connections
from .health import Health
from .keys import key, text
from .replies import NOT_ENOUGH_DATA, buffered, push_type

__all__ = ["PUBSUB_DEAD", "PUBSUB_QUIET", "Notes", "Reader"]

log = logging.getLogger("token_relay.redis")

PUBSUB_QUIET = 3.0
"""Seconds of pub/sub silence after which the connection is pinged."""
PUBSUB_DEAD = 5.0
"""Seconds a pub/sub ping may go unanswered before the connection is replaced."""


class Notes(Protocol):
    """Takes inbox notes of one concern (chat requests: :mod:`.requests`)."""

    def on_note(self, kind: bytes, name: bytes, payload: bytes) -> None:
        """One note, ``KIND|NAME|PAYLOAD``."""


class Reader:
    """The pub/sub connection: this process's inbox (``tr:i:INSTANCE``) and the topics of
    the channels it has local subscribers on."""

    def __init__(self, connections: Connections, health: Health, instance: str) -> None:
        self._connections = connections
        self._health = health
        self.inbox = key("i", instance)
        self.listener: BrokerListener | None = None
        self.requests: Notes | None = None
        """Takes the inbox's notes about chat requests (``q`` and ``r``)."""
        self._pubsub: Any = None
        self._topics: set[str] = set()
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        """Subscriptions asked for, until Redis confirms them."""
        self._flushes: dict[str, asyncio.Future[None]] = {}
        """Flush markers published, until they come back."""

    async def close(self) -> None:
        """Close the pub/sub connection, within 2 s."""
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pubsub.aclose(), 2)

    async def listen(self, channel: str, messages: bool, deltas: bool) -> None:
        """Subscribe to exactly the topics this process needs for ``channel``."""
        wanted = {
            topic
            for topic, on in ((key("m", channel), messages), (key("d", channel), deltas))
            if on
        }
        current = {
            topic for topic in (key("m", channel), key("d", channel)) if topic in self._topics
        }
        added, removed = wanted - current, current - wanted
        self._topics |= added
        self._topics -= removed
        pubsub = self._pubsub
        if pubsub is None or not self._health.listening:
            if added:
                raise BrokerUnavailable("Redis is unreachable")
            return
        try:
            if removed:
                await pubsub.unsubscribe(*removed)
            if added:
                loop = asyncio.get_running_loop()
                waits = [self._confirmed.setdefault(topic, loop.create_future()) for topic in added]
                await pubsub.subscribe(*added)
                await asyncio.wait_for(asyncio.gather(*waits), 5)
        except (TimeoutError, *DOWN) as exc:
            raise BrokerUnavailable(str(exc)) from None

    async def flush(self) -> None:
        """Wait until a marker published now comes back: pub/sub keeps order on one connection."""
        token = secrets.token_hex(8)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flushes[token] = waiter
        try:
            await self._connections.client().publish(self.inbox, f"f|{token}|")
            await asyncio.wait_for(waiter, 5)
        except (*DOWN, TimeoutError) as exc:
            raise BrokerUnavailable(str(exc)) from None
        finally:
            self._flushes.pop(token, None)

    async def cancel(self, channel: str, message_id: str, frame: str) -> int:
        """Publish the cancel to the inbox of each process owning the message; count those
        that got it."""
        redis = self._connections.client()
        try:
            members = await redis.smembers(key("live", channel))
            pairs = [text(member).split("|", 1) for member in members]
            owners = [owner for owner, open_id in pairs if open_id == message_id]
            delivered = 0
            for owner in owners:
                instance = owner.rsplit(".", 1)[0]
                delivered += bool(await redis.publish(key("i", instance), f"c|{owner}|{frame}"))
        except DOWN as exc:
            self._health.suspect()
            raise BrokerUnavailable(str(exc)) from None
        return delivered

    async def read_forever(
        self, connected: asyncio.Future[None], restored: Callable[[], None]
    ) -> None:
        """Connect, read until it fails, and again with backoff; ``connected`` ends at the
        first connect, and ``restored`` runs at each one after an outage."""
        health = self._health
        backoff = 0.1
        had_outage = False
        while not health.closing:
            try:
                await self._connect()
                await self._connections.load_scripts()
                health.up = health.listening = True
                backoff = 0.1
                if not connected.done():
                    connected.set_result(None)
                if had_outage:
                    log.warning("Redis is back: resynchronizing")
                    restored()
                    had_outage = False
                await self._dispatch()
            except asyncio.CancelledError:
                raise
            except (*DOWN, redis_errors.RedisError, BrokerUnavailable) as exc:
                if health.listening or not had_outage:
                    log.warning("Redis unreachable (%s); retrying with backoff", exc)
                health.lost_pubsub()
                had_outage = True
                for waiter in self._confirmed.values():
                    if not waiter.done():
                        waiter.set_exception(BrokerUnavailable(str(exc)))
                self._confirmed.clear()
                await asyncio.sleep(backoff * (0.5 + secrets.randbelow(1000) / 1000))
                backoff = min(backoff * 2, 2.0)

    async def _connect(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
        self._pubsub = self._connections.client().pubsub()
        await self._pubsub.subscribe(self.inbox, *self._topics)

    async def _dispatch(self) -> None:
        """Read pub/sub until it fails. Silence is timed by one timer moved at most twice a
        second, not by a timer per message: a connection quiet for about
        :data:`PUBSUB_QUIET` is pinged, and one still quiet :data:`PUBSUB_DEAD` after that
        may be dead without a reset, so it is replaced."""
        pubsub = self._pubsub
        health = self._health
        loop = asyncio.get_running_loop()
        inbox = self.inbox.encode()
        pinged = False
        while not health.closing:
            quiet = asyncio.timeout(PUBSUB_DEAD if pinged else PUBSUB_QUIET)
            try:
                async with quiet:
                    moved = loop.time()
                    while not health.closing:
                        message = await pubsub.get_message(timeout=None)
                        pinged = False
                        now = loop.time()
                        if now - moved > 0.5:
                            moved = now
                            quiet.reschedule(now + PUBSUB_QUIET)
                        if message is not None:
                            self._take(message, inbox)
                        other = self._take_buffered(pubsub, inbox)
                        if other is not None:  # read already: taken as get_message would
                            message = await _handled(pubsub, other)
                            if message is not None:
                                self._take(message, inbox)
            except TimeoutError:
                if not quiet.expired():
                    raise
                if pinged:
                    raise BrokerUnavailable("the pub/sub connection stopped answering") from None
                await pubsub.ping()
                pinged = True

    def _take_buffered(self, pubsub: Any, inbox: bytes) -> Any:
        """Take the messages already read and parsed behind the one just taken, in order,
        without a pass through redis-py's layers each (a burst arrives in one read). The
        first reply that is not a channel's message (a subscription confirmed, a pong) is
        returned, for :func:`_handled`; None once none is left."""
        gets = buffered(pubsub.connection)
        if gets is None:
            return None
        while (reply := gets()) is not NOT_ENOUGH_DATA:
            if isinstance(reply, list) and len(reply) == 3 and reply[0] == b"message":
                self._message(reply[1], reply[2], inbox)
            else:
                return reply
        return None

    def _take(self, message: dict[str, Any], inbox: bytes) -> None:
        """One pub/sub message as redis-py hands it out: a subscription confirmed, or a
        message (:meth:`_message`)."""
        kind = message["type"]
        if kind == "pong":
            return
        topic: bytes = message["channel"]
        if kind == "subscribe":
            waiter = self._confirmed.pop(topic.decode(), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        if kind == "message":
            self._message(topic, message["data"], inbox)

    def _message(self, topic: bytes, data: bytes, inbox: bytes) -> None:
        """A message published on ``topic``: a note to this process (its inbox), or a
        channel's frame for the listener."""
        listener = self.listener
        if listener is None:
            return
        if topic == inbox:
            what, name, payload = data.split(b"|", 2)
            if what == b"f":
                waiter = self._flushes.get(name.decode())
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            elif what == b"x":
                listener.on_session_moved(name.decode())
            elif what in (b"q", b"r"):
                if self.requests is not None:
                    self.requests.on_note(what, name, payload)
            else:
                listener.on_cancel(name.decode(), payload)
            return
        frame_kind, seq, payload = data.split(b"|", 2)
        channel = topic[5:].decode()
        if frame_kind == b"d":
            # KIND|SEQ|ID_BYTES|ID TEXT: the delta's fields, never JSON to parse.
            size, rest = payload.split(b"|", 1)
            cut = int(size)
            delta = Delta(channel, rest[:cut].decode(), rest[cut:].decode())
            listener.on_delta(channel, int(seq), delta)
        elif frame_kind == b"p":  # a structured message's chunks: for deltas subscribers
            listener.on_frame(channel, FrameKind.DELTA, int(seq), payload)
        else:
            listener.on_frame(channel, _KINDS[frame_kind], int(seq), payload)


_KINDS = {kind.value.encode(): kind for kind in FrameKind}
"""A frame's kind, by the letter it is published under."""


async def _handled(pubsub: Any, reply: Any) -> dict[str, Any] | None:
    """A reply taken from :func:`~.replies.buffered` that is not a channel's message,
    handled as ``get_message`` would have: a push of RESP3 through the parser's push
    handling, then the message it makes (redis-py's bookkeeping of subscriptions included)."""
    if isinstance(reply, Exception):
        raise reply  # as the connection's read_response raises it (an error reply, a reset)
    push = push_type(pubsub.connection)
    if push is not None and isinstance(reply, push):
        reply = await pubsub.connection._parser.handle_push_response(reply)
    message: dict[str, Any] | None = await pubsub.handle_message(reply)
    return message
