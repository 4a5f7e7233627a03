"""Per-channel offsets, epochs and a bounded history of terminal frames, for resume.

Theory of operation
-------------------
Each channel has a log: an ``epoch`` (a random string naming one unbroken
history), the ``offset`` of its last terminal frame (``message`` or
``aborted``; the first one gets offset 1), and the last ``size`` of those
frames, already serialized, with the time they were recorded.

A resuming subscriber says the last offset it holds and in which epoch. If the
epoch matches and every frame after that offset is still retained, the log
hands them back in order (``recovered``); otherwise it says so, and the client
knows to refetch. It never hands back a partial run.

Limits:

* ``size`` frames per channel; the oldest falls out first.
* ``ttl`` seconds; older frames fall out when the channel is next touched.
* ``max_channels`` logs; touching a channel (subscribe or publish) makes it
  the most recently used, and the least recently used log is dropped when one
  more is needed. A dropped channel that comes back starts a new epoch, so its
  old subscribers learn that history was lost.

The store is pure: the caller passes the time.
"""

from __future__ import annotations

import base64
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .errors import ConfigError

__all__ = [
    "ChannelLog",
    "HistoryStore",
    "Replay",
    "judge_replay",
    "new_epoch",
    "rewound",
    "rewound_entries",
]


@dataclass(frozen=True, slots=True)
class Replay:
    """The answer to a resume: the frames to send, and whether they close the gap."""

    recovered: bool
    frames: list[str]
    offset: int
    epoch: str


def judge_replay(
    since: int,
    epoch: str,
    offset: int,
    current_epoch: str,
    tail: list[tuple[int, float, str]],
) -> Replay:
    """Decide a resume from the retained entries after ``since`` (``(offset, time, frame)``).

    Recovered only if the epoch matches and ``tail`` holds every offset from
    ``since + 1`` to ``offset``, in order: never a partial run.
    """
    if epoch != current_epoch or since > offset:
        return Replay(False, [], offset, current_epoch)
    expected = range(since + 1, offset + 1)
    if len(tail) != len(expected) or any(
        entry[0] != want for entry, want in zip(tail, expected, strict=True)
    ):
        return Replay(False, [], offset, current_epoch)
    return Replay(True, [entry[2] for entry in tail], offset, current_epoch)


def rewound(tail: list[tuple[int, float, str]], offset: int, count: int) -> list[str]:
    """The frames a fresh subscriber asking to ``rewind`` ``count`` gets: the last ``count``
    retained entries (``(offset, time, frame)``, in order), as a run without a gap that
    ends at the channel's ``offset``; fewer if fewer are retained. Never a frame twice,
    never one out of order: exactly what ``since`` would have replayed from there."""
    return [frame for _, _, frame in rewound_entries(tail, offset, count)]


def rewound_entries(
    tail: list[tuple[int, float, str]], offset: int, count: int
) -> list[tuple[int, float, str]]:
    """The entries of :func:`rewound`, with their offsets and times."""
    run: list[tuple[int, float, str]] = []
    want = offset
    for entry in reversed(tail):
        if entry[0] != want or len(run) >= count:
            break
        run.append(entry)
        want -= 1
    return run[::-1]


EPOCH_BYTES = 9
"""Random bytes in an epoch name: 12 characters of URL-safe base64, as
``secrets.token_urlsafe(9)`` makes."""
_DRAWN = 64
"""Epoch names drawn from the OS's random source at once."""
_drawn: list[str] = []
"""Epoch names drawn and not yet handed out (this process's own)."""
os.register_at_fork(after_in_child=_drawn.clear)  # a child never hands out its parent's


def new_epoch() -> str:
    """A fresh, unguessable epoch name: :data:`EPOCH_BYTES` bytes of the OS's random
    source (as ``secrets`` draws them), URL-safe base64. Names are drawn :data:`_DRAWN` at
    a time, one system call for many (a Redis terminal write carries one for its channel's
    first frame), each handed out once."""
    if not _drawn:
        encoded = base64.urlsafe_b64encode(os.urandom(EPOCH_BYTES * _DRAWN)).decode()
        size = EPOCH_BYTES * 4 // 3  # whole groups of three bytes: no padding, no seams
        _drawn.extend(encoded[at : at + size] for at in range(0, len(encoded), size))
    return _drawn.pop()


