"""Catch-up: a channel's cut (offset, epoch, seq, history, and the texts of the messages in
progress), read in one script, and judged against where a subscriber resumes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ...core.errors import BrokerUnavailable
from ...core.events import CatchUp, LiveMessage
from ...core.history import judge_replay, new_epoch, rewound_entries
from ...core.parts import MessageParts
from ...core.sessions import replay as rebuild_parts
from ...core.settings import Settings
from .connections import DOWN, Connections
from .health import Health
from .keys import KEY_TTL, key
from .partlog import PartLog, read_value

__all__ = ["MAX_JOINS", "MAX_RESERVED_EPOCHS", "RESERVED_EPOCH_TTL", "CatchUps", "cut"]

MAX_JOINS = 32
"""Catch-up reads in flight per process; more joins wait their turn, none is refused."""
RESERVED_EPOCH_TTL = 600
"""Seconds the epoch a subscribe reserved for a channel nobody published to is kept."""
MAX_RESERVED_EPOCHS = 10_000
"""Epochs reserved for channels nobody published to, at most: past it the least recently
subscribed one is dropped (a subscriber that resumes it gets ``recovered: false``)."""


class CatchUps:
    """The catch-up reads of one process, at most :data:`MAX_JOINS` at a time."""

    def __init__(self, connections: Connections, health: Health, settings: Settings) -> None:
        self._connections = connections
        self._health = health
        self._settings = settings
        self._joins = asyncio.Semaphore(MAX_JOINS)

    async def catch_up(
        self, channel: str, since: tuple[int, str] | None, live: bool, rewind: int = 0
    ) -> CatchUp:
        """Read the channel's cut in one script."""
        try:
            async with self._joins:
                reply = await self._read(channel, since, live, rewind)
        except DOWN as exc:
            self._health.suspect()
            raise BrokerUnavailable(str(exc)) from None
        return cut(self._settings, since, reply, rewind)

    async def _read(
        self, channel: str, since: tuple[int, str] | None, live: bool, rewind: int
    ) -> Any:
        since_offset = -1 if since is None else since[0]  # the contract's (offset, epoch)
        return await self._connections.run(
            "catch_up",
            [
                key("epoch", channel),
                key("offset", channel),
                key("seq", channel),
                key("history", channel),
                key("live", channel),
                key("own", channel),
            ],
            [
                since_offset,
                new_epoch(),
                int(live),
                KEY_TTL,
                key("text", ""),
                RESERVED_EPOCH_TTL,
                rewind if since is None else 0,
                channel,
                time.time_ns() // 1000,
                MAX_RESERVED_EPOCHS,
            ],
        )


def cut(settings: Settings, since: tuple[int, str] | None, reply: Any, rewind: int = 0) -> CatchUp:
    """CATCH_UP's reply as a catch-up: the frames after ``since`` (judged against the
    channel's epoch and history), or the last ``rewind`` of them, and the messages in
    progress."""
    epoch_raw, offset, seq, entries, flat_live = reply
    epoch = epoch_raw.decode()
    recovered: bool | None = None
    frames: list[str] = []
    ages: list[float] = []
    if since is not None or rewind:
        now = time.time()
        oldest_ms = (now - settings.history_ttl) * 1000
        tail = []
        for entry_id, fields in entries:
            values = dict(zip(fields[::2], fields[1::2], strict=True))
            recorded_ms = float(values[b"t"])
            if recorded_ms < oldest_ms:
                continue
            offset_of = int(entry_id.split(b"-")[0])
            tail.append((offset_of, recorded_ms / 1000, values[b"f"].decode()))
        if since is not None:
            since_offset, since_epoch = since
            replay = judge_replay(since_offset, since_epoch, int(offset), epoch, tail)
            recovered, frames = replay.recovered, replay.frames
        else:
            run = rewound_entries(sorted(tail), int(offset), rewind)
            frames = [frame for _, _, frame in run]
            ages = [now - recorded for _, recorded, _ in run]
    messages = []
    for member, value in zip(flat_live[::2], flat_live[1::2], strict=True):
        owner, message_id = member.decode().split("|", 1)
        kept = read_value(value)
        if not isinstance(kept, PartLog):
            messages.append(LiveMessage(owner, message_id, kept))
            continue
        # A structured message, rebuilt from its log and compacted; one whose log was cut
        # can't be, and its deltas subscribers get it whole when it ends.
        log = (kept.implicit, kept.entries)
        parts = None if kept.cut else rebuild_parts(MessageParts(), kept.text, log)
        if parts is not None:
            messages.append(LiveMessage(owner, message_id, parts.text(), parts.catch_up()))
    return CatchUp(int(offset), epoch, recovered, frames, int(seq), messages, ages)
