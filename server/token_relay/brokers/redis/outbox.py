"""The outbox: terminal frames kept while Redis is down, published in order when it is back."""

from __future__ import annotations

import collections
import collections.abc
import logging
from typing import NamedTuple

__all__ = ["MAX_OUTBOX", "MAX_OUTBOX_BYTES", "Deferred", "Outbox"]

log = logging.getLogger("token_relay.redis")

MAX_OUTBOX = 10_000
"""Terminal frames kept while Redis is down, published in order when it is back."""
MAX_OUTBOX_BYTES = 64 * 1024 * 1024
"""The outbox's bound in characters of frames (each at least a byte), beside its count."""


class Deferred(NamedTuple):
    """A terminal frame waiting in the outbox."""

    channel: str
    owner: str
    message_id: str
    body: str
    seq: int
    aborted: bool
    producer: str
    """The producer identity its webhook carries."""


class Outbox:
    """At most :data:`MAX_OUTBOX` frames and :data:`MAX_OUTBOX_BYTES`, oldest first; past
    either the oldest is dropped, and logged."""

    __slots__ = ("_frames", "bytes")

    def __init__(self) -> None:
        self._frames: collections.deque[Deferred] = collections.deque()
        self.bytes = 0
        """The characters of the frames held."""

    def __len__(self) -> int:
        return len(self._frames)

    def __iter__(self) -> collections.abc.Iterator[Deferred]:
        """The frames held, oldest first."""
        return iter(self._frames)

    def add(self, deferred: Deferred) -> None:
        """Keep a frame, last; drop the oldest past either bound."""
        self._frames.append(deferred)
        self.bytes += len(deferred.body)
        while len(self._frames) > MAX_OUTBOX or self.bytes > MAX_OUTBOX_BYTES:
            lost = self._frames.popleft()
            self.bytes -= len(lost.body)
            log.error(
                "outbox full: dropped the terminal frame of %r on %r", lost.message_id, lost.channel
            )

    def take(self) -> Deferred:
        """The oldest frame, out of the outbox."""
        deferred = self._frames.popleft()
        self.bytes -= len(deferred.body)
        return deferred

    def put_back(self, deferred: Deferred) -> None:
        """A frame taken whose write failed: first again, for the next try (put back the
        failed ones newest first to keep their order)."""
        self._frames.appendleft(deferred)
        self.bytes += len(deferred.body)
