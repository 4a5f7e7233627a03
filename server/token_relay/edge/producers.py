"""The producer side of a relay process: producer connections and their sessions.

Theory of operation
-------------------
Each producer connection works through a session (:class:`ProducerLink`): its
assembler (:class:`~token_relay.core.streams.ProducerSession`), its rate bucket, its
grant, and what the broker could not publish yet. The relay sends the session
token first thing; a producer whose connection vanishes (no close frame) has
``--session-grace`` to reconnect with ``?session=TOKEN`` and continue where it
was, so subscribers see no ``aborted``. A producer that closes cleanly, or
that does not come back in time, ends its session: its unfinished messages are
aborted. A session is bound to the token identity that opened it.

Events are applied without waiting; only completing a message waits, for the
broker to give it an offset. Replies are awaited, which gives each producer
backpressure.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from pydantic import MISSING
from websockets import CloseCode
from websockets.asyncio.server import ServerConnection

from ..brokers import Broker
from ..core.errors import (
    BrokerUnavailable,
    ErrorCode,
    FrameRejected,
    binary_rejected,
    broker_rejected,
)
from ..core.grants import Grant
from ..core.protocol import (
    Aborted,
    AbortReason,
    MessageFrame,
    ProducerEvent,
    SessionFrame,
    acks_frame,
    decode_producer_frame,
    encode,
    encode_unpositioned,
    error_frame,
)
from ..core.ratelimit import TokenBucket
from ..core.settings import Settings
from ..core.streams import Applied, MessageTooLarge, ProducerSession, Unfinished
from .metrics import Metrics
from .writer import Fanout

__all__ = ["ProducerLink", "Producers"]

log = logging.getLogger("token_relay")

MAX_PARKED_CANCELS = 100
"""Cancels kept for a parked producer session, delivered when it resumes."""


@dataclass(slots=True, eq=False)
class ProducerLink:
    """A producer session: its assembler and what the relay keeps beside it.

    It outlives its connection by up to ``--session-grace`` when the connection
    vanishes, so a producer that reconnects with the session token continues.
    """

    owner: str
    token: str
    session: ProducerSession
    grant: Grant | None
    bucket: TokenBucket
    connection: ServerConnection | None
    unpublished: dict[str, None] = field(default_factory=dict)
    """Completed here but not yet published (the broker was down): a repeated final retries."""
    cancels: deque[str | bytes] = field(default_factory=lambda: deque(maxlen=MAX_PARKED_CANCELS))
    """Cancels that arrived while the session was parked."""
    expiry: asyncio.TimerHandle | None = None


class Producers:
    """Every producer session of one relay process."""

    def __init__(
        self,
        settings: Settings,
        broker: Broker,
        metrics: Metrics,
        fanout: Fanout,
        stopping: Callable[[], bool],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.metrics = metrics
        self.fanout = fanout
        self.stopping = stopping
        self.spawn = spawn
        self.links: dict[str, ProducerLink] = {}
        self.sessions: dict[str, ProducerLink] = {}
        self.parked: dict[str, ProducerLink] = {}
        self._owner_numbers = itertools.count(1)

    async def serve(
        self,
        connection: ServerConnection,
        channel: str | None,
        grant: Grant | None,
        resume: str | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        link, resumed = self._attach(connection, grant, resume)
        link.session.default_channel = channel
        await connection.send(encode(SessionFrame(session=link.token, resumed=resumed)))
        while link.cancels:
            self.fanout.send((connection,), link.cancels.popleft())
        received = self.metrics.frames_in_producer
        try:
            async for raw in connection:
                received.inc()
                if self.stopping() or link.connection is not connection:
                    break
                now = loop.time()
                try:
                    if isinstance(raw, bytes):
                        raise binary_rejected()
                    frame = decode_producer_frame(raw)
                except FrameRejected as exc:
                    await self.reject(connection, exc)
                    continue
                events = frame if isinstance(frame, list) else (frame,)
                if not link.bucket.take(now, len(events)):
                    # The whole frame is refused, so the producer sends it again as it was.
                    await self.reject(connection, self._rate_limited(frame, link))
                    continue
                acks: list[tuple[str, str, bool]] = []
                for index, event in enumerate(events):
                    applied = self._apply(
                        connection, link, event, now, index if events is frame else None
                    )
                    if applied is None:
                        continue
                    if isinstance(applied, MessageTooLarge):
                        if applied.unfinished is not None:
                            await self.abort(
                                link.owner, applied.unfinished, AbortReason.MESSAGE_TOO_LARGE
                            )
                        continue
                    if applied.text is not None:
                        ack = await self._complete(connection, link, applied, now)
                        if ack is not None:
                            acks.append(ack)
                if acks:
                    await connection.send(acks_frame(acks, batch=events is frame))
        finally:
            await self._detach(connection, link)

    def _attach(
        self, connection: ServerConnection, grant: Grant | None, resume: str | None
    ) -> tuple[ProducerLink, bool]:
        """This connection's producer state: a parked session it resumes, or a new one."""
        link = self.sessions.get(resume) if resume else None
        if link is not None and link.grant != grant:
            link = None  # a session token is bound to the identity that opened it
        if link is not None:
            if link.expiry is not None:
                link.expiry.cancel()
                link.expiry = None
            self.parked.pop(link.token, None)
            previous = link.connection
            if previous is not None:
                # The old connection is half-open or still alive: this one takes over.
                self.fanout.close(previous, CloseCode.POLICY_VIOLATION, "session resumed elsewhere")
            link.connection = connection
            return link, True
        settings = self.settings
        link = ProducerLink(
            owner=f"{self.broker.instance}.{next(self._owner_numbers)}",
            token=secrets.token_urlsafe(24),
            session=ProducerSession(
                None,
                max_streaming=settings.max_streaming_per_producer,
                max_completed=settings.max_completed_per_producer,
                max_chars=settings.max_message_chars,
            ),
            grant=grant,
            bucket=TokenBucket(
                settings.max_events_per_second,
                settings.max_events_per_second,
                asyncio.get_running_loop().time(),
            ),
            connection=connection,
        )
        self.links[link.owner] = link
        self.sessions[link.token] = link
        return link, False

    async def _detach(self, connection: ServerConnection, link: ProducerLink) -> None:
        """The connection ended: park the session for a resume, or end it now."""
        if link.connection is not connection:
            return  # another connection resumed this session
        link.connection = None
        grace = self.settings.session_grace
        # A producer that said goodbye (a close frame) is done; one that vanished may be back.
        vanished = connection.protocol.close_rcvd is None
        if vanished and grace > 0 and not self.stopping():
            self.parked[link.token] = link
            while len(self.parked) > self.settings.max_parked_sessions:
                oldest = self.parked.pop(next(iter(self.parked)))
                self.spawn(self._end_session(oldest))
            link.expiry = asyncio.get_running_loop().call_later(
                grace, lambda: self.spawn(self._end_session(link))
            )
            return
        await self._end_session(link)

    async def _end_session(self, link: ProducerLink) -> None:
        """Forget a producer's session and abort what it left unfinished."""
        if link.connection is not None:
            return  # resumed meanwhile
        self.parked.pop(link.token, None)
        self.sessions.pop(link.token, None)
        self.links.pop(link.owner, None)
        for unfinished in link.session.close():
            await self.abort(link.owner, unfinished, AbortReason.PRODUCER_DISCONNECTED)

    def _apply(
        self,
        connection: ServerConnection,
        link: ProducerLink,
        event: ProducerEvent,
        now: float,
        index: int | None,
    ) -> Applied | MessageTooLarge | None:
        """Apply one event and pass its delta on; None if it was rejected (and answered).

        A rejected event is answered with an error frame (naming ``index`` in a batch)
        and changes nothing else. This never waits: only completing a message does.
        """
        try:
            if link.grant is not None and event.channel is not MISSING:
                link.grant.check(event.channel, event.id)
            applied = link.session.receive(event, now)
        except FrameRejected as exc:
            exc.index = index
            self.reject_now(connection, exc)
            return exc if isinstance(exc, MessageTooLarge) else None
        if applied.opened and applied.text is None:
            self.broker.open(applied.channel, link.owner, applied.message_id)
        if applied.delta:
            self.broker.delta(applied.channel, link.owner, applied.message_id, applied.delta)
            if applied.delta_wait is not None:
                metrics = self.metrics
                timings = metrics.first_delta if applied.first_delta else metrics.delta_gap
                timings.observe(applied.delta_wait)
        return applied

    async def _complete(
        self, connection: ServerConnection, link: ProducerLink, applied: Applied, now: float
    ) -> tuple[str, str, bool] | None:
        """Publish a message its final completed; returns ``(channel, id, duplicate)`` to ack."""
        channel, message_id, text = applied.channel, applied.message_id, applied.text
        assert text is not None
        if applied.first_completion or message_id in link.unpublished:
            try:
                await self._publish(link, channel, message_id, text)
            except FrameRejected as exc:
                self.reject_now(connection, exc)
                return None
            self.metrics.completed.inc()
            self.metrics.final_to_delivery.observe(asyncio.get_running_loop().time() - now)
        return channel, message_id, applied.duplicate

    async def _publish(self, link: ProducerLink, channel: str, message_id: str, text: str) -> None:
        """Publish a completed message once; if the broker is down, keep it for a retried final."""
        body = encode_unpositioned(
            MessageFrame.model_construct(
                channel=channel, id=message_id, text=text, offset=0, epoch=""
            )
        )
        try:
            await self.broker.terminal(channel, link.owner, message_id, body)
        except BrokerUnavailable:
            link.unpublished[message_id] = None
            if len(link.unpublished) > self.settings.max_completed_per_producer:
                del link.unpublished[next(iter(link.unpublished))]
            raise broker_rejected(message_id) from None
        link.unpublished.pop(message_id, None)

    async def abort(self, owner: str, unfinished: Unfinished, reason: AbortReason) -> None:
        frame = Aborted(
            channel=unfinished.channel,
            id=unfinished.message_id,
            text=unfinished.text,
            reason=reason,
            offset=0,
            epoch="",
        )
        self.metrics.messages.labels(reason.value).inc()
        try:
            await self.broker.terminal(
                unfinished.channel, owner, unfinished.message_id, encode_unpositioned(frame)
            )
        except BrokerUnavailable:
            log.warning(
                "could not publish abort of %r on %r: broker unreachable",
                unfinished.message_id,
                unfinished.channel,
            )

    async def expire_idle(self, deadline: float) -> None:
        """Abort messages whose last event came before ``deadline``."""
        for owner, link in list(self.links.items()):
            for unfinished in link.session.expire(deadline):
                await self.abort(owner, unfinished, AbortReason.IDLE_TIMEOUT)

    async def abort_everything(self, reason: AbortReason) -> None:
        """Abort every message in progress, parked sessions included."""
        for owner, producer in list(self.links.items()):
            if producer.expiry is not None:
                producer.expiry.cancel()
            for unfinished in producer.session.close():
                await self.abort(owner, unfinished, reason)

    def _rate_limited(
        self, frame: ProducerEvent | list[ProducerEvent], link: ProducerLink
    ) -> FrameRejected:
        limit = f"{self.settings.max_events_per_second:g}"
        if isinstance(frame, list):
            return FrameRejected(
                ErrorCode.RATE_LIMITED,
                f"over {limit} events per second; none of this batch's {len(frame)} events "
                "was applied, send it again",
            )
        # With seq, say where to send again from, so a producer resumes without duplicates.
        expected = link.session.next_seq(frame.id) if frame.seq is not MISSING else None
        return FrameRejected(
            ErrorCode.RATE_LIMITED,
            f"over {limit} events per second; this event was not applied, send it again",
            frame.id,
            expected=expected,
        )

    async def reject(self, connection: ServerConnection, exc: FrameRejected) -> None:
        """Answer a rejected frame and wait until the producer can take more."""
        self.metrics.errors.labels(exc.code.value).inc()
        await connection.send(error_frame(exc))

    def reject_now(self, connection: ServerConnection, exc: FrameRejected) -> None:
        """Answer a rejected frame without waiting."""
        self.metrics.errors.labels(exc.code.value).inc()
        self.fanout.send((connection,), error_frame(exc))

    def cancel(self, owner: str, payload: str | bytes) -> None:
        """Pass a ``cancel`` frame to the local producer that owns the message."""
        producer = self.links.get(owner)
        if producer is None:
            return
        if producer.connection is None:
            producer.cancels.append(payload)  # parked: delivered when it resumes
        else:
            self.fanout.send((producer.connection,), payload)

    def partial(self, owner: str, message_id: str) -> str | None:
        """The text so far of a local producer's message."""
        producer = self.links.get(owner)
        return None if producer is None else producer.session.partial(message_id)

    def owned_messages(self) -> list[tuple[str, str, str]]:
        """Every message in progress on this process's producers."""
        return [
            (channel, owner, message_id)
            for owner, producer in self.links.items()
            for message_id, channel in producer.session.streaming()
        ]
