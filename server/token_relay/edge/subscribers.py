"""The subscriber endpoint: reads a subscriber's frames and carries out the router's actions.

A ``subscribe`` starts a join in the core's
:class:`~token_relay.core.router.ChannelRouter`, asks the broker for the
channel's traffic and its catch-up cut, and sends what the router makes of the
cut. Every frame the broker delivers goes through the router too
(:meth:`SubscriberEndpoint.deliver`); this module only writes what it returns,
starts the flush window's timers and closes whom it says to close.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import MISSING
from websockets import CloseCode

from ..brokers import Broker
from ..core.errors import (
    BrokerUnavailable,
    ErrorCode,
    FrameRejected,
    binary_rejected,
    broker_rejected,
)
from ..core.events import CatchUp, FrameKind, Outgoing
from ..core.grants import Grant
from ..core.protocol import (
    Cancel,
    Subscribe,
    Unsubscribe,
    Unsubscribed,
    decode_subscriber_frame,
    encode,
    error_frame,
)
from ..core.ratelimit import TokenBucket
from ..core.router import Action, ChannelRouter, Close, Hold, Send
from ..core.settings import Settings
from .aisdk import AiSdkStream
from .metrics import Metrics
from .peer import Peer, Streamed
from .statuses import CANCEL_CODES, status_of
from .writer import Writer

__all__ = ["SubscriberEndpoint"]

BROKER_RESTORED_REASON = "broker reconnected: resume by offset"


class SubscriberEndpoint:
    """Every subscriber connection of one relay process."""

    def __init__(
        self,
        settings: Settings,
        broker: Broker,
        metrics: Metrics,
        writer: Writer,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.metrics = metrics
        self.writer = writer
        self.spawn = spawn
        self.router: ChannelRouter[Peer] = ChannelRouter(
            settings.max_channels_per_subscriber,
            window=settings.delta_flush_ms > 0,
            max_join_buffer_bytes=settings.max_subscriber_buffer_bytes,
        )
        self.also_listening: Callable[[str], bool] = lambda channel: False
        """Whether another reader of this process needs a channel's terminal frames (a
        channel read as a Durable Stream), whoever subscribes here."""

    async def serve(self, connection: Streamed, initial: list[Subscribe], grant: Grant) -> None:
        """Serve one subscriber connection until it ends."""
        received = self.metrics.frames_in_subscriber
        loop = asyncio.get_running_loop()
        rate = self.settings.max_subscribes_per_second
        bucket = TokenBucket(rate, rate, loop.time())
        try:
            for frame in initial:
                await self._answer(connection, frame, grant, bucket)
            async for raw in connection:
                received.inc()
                if not isinstance(raw, str):
                    refused = raw if isinstance(raw, FrameRejected) else binary_rejected()
                    self.reject_now(connection, refused)
                    continue
                try:
                    request = decode_subscriber_frame(raw)
                except FrameRejected as exc:
                    self.reject_now(connection, exc)
                    continue
                await self._answer(connection, request, grant, bucket)
        finally:
            for channel in self.router.remove(connection):
                await self._update_interest(channel)

    def reject_now(self, connection: Peer, exc: FrameRejected, channel: str | None = None) -> None:
        """Answer a refused frame (of ``channel``, if it named one) without waiting."""
        self.metrics.errors.labels(exc.code.value).inc()
        self.writer.send((connection,), error_frame(exc, channel))

    async def _answer(
        self,
        connection: Peer,
        frame: Subscribe | Unsubscribe | Cancel,
        grant: Grant,
        bucket: TokenBucket,
    ) -> None:
        try:
            if not bucket.take(asyncio.get_running_loop().time()):
                raise FrameRejected(
                    ErrorCode.RATE_LIMITED,
                    f"over {self.settings.max_subscribes_per_second:g} subscribes, "
                    "unsubscribes and cancels per second; this one changed nothing",
                    frame.id if isinstance(frame, Cancel) else None,
                )
            if isinstance(frame, Subscribe):
                grant.check(frame.channel)
                await self._subscribe(connection, frame)
            elif isinstance(frame, Unsubscribe):
                self.router.unsubscribe(connection, frame.channel)
                self.writer.send((connection,), encode(Unsubscribed(channel=frame.channel)))
                await self._update_interest(frame.channel)
            else:
                grant.check(frame.channel, frame.id)
                await self._cancel(connection, frame)
        except FrameRejected as exc:
            self.reject_now(connection, exc, frame.channel)

    async def join(self, connection: Peer, channel: str, rewind: int) -> None:
        """Join ``channel`` as a deltas subscriber, for a chat transport's request (the
        grant was checked), ``rewind`` completed messages first. A refusal goes to the
        connection as the channel's error frame; a join already made is made again."""
        if self.router.hub.is_subscribed(connection, channel):
            self.router.unsubscribe(connection, channel)
        frame = Subscribe(type="subscribe", channel=channel, deltas=True)
        if rewind:
            frame = Subscribe(type="subscribe", channel=channel, deltas=True, rewind=rewind)
        try:
            await self._subscribe(connection, frame)
        except FrameRejected as exc:
            self.reject_now(connection, exc, channel)

    def leave(self, connection: Peer, channel: str) -> None:
        """Leave ``channel`` (a chat transport's request ended)."""
        self.router.unsubscribe(connection, channel)
        self.spawn(self._update_interests([channel]))

    async def stop(self, channel: str, message_id: str) -> None:
        """Stop for a chat transport: a cancel to the producers of the message; raises
        :class:`FrameRejected` if none has it."""
        await self._route_cancel(Cancel(type="cancel", channel=channel, id=message_id))

    async def _subscribe(self, connection: Peer, frame: Subscribe) -> None:
        """Join: the confirmation, replayed history, snapshots, then what followed."""
        channel = frame.channel
        since = None if frame.since is MISSING else (frame.since.offset, frame.since.epoch)
        rewind = 0 if frame.rewind is MISSING or since else frame.rewind
        rewind = min(rewind, self.settings.history_size)
        join, actions = self.router.join(
            connection, channel, deltas=frame.deltas, resuming=since is not None or rewind > 0
        )
        self.carry_out(actions)
        try:
            await self._update_interest(channel, strict=True)
            cut = await self.broker.catch_up(channel, since, frame.deltas, rewind)
        except BrokerUnavailable:
            if self.router.abandon(join):
                await self._update_interest(channel)
            raise broker_rejected(None) from None
        if isinstance(connection, AiSdkStream) and connection.replay_window is not None:
            cut = _recent(cut, connection.replay_window)
        positions = None if frame.positions is MISSING else frame.positions
        self.writer.send_each(connection, self.router.joined(join, cut, positions))

    async def update_interest(self, channel: str, strict: bool) -> None:
        """Tell the broker whether this process still needs the channel's traffic (raising
        :class:`BrokerUnavailable` if ``strict``)."""
        await self._update_interest(channel, strict=strict)

    async def _update_interest(self, channel: str, *, strict: bool = False) -> None:
        """Tell the broker whether this process still needs the channel's traffic."""
        messages, deltas = self.router.interest(channel)
        messages = messages or self.also_listening(channel)
        if strict:
            await self.broker.listen(channel, messages, deltas)
            return
        with contextlib.suppress(BrokerUnavailable):
            await self.broker.listen(channel, messages, deltas)

    async def _cancel(self, connection: Peer, frame: Cancel) -> None:
        if not self.router.hub.is_subscribed(connection, frame.channel):
            raise FrameRejected(
                ErrorCode.NOT_SUBSCRIBED,
                f"subscribe to channel '{frame.channel}' before cancelling its messages",
                frame.id,
            )
        await self._route_cancel(frame)

    async def _route_cancel(self, frame: Cancel) -> None:
        """Hand a cancel to the producers of its message; refused if none has it."""
        try:
            owners = await self.broker.cancel(frame.channel, frame.id, encode(frame))
        except BrokerUnavailable:
            raise broker_rejected(frame.id) from None
        if not owners:
            raise FrameRejected(
                ErrorCode.UNKNOWN_MESSAGE,
                f"no message '{frame.id}' is in progress on channel '{frame.channel}'",
                frame.id,
            )

    async def cancel_over_http(self, grant: Grant, body: bytes) -> tuple[int, str]:
        """``POST /cancel`` with ``{"channel", "id"}``: Stop for a client without a socket
        to send a cancel frame on (an SSE stream). Returns the HTTP status and the error
        frame (empty for 204)."""
        try:
            request = decode_subscriber_frame(_as_cancel(body))
            if not isinstance(request, Cancel):
                raise FrameRejected(ErrorCode.INVALID_FRAME, "the body is a cancel")
            grant.check(request.channel, request.id)
            await self._route_cancel(request)
        except FrameRejected as exc:
            return self._http_refusal(exc)
        return 204, ""

    async def stop_over_http(self, channel: str, wanted: str | None) -> tuple[int, str]:
        """``POST /ai-sdk/{channel}/stop``: cancel the newest message in progress on the
        channel (or the one ``?id=`` names). Returns the HTTP status and the error frame."""
        try:
            if wanted is not None:
                # Its producers are asked directly (none has it: 404), whatever the message
                # is: a structured one has no text for the catch-up to list.
                await self._route_cancel(Cancel(type="cancel", channel=channel, id=wanted))
                return 204, ""
            try:
                cut = await self.broker.catch_up(channel, None, True)
            except BrokerUnavailable:
                raise broker_rejected(wanted) from None
            live = [message.message_id for message in cut.live]
            target = wanted if wanted in live else (live[-1] if live and not wanted else "")
            if not target:
                raise FrameRejected(
                    ErrorCode.UNKNOWN_MESSAGE,
                    f"no message is in progress on channel '{channel}'",
                    wanted,
                )
            await self._route_cancel(Cancel(type="cancel", channel=channel, id=target))
        except FrameRejected as exc:
            return self._http_refusal(exc)
        return 204, ""

    def _http_refusal(self, exc: FrameRejected) -> tuple[int, str]:
        self.metrics.errors.labels(exc.code.value).inc()
        return status_of(exc.code, CANCEL_CODES), error_frame(exc)

    # ---------------------------------------------------------------- from the broker

    def deliver(self, channel: str, kind: FrameKind, seq: int, item: Outgoing) -> None:
        """Route one frame of ``channel`` to this process's subscribers."""
        self.carry_out(self.router.deliver(channel, kind, seq, item))

    def carry_out(self, actions: list[Action[Peer]]) -> None:
        """Write, close and start timers as the router says."""
        for action in actions:
            if isinstance(action, Send):
                self.writer.send(action.receivers, action.item)
            elif isinstance(action, Hold):
                asyncio.get_running_loop().call_later(
                    self.settings.delta_flush_ms / 1000, self._flush, action.channel
                )
            elif isinstance(action, Close):
                self.metrics.slow_closes.inc()
                self.writer.close(action.subscriber, CloseCode.TRY_AGAIN_LATER, action.reason)

    def _flush(self, channel: str) -> None:
        self.carry_out(self.router.flush(channel))

    def resume_everyone(self) -> int:
        """Close every subscriber with 1012 so that it resumes by offset; returns how many."""
        subscribers = list(self.router.subscribers())
        for connection in subscribers:
            self.writer.close(connection, CloseCode.SERVICE_RESTART, BROKER_RESTORED_REASON)
        return len(subscribers)

    def forget(self, connection: Peer) -> None:
        """Drop the subscriptions of a connection being closed, and the broker's interest."""
        channels = self.router.remove(connection)
        if channels:
            self.spawn(self._update_interests(channels))

    async def _update_interests(self, channels: list[str]) -> None:
        for channel in channels:
            await self._update_interest(channel)


def _as_cancel(body: bytes) -> bytes:
    """A body ``{"channel", "id"}`` as a cancel frame (``type`` may be left out)."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return body  # refused by the decoder, with its own words
    if isinstance(value, dict) and "type" not in value:
        value = {"type": "cancel", **value}
    return json.dumps(value).encode()


def _recent(cut: CatchUp, window: float) -> CatchUp:
    """A rewind's cut without the frames recorded more than ``window`` seconds ago: what is
    left is still a run that ends at the channel's offset (the newest are the last)."""
    keep = len(cut.frames)
    while keep and cut.ages[-keep] > window:
        keep -= 1
    if keep == len(cut.frames):
        return cut
    start = len(cut.frames) - keep
    return dataclasses.replace(cut, frames=cut.frames[start:], ages=cut.ages[start:])
