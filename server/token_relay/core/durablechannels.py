"""Channels read as Durable Streams: the rules of ``/v1/stream/__channel/{channel}``.

Theory of operation
-------------------
Every relay channel is also a read-only Durable Stream of JSON, whose items are the
channel's completed frames (``message`` and ``aborted``, parts included), exactly as a
subscriber gets them, in offset order. The stream's offsets *are* the channel's positions:
the offset after the frame of channel offset ``n`` in epoch ``e`` is ``e_n`` (``n`` written
with 16 digits), so

* ``Stream-Next-Offset: e_n`` resumes where ``/subscribe`` with ``"since": {"offset": n,
  "epoch": "e"}`` resumes, and where an SSE ``Last-Event-ID`` holding ``[n, "e"]`` for the
  channel resumes; and back: the ``offset`` and ``epoch`` of the last frame a subscriber
  got make the stream offset to read on from. No frame is lost or read twice.
* a read returns at most :data:`MAX_READ_BYTES` of frames (at least one): past them it
  ends short of the tail, without ``Stream-Up-To-Date``, and the next read goes on;
* ``-1`` reads from the oldest frame the channel's history still holds, ``now`` from the
  channel's tail.
* an offset of another epoch (history lost: a relay restart, the channel's history dropped),
  or one whose next frames history no longer holds (``--history-size``, ``--history-ttl``),
  is ``410 Gone`` (``offset_gone``), as the protocol says of an offset before the earliest
  retained position: never a partial run. An offset past the channel's tail is 400.

Pure: no I/O. The edge (:mod:`token_relay.edge.durablechannels`) asks the broker for the
history and writes what this module makes of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from .errors import StreamRefused
from .protocol import MAX_NAME_LENGTH

__all__ = [
    "CHANNEL_PREFIX",
    "MAX_READ_BYTES",
    "ChannelPosition",
    "Items",
    "channel_of",
    "channel_offset",
    "etag",
    "from_start",
    "items_body",
    "judge_read",
    "position_of_offset",
    "within",
]

CHANNEL_PREFIX = "__channel/"
"""Where channels are, under the streams' root: no user stream can be made there."""

MAX_READ_BYTES = 1024 * 1024
"""Bytes of frames one read returns at most (at least one frame): as a stream's read."""
OFFSET_DIGITS = 16
MAX_EPOCH_LENGTH = 64


@dataclass(frozen=True, slots=True)
class ChannelPosition:
    """A position in a channel: after the frame of ``offset`` in ``epoch``."""

    offset: int
    epoch: str


@dataclass(frozen=True, slots=True)
class Items:
    """What a read returns: the frames after ``start``, ending at ``end`` (the channel's
    tail when they were read, unless the read's budget cut it short: ``up_to_date``)."""

    frames: Sequence[str]
    start: ChannelPosition
    end: ChannelPosition
    up_to_date: bool = True


def within(items: Items, budget: int = MAX_READ_BYTES) -> Items:
    """The frames of ``items`` that fit in ``budget`` bytes of body (at least one), as a
    read that ends after the last of them: the next read goes on from there."""
    size, kept = 1, 0
    for frame in items.frames:
        size += len(frame.encode()) + 1
        if kept and size > budget:
            break
        kept += 1
    if kept == len(items.frames):
        return items
    end = ChannelPosition(items.start.offset + kept, items.start.epoch)
    return Items(items.frames[:kept], items.start, end, up_to_date=False)


def channel_of(name: str) -> str | None:
    """The channel a stream's name (its path after ``/v1/stream/``) reads, percent-decoded;
    None when the name is not under :data:`CHANNEL_PREFIX`. A name there that is no channel
    is :class:`StreamRefused` (400, ``bad_path``)."""
    if not name.startswith(CHANNEL_PREFIX):
        return None
    channel = unquote(name.removeprefix(CHANNEL_PREFIX))
    if not 1 <= len(channel) <= MAX_NAME_LENGTH:
        raise StreamRefused(
            400,
            "bad_path",
            f"a channel's stream is /v1/stream/{CHANNEL_PREFIX}CHANNEL, "
            f"CHANNEL 1 to {MAX_NAME_LENGTH} characters",
        )
    return channel


def channel_offset(position: ChannelPosition) -> str:
    """The stream offset of a channel position: ``EPOCH_OFFSET`` (the offset 16 digits), so
    that offsets of one epoch sort as the channel's offsets do."""
    return f"{position.epoch}_{position.offset:0{OFFSET_DIGITS}d}"


def position_of_offset(offset: str) -> ChannelPosition:
    """The channel position a stream offset names; :class:`StreamRefused` (400,
    ``bad_offset``) for one this relay did not make."""
    epoch, _, digits = offset.rpartition("_")
    if (
        not 1 <= len(epoch) <= MAX_EPOCH_LENGTH
        or len(digits) != OFFSET_DIGITS
        or not digits.isascii()
        or not digits.isdigit()
        or not all(c.isascii() and (c.isalnum() or c in "-_") for c in epoch)
    ):
        raise StreamRefused(
            400, "bad_offset", f"{offset[:64]!r} is not an offset: use -1, now or one we sent"
        )
    return ChannelPosition(int(digits), epoch)


def judge_read(
    since: ChannelPosition, tail: ChannelPosition, recovered: bool, frames: Sequence[str]
) -> Items:
    """A read from ``since``, given the channel's ``tail`` and what its history replays
    from there (``recovered``, ``frames``, as a ``since`` resume gets them)."""
    if since.epoch == tail.epoch and since.offset > tail.offset:
        raise StreamRefused(400, "bad_offset", "the offset is past the channel's tail")
    if not recovered:
        raise StreamRefused(
            410,
            "offset_gone",
            "the channel's history no longer holds what follows this offset "
            "(another epoch, or older than --history-size / --history-ttl): "
            "read from -1 or now",
        )
    return within(Items(frames, since, tail))


def from_start(tail: ChannelPosition, frames: Sequence[str]) -> Items:
    """A read from ``-1``: ``frames`` are the run history holds, ending at ``tail``."""
    return within(Items(frames, ChannelPosition(tail.offset - len(frames), tail.epoch), tail))


def items_body(frames: Sequence[str]) -> bytes:
    """The frames (each a JSON object) as one JSON array, the body of a JSON stream's read."""
    return ("[" + ",".join(frames) + "]").encode()


def etag(items: Items) -> str:
    """The ETag of a read: the same range of the same epoch is the same bytes."""
    return f'"{items.start.epoch}:{items.start.offset}:{items.end.offset}"'
