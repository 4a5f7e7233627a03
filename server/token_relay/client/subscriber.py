"""``RelaySubscriber``: typed frames, resumed by offset and positions after a drop, and the
live text (and parts, for a structured reply) of each message in progress.

A structured message's parts are rebuilt as the protocol says, with the relay's own
assembler (:class:`~token_relay.core.parts.MessageParts`): its ``delta`` frames are its
implicit text part, a ``chunks`` frame applies its chunks, a ``snapshot`` with ``chunks``
replaces what was held, and its ``message`` or ``aborted`` frame ends it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import MISSING
from websockets.asyncio.client import ClientConnection

from ..core.errors import PartRejected
from ..core.parts import MessageParts
from ..core.protocol import (
    SERVER_FRAME,
    Aborted,
    AnyServerFrame,
    ChunksFrame,
    DeltaFrame,
    MessageFrame,
    Since,
    Snapshot,
    Subscribe,
    Subscribed,
    encode,
)
from .base import Background, Backoff, relay_url

__all__ = ["RelaySubscriber"]


class RelaySubscriber(Background):
    """A resilient subscriber: typed frames, resumed by offset and positions after a drop."""

    def __init__(
        self,
        url: str,
        channels: Sequence[str],
        *,
        deltas: bool = True,
        token: str | None = None,
        max_queue: int = 10_000,
        backoff: tuple[float, float] = (0.05, 5.0),
    ) -> None:
        super().__init__()
        self.url = url
        self.channels = list(channels)
        self.deltas = deltas
        self.token = token
        self.reconnects = 0
        self.positions: dict[str, tuple[int, str]] = {}
        """Per channel, the last ``(offset, epoch)`` seen."""
        self.partials: dict[tuple[str, str], str] = {}
        """Text so far of messages in progress, by ``(channel, id)``."""
        self._parts: dict[tuple[str, str], MessageParts] = {}
        """The parts so far of structured messages in progress."""
        self._backoff = Backoff(*backoff)
        self._frames: asyncio.Queue[AnyServerFrame | None] = asyncio.Queue(max_queue)

    def __aiter__(self) -> AsyncIterator[AnyServerFrame]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[AnyServerFrame]:
        while True:
            frame = await self._frames.get()
            if frame is None:  # refused for good
                self._raise_if_fatal()
                continue
            yield frame

    def _on_fatal(self, exc: BaseException) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._frames.put_nowait(None)

    def text(self, channel: str, message_id: str) -> str | None:
        """The text so far of a message in progress."""
        return self.partials.get((channel, message_id))

    def parts(self, channel: str, message_id: str) -> list[dict[str, Any]] | None:
        """The parts so far of a structured message in progress (as ``readUIMessageStream``
        of ``ai`` would hold them); None for a plain one, or one not in progress."""
        parts = self._parts.get((channel, message_id))
        return None if parts is None else parts.parts()

    _role = "subscriber"

    def _stopping(self) -> bool:
        return False

    async def _dropped(self) -> None:
        """Nothing to forget: positions and texts carry over to the next connection."""

    def _target(self) -> str:
        return relay_url(self.url, "/subscribe", token=self.token)

    async def _serve(self, ws: ClientConnection) -> None:
        for channel in self.channels:
            await ws.send(encode(self._subscribe(channel)))
        self._started.set()
        async for raw in ws:
            frame = SERVER_FRAME.validate_json(raw)
            if self._take(frame):
                await self._frames.put(frame)

    def _subscribe(self, channel: str) -> Subscribe:
        fields: dict[str, Any] = {"type": "subscribe", "channel": channel, "deltas": self.deltas}
        position = self.positions.get(channel)
        if position is not None:
            fields["since"] = Since(offset=position[0], epoch=position[1])
        held = {
            message_id: len(text)
            for (held_channel, message_id), text in self.partials.items()
            if held_channel == channel
        }
        if held and self.deltas:
            fields["positions"] = held
        return Subscribe(**fields)

    def _take(self, frame: AnyServerFrame) -> bool:
        """Update positions and texts; False for a frame already delivered."""
        if isinstance(frame, Subscribed):
            if frame.recovered is not True:
                self.positions[frame.channel] = (frame.offset, frame.epoch)
        elif isinstance(frame, MessageFrame | Aborted):
            seen = self.positions.get(frame.channel)
            if seen is not None and seen[1] == frame.epoch and frame.offset <= seen[0]:
                return False
            self.positions[frame.channel] = (frame.offset, frame.epoch)
            self.partials.pop((frame.channel, frame.id), None)
            self._parts.pop((frame.channel, frame.id), None)
        elif isinstance(frame, ChunksFrame):
            self._apply((frame.channel, frame.id), frame.chunks)
        elif isinstance(frame, Snapshot) and frame.chunks is not MISSING:
            key = (frame.channel, frame.id)
            self._parts.pop(key, None)
            self.partials.pop(key, None)
            self._apply(key, frame.chunks)
        elif isinstance(frame, Snapshot):
            key = (frame.channel, frame.id)
            self._parts.pop(key, None)
            if frame.from_ is MISSING:
                self.partials[key] = frame.text
            else:
                self.partials[key] = self.partials.get(key, "")[: frame.from_] + frame.text
        elif isinstance(frame, DeltaFrame):
            key = (frame.channel, frame.id)
            self.partials[key] = self.partials.get(key, "") + frame.delta
        return True

    def _apply(self, key: tuple[str, str], chunks: list[Any]) -> None:
        """A structured message's chunks; the first makes its text so far (its delta
        frames) its implicit text part."""
        parts = self._parts.get(key)
        if parts is None:
            parts = self._parts[key] = MessageParts()
            so_far = self.partials.get(key)
            if so_far:
                parts.delta(so_far)
        for chunk in chunks:
            with contextlib.suppress(PartRejected):  # the relay's own parts took it
                parts.apply(chunk)
        self.partials[key] = parts.text()
