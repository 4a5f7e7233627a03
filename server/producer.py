"""One producer connection's state: its assembler, and the channel of each message.

Theory of operation
-------------------
A :class:`ProducerSession` takes validated events and says what they did. It
adds the relay's rules on top of the seed assembler:

* Channel: an event's ``channel`` overrides the connection's default; an event
  with neither is rejected (``channel_required``). A message's channel is fixed
  by its first event; a later event whose channel differs is rejected
  (``channel_mismatch``) and changes nothing.
* Limits: at most ``max_streaming`` unfinished messages; a non-final event that
  would open one more is rejected (``too_many_messages``) and changes nothing. At
  most ``max_completed`` finalized ids are remembered, least recently used
  first out. A forgotten id is unknown again: an event for it starts a new
  message.

The session is pure: the connection layer turns its answers into frames.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import MISSING

from .assembler import TokenAssembler
from .errors import ErrorCode, FrameRejected
from .protocol import ProducerEvent

__all__ = ["Applied", "ProducerSession"]


@dataclass(frozen=True, slots=True)
class Applied:
    """What one accepted event did."""

    channel: str
    message_id: str
    text: str | None
    """The completed text if the event was final (repeated finals included), else None."""
    first_completion: bool
    """True only for the event that finalized the message: broadcast it then, once."""


class ProducerSession:
    """Assembly state of one producer connection."""

    __slots__ = (
        "_completed",
        "_streaming",
        "assembler",
        "default_channel",
        "max_completed",
        "max_streaming",
    )

    def __init__(
        self,
        default_channel: str | None = None,
        *,
        max_streaming: int = 1000,
        max_completed: int = 1000,
    ) -> None:
        if max_streaming < 1 or max_completed < 1:
            raise ValueError("max_streaming and max_completed must be at least 1")
        self.default_channel = default_channel
        self.max_streaming = max_streaming
        self.max_completed = max_completed
        self.assembler = TokenAssembler()
        self._streaming: dict[str, str] = {}
        self._completed: dict[str, str] = {}

    def receive(self, event: ProducerEvent) -> Applied:
        """Apply one event, or raise :class:`FrameRejected` leaving all state unchanged."""
        message_id = event.id
        channel = self.default_channel if event.channel is MISSING else event.channel
        if channel is None:
            raise FrameRejected(
                ErrorCode.CHANNEL_REQUIRED,
                "'channel' is required: name it in the event or in the URL (?channel=)",
                message_id,
            )
        completed_in = self._completed.get(message_id)
        if completed_in is not None:
            self._check_channel(message_id, completed_in, channel)
            if not event.final:
                return Applied(channel, message_id, None, False)
            # A repeated final refreshes the id's place in the LRU.
            del self._completed[message_id]
            self._completed[message_id] = channel
            return Applied(channel, message_id, self.assembler.get(message_id), False)

        streaming_in = self._streaming.get(message_id)
        if streaming_in is None:
            # A one-shot event (new id, final) never stays open, so it passes at the limit.
            if not event.final and len(self._streaming) >= self.max_streaming:
                raise FrameRejected(
                    ErrorCode.TOO_MANY_MESSAGES,
                    f"a producer connection may have at most {self.max_streaming} "
                    "unfinished messages; finish one first",
                    message_id,
                )
            self._streaming[message_id] = channel
        else:
            self._check_channel(message_id, streaming_in, channel)

        delta = None if event.delta is MISSING else event.delta
        text = self.assembler.feed(message_id, delta, event.final)
        if text is None:
            return Applied(channel, message_id, None, False)
        del self._streaming[message_id]
        self._remember(message_id, channel)
        return Applied(channel, message_id, text, True)

    def close(self) -> list[tuple[str, str, str]]:
        """Free all state. Returns ``(channel, id, partial text)`` of unfinished messages."""
        unfinished = [
            (channel, message_id, self.assembler.discard(message_id) or "")
            for message_id, channel in self._streaming.items()
        ]
        self._streaming.clear()
        self._completed.clear()
        self.assembler = TokenAssembler()
        return unfinished

    @property
    def streaming_count(self) -> int:
        """Unfinished messages on this connection."""
        return len(self._streaming)

    @property
    def completed_count(self) -> int:
        """Finalized ids this connection still remembers."""
        return len(self._completed)

    @staticmethod
    def _check_channel(message_id: str, fixed: str, channel: str) -> None:
        if channel != fixed:
            raise FrameRejected(
                ErrorCode.CHANNEL_MISMATCH,
                f"message '{message_id}' belongs to channel '{fixed}', not '{channel}'",
                message_id,
            )

    def _remember(self, message_id: str, channel: str) -> None:
        self._completed[message_id] = channel
        if len(self._completed) > self.max_completed:
            oldest = next(iter(self._completed))
            del self._completed[oldest]
            self.assembler.forget(oldest)
