"""The resume token of an SSE stream: every channel's position, as one opaque string.

An SSE stream may carry several channels, but ``Last-Event-ID`` (what a browser's
``EventSource`` sends back when it reconnects) is one string. The token holds the
position, ``(offset, epoch)``, of every channel of the stream: base64url of a compact
JSON object ``{"channel": [offset, "epoch"], ...}``, without padding. A resume with it
subscribes to each channel ``since`` that position, exactly as a WebSocket subscriber
would.

A stream resumes only the channels it follows: positions a token holds for other channels
are dropped (they would otherwise be echoed in every event id of the stream), and a token
longer than the relay could have made for the channels followed
(:func:`max_token_chars`) is refused.

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection, Mapping

from .errors import ErrorCode, FrameRejected
from .protocol import MAX_NAME_LENGTH
from .surrogates import has_surrogate

MAX_EPOCH_LENGTH = 64

__all__ = ["MAX_TOKEN_CHARS", "decode_positions", "encode_positions", "max_token_chars"]

MAX_TOKEN_CHARS = 64 * 1024
"""A longer token is refused (a stream holds at most ``--max-channels-per-subscriber``)."""

MAX_POSITION_BYTES = 4 * MAX_NAME_LENGTH + MAX_EPOCH_LENGTH + 32
"""The most one channel's entry takes in a token's JSON: its name in UTF-8 (4 bytes a
character at most), quoted, its offset (20 digits at most), its epoch and the punctuation."""

Positions = Mapping[str, tuple[int, str]]


def encode_positions(positions: Positions) -> str:
    """The token for ``positions`` (channel to ``(offset, epoch)``)."""
    compact = json.dumps(
        {channel: [offset, epoch] for channel, (offset, epoch) in positions.items()},
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return base64.urlsafe_b64encode(compact.encode()).rstrip(b"=").decode("ascii")


def max_token_chars(channels: int) -> int:
    """The longest token this relay makes for a stream of ``channels`` channels."""
    return min(MAX_TOKEN_CHARS, -(-4 * (channels * MAX_POSITION_BYTES + 2) // 3))


def decode_positions(
    token: str, follows: Collection[str] | None = None
) -> dict[str, tuple[int, str]]:
    """The positions a token holds, only for the channels it ``follows`` if given; raises
    :class:`FrameRejected` (``invalid_frame``) for a token this relay did not make, or one
    longer than it makes for that many channels."""
    limit = MAX_TOKEN_CHARS if follows is None else max_token_chars(len(follows))
    if len(token) > limit:
        raise _bad(f"over {limit} characters")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        raise _bad("not base64url JSON") from None
    if not isinstance(value, dict):
        raise _bad("not an object")
    positions: dict[str, tuple[int, str]] = {}
    for channel, position in value.items():
        if not 1 <= len(channel) <= MAX_NAME_LENGTH:
            raise _bad("a channel name is empty or too long")
        if (
            not isinstance(position, list)
            or len(position) != 2
            or type(position[0]) is not int
            or position[0] < 0
            or not isinstance(position[1], str)
            or not 1 <= len(position[1]) <= MAX_EPOCH_LENGTH
            or has_surrogate(position[1])  # no epoch the relay made
        ):
            raise _bad(f"the position of {channel!r} is not [offset, epoch]")
        if follows is None or channel in follows:
            positions[channel] = (position[0], position[1])
    return positions


def _bad(why: str) -> FrameRejected:
    return FrameRejected(ErrorCode.INVALID_FRAME, f"the resume token is invalid: {why}")
