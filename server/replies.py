"""Frames the relay answers peers with: errors, acknowledgements, stock rejections."""

from __future__ import annotations

from .errors import ErrorCode, FrameRejected
from .protocol import Ack, AckBatch, AckEntry, ErrorFrame, encode

__all__ = ["acks_frame", "binary_rejected", "broker_rejected", "error_frame"]


def binary_rejected() -> FrameRejected:
    """A binary frame: the protocol is JSON text."""
    return FrameRejected(
        ErrorCode.BINARY_NOT_SUPPORTED, "binary frames are not supported; send JSON text frames"
    )


def error_frame(exc: FrameRejected) -> str:
    """The ``error`` frame answering a rejection, with its index and expected seq if any."""
    frame = ErrorFrame(code=exc.code, message=exc.message, id=exc.message_id)
    extra = {
        name: value
        for name, value in (("index", exc.index), ("expected", exc.expected))
        if value is not None
    }
    if extra:
        frame = frame.model_copy(update=extra)
    return encode(frame)


def acks_frame(acks: list[tuple[str, str, bool]], *, batch: bool) -> str:
    """One ``ack`` frame for a single event, one ``acks`` frame for a batch."""
    if not batch:
        channel, message_id, duplicate = acks[0]
        ack = Ack(id=message_id, channel=channel)
        return encode(ack.model_copy(update={"duplicate": True}) if duplicate else ack)
    entries = [
        AckEntry(id=message_id, channel=channel).model_copy(update={"duplicate": True})
        if duplicate
        else AckEntry(id=message_id, channel=channel)
        for channel, message_id, duplicate in acks
    ]
    return encode(AckBatch(acks=entries))


def broker_rejected(message_id: str | None) -> FrameRejected:
    """What could not be done because the broker is unreachable."""
    return FrameRejected(
        ErrorCode.BROKER_UNAVAILABLE,
        "the relay's broker is unreachable; nothing was published, retry shortly",
        message_id,
    )
