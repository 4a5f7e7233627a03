"""One frame the relay sends to many receivers, serialized once per kind of receiver.

A broadcast frame's bytes are the same for every WebSocket (compression is off and a
server never masks), an SSE stream needs the same few fields of it as every other
stream, and an HTTP producer keeps its JSON: each form is built by the first receiver
that needs it (:meth:`~token_relay.edge.peer.Peer.take`) and reused by the rest. Only
whole, unfragmented frames are ever written, so nothing can interleave.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ..core.events import Delta, Outgoing
from .frames import text_frame

__all__ = ["Broadcast", "Fields", "event_fields"]


class Broadcast:
    """One outgoing frame and its forms, each built once: :meth:`data` (the JSON),
    :attr:`frame` (a WebSocket's text frame) and :attr:`fields` (an SSE event's)."""

    __slots__ = ("_data", "_payload", "fields", "frame")

    def __init__(self, payload: Outgoing) -> None:
        self._payload = payload
        self._data: bytes | None = None
        self.frame: bytes | None = None
        """The WebSocket text frame, once a WebSocket built it."""
        self.fields: Fields | None = None
        """The SSE event's fields, once a stream read them."""

    def data(self) -> bytes:
        """The frame's JSON."""
        data = self._data
        if data is None:
            payload = self._payload
            if isinstance(payload, Delta):
                data = payload.render()
            else:
                data = payload.encode() if isinstance(payload, str) else payload
            self._data = data
        return data

    def websocket_frame(self) -> bytes:
        """The WebSocket text frame that carries it, built once."""
        frame = self.frame
        if frame is None:
            frame = self.frame = text_frame(self.data())
        return frame


_IDENTIFIED = frozenset({"message", "aborted", "subscribed"})


class Fields:
    """What a stream needs of a frame, read once for every stream it goes to: its event
    line, whether it carries an ``id:``, and the channel, offset and epoch it moves
    (offset -1: the channel is dropped).

    ``chunk`` is the chunk every chunked stream whose bytes for this frame are the same
    writes, built once, by the first: ``shared`` is the most channels a stream may hold for
    its event to be that one. A frame without an ``id:`` is the same event on every stream;
    one with an ``id:`` is on every stream that holds only its channel, where the ``id:``
    is that channel's new position (thousands of streams of one channel); a frame that
    drops its channel and has an ``id:`` is on none.
    """

    __slots__ = (
        "channel",
        "chunk",
        "epoch",
        "identified",
        "line",
        "offset",
        "position",
        "shared",
    )

    def __init__(
        self, line: bytes, identified: bool, channel: str | None, offset: int, epoch: str
    ) -> None:
        self.line, self.identified = line, identified
        self.channel, self.offset, self.epoch = channel, offset, epoch
        self.position = (offset, epoch)
        """The channel's position after this frame, as a stream keeps it."""
        if not identified:
            self.shared = sys.maxsize
        else:
            self.shared = 1 if offset >= 0 and channel is not None else -1
        self.chunk: bytes | None = None


def event_fields(data: bytes) -> Fields:
    """Read a serialized frame once, for every stream it goes to."""
    frame: dict[str, Any] = json.loads(data)
    kind = str(frame.get("type"))
    line = b"event: " + kind.encode() + b"\n"
    if kind in _IDENTIFIED and "offset" in frame:
        channel, offset, epoch = str(frame["channel"]), int(frame["offset"]), str(frame["epoch"])
        # A confirmation's position is before what its join replays.
        offset -= int(frame.get("replayed", 0))
        return Fields(line, kind in _IDENTIFIED, channel, offset, epoch)
    if kind == "unsubscribed":
        return Fields(line, False, str(frame["channel"]), -1, "")
    return Fields(line, False, None, 0, "")