class ChannelLog:
    """One channel's offset, epoch and retained frames."""

    __slots__ = ("_entries", "bytes", "epoch", "offset")

    def __init__(self, size: int) -> None:
        self.epoch = new_epoch()
        self.offset = 0
        self._entries: deque[tuple[int, float, str]] = deque(maxlen=max(size, 0))
        self.bytes = 0
        """Characters of the frames kept (each at least a byte)."""

    def record(self, now: float, render: Callable[[int, str], str]) -> str:
        """Give the next offset to a frame rendered by ``render(offset, epoch)``; keep it."""
        offset = self.offset + 1
        payload = render(offset, self.epoch)
        # Only a rendered frame takes the offset, so offsets and entries never drift apart.
        self.offset = offset
        entries = self._entries
        if entries.maxlen == 0:
            return payload
        if len(entries) == entries.maxlen:
            self.bytes -= len(entries[0][2])
        entries.append((offset, now, payload))
        self.bytes += len(payload)
        return payload

    def prune(self, oldest_allowed: float) -> None:
        """Drop frames recorded before ``oldest_allowed``."""
        entries = self._entries
        while entries and entries[0][1] < oldest_allowed:
            self.bytes -= len(entries.popleft()[2])

    def rewind(self, count: int) -> list[str]:
        """The last ``count`` frames kept (see :func:`rewound`)."""
        return rewound(list(self._entries), self.offset, count)

    def rewind_entries(self, count: int) -> list[tuple[int, float, str]]:
        """The last ``count`` entries kept, with their offsets and times."""
        return rewound_entries(list(self._entries), self.offset, count)

    def replay(self, since: int, epoch: str) -> Replay:
        """The frames after offset ``since`` of ``epoch``, if none of them is lost."""
        missed = self.offset - since
        tail = list(self._entries)[-missed:] if 0 < missed <= len(self._entries) else []
        return judge_replay(since, epoch, self.offset, self.epoch, tail)

    def __len__(self) -> int:
        return len(self._entries)


class HistoryStore:
    """The logs of every channel, bounded in count, per-channel size and age.

    Only a channel that has been published to has a log. A subscribe to a channel with no
    log only reserves the epoch it will start with, among at most ``max_channels``
    reserved epochs of their own, least recently used first out: subscribing to any
    number of channels never evicts a channel that has history.
    """

    __slots__ = ("_logs", "_reserved", "bytes", "max_channels", "size", "ttl")

    def __init__(self, *, size: int, ttl: float, max_channels: int) -> None:
        if size < 1 or ttl <= 0 or max_channels < 1:
            raise ConfigError("size, ttl and max_channels must be positive")
        self.size = size
        self.ttl = ttl
        self.max_channels = max_channels
        self._logs: dict[str, ChannelLog] = {}
        self._reserved: dict[str, str] = {}
        self.bytes = 0
        """Characters of every frame kept, in every log (each at least a byte)."""

    def log(self, channel: str, now: float) -> ChannelLog:
        """The channel's log, created if needed, pruned to ``ttl`` and marked recently used."""
        log = self._logs.pop(channel, None)
        if log is None:
            if len(self._logs) >= self.max_channels:
                self.bytes -= self._logs.pop(next(iter(self._logs))).bytes
            log = ChannelLog(self.size)
            reserved = self._reserved.pop(channel, None)
            if reserved is not None:
                log.epoch = reserved  # the epoch its subscribers were told
        self._logs[channel] = log
        oldest_allowed = now - self.ttl
        entries = log._entries
        if entries and entries[0][1] < oldest_allowed:  # nearly never: a call spared
            before = log.bytes
            log.prune(oldest_allowed)
            self.bytes += log.bytes - before
        return log

    def position(self, channel: str, now: float) -> ChannelLog:
        """The channel's log for a joiner: its own if it has one, else a log with no
        entries under the epoch reserved for it (nothing is stored but that epoch)."""
        log = self._logs.get(channel)
        if log is not None:
            return self.log(channel, now)
        epoch = self._reserved.pop(channel, None) or new_epoch()
        self._reserved[channel] = epoch
        while len(self._reserved) > self.max_channels:
            del self._reserved[next(iter(self._reserved))]
        empty = ChannelLog(0)
        empty.epoch = epoch
        return empty

    def expire(self, now: float) -> None:
        """Drop every frame older than ``ttl``, in every log."""
        oldest_allowed = now - self.ttl
        for log in self._logs.values():
            before = log.bytes
            log.prune(oldest_allowed)
            self.bytes += log.bytes - before

    def record(self, channel: str, now: float, render: Callable[[int, str], str]) -> str:
        """Record a terminal frame on ``channel``; returns its serialized form."""
        log = self.log(channel, now)
        before = log.bytes
        payload = log.record(now, render)
        self.bytes += log.bytes - before
        return payload

    def last(self, channel: str) -> tuple[int, str]:
        """The offset of the channel's last frame, and its epoch ((0, "") with no log)."""
        log = self._logs.get(channel)
        return (0, "") if log is None else (log.offset, log.epoch)

    def __len__(self) -> int:
        return len(self._logs)
