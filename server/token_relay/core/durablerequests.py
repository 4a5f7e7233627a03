"""A Durable Streams request's header values, read by the protocol's rules: ``Stream-TTL``,
``Stream-Expires-At``, ``Stream-Closed``, the producer headers, and the live cursor.

Each reader takes the header's value ('' when it was not sent) and returns what it means,
or raises :class:`~token_relay.core.errors.StreamRefused` (400) for a malformed one. Nothing
here reads a clock: :func:`cursor` takes ``now``, and its jitter.
"""

from __future__ import annotations

import re
from datetime import datetime

from .durable import Expiry
from .durableproducers import MAX_PRODUCER_NUMBER, Producer
from .errors import StreamRefused

__all__ = [
    "CURSOR_EPOCH",
    "CURSOR_INTERVAL",
    "MAX_VALUE_LENGTH",
    "bounded",
    "closed_of",
    "cursor",
    "expiry_of",
    "producer_of",
    "sub_offset_of",
]

_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
MAX_VALUE_LENGTH = 256
"""Characters a ``Producer-Id``, a ``Stream-Seq`` or a ``Content-Type`` may have: each is
kept per stream (a producer's id per producer), so each is bounded."""
MAX_TTL_DIGITS = 12
"""Digits a ``Stream-TTL`` may have (over 30,000 years)."""
CURSOR_EPOCH = 1728432000.0
"""2024-10-09T00:00:00Z: where the live cursor's intervals are counted from."""
CURSOR_INTERVAL = 20.0
"""Seconds of one cursor interval."""


def _decimal(text: str) -> bool:
    return text.isascii() and _DECIMAL.fullmatch(text) is not None


def expiry_of(ttl: str, expires_at: str) -> Expiry:
    """``Stream-TTL`` (decimal seconds, no sign, no leading zero) or ``Stream-Expires-At``
    (RFC 3339); both at once is refused."""
    if ttl and expires_at:
        raise StreamRefused(400, "bad_expiry", "give Stream-TTL or Stream-Expires-At, not both")
    if ttl:
        if not _decimal(ttl) or len(ttl) > MAX_TTL_DIGITS:
            raise StreamRefused(
                400, "bad_ttl", "Stream-TTL is a whole number of seconds, like 3600"
            )
        return Expiry(ttl=int(ttl))
    if expires_at:
        if not _RFC3339.fullmatch(expires_at):
            raise StreamRefused(400, "bad_expires_at", "Stream-Expires-At is an RFC 3339 time")
        try:
            moment = datetime.fromisoformat(expires_at.replace("z", "Z").replace("t", "T"))
        except ValueError:
            raise StreamRefused(
                400, "bad_expires_at", "Stream-Expires-At is an RFC 3339 time"
            ) from None
        return Expiry(expires_at=moment.timestamp(), expires_at_text=expires_at)
    return Expiry()


def closed_of(value: str) -> bool:
    """``Stream-Closed``: only ``true`` (any case) counts; any other value is ignored."""
    return value.strip().lower() == "true"


def _number(name: str, text: str) -> int:
    if not _decimal(text) or len(text) > 16 or int(text) > MAX_PRODUCER_NUMBER:
        raise StreamRefused(
            400,
            "bad_producer",
            f"{name} is a whole number from 0 to {MAX_PRODUCER_NUMBER}",
        )
    return int(text)


def producer_of(producer_id: str | None, epoch: str | None, seq: str | None) -> Producer | None:
    """The producer headers (each None when not sent): all three or none, a non-empty id,
    and whole numbers."""
    given = (producer_id, epoch, seq)
    if all(value is None for value in given):
        return None
    if producer_id is None or epoch is None or seq is None:
        raise StreamRefused(
            400,
            "bad_producer",
            "give Producer-Id, Producer-Epoch and Producer-Seq together",
        )
    if not producer_id.strip() or len(producer_id) > MAX_VALUE_LENGTH:
        raise StreamRefused(
            400, "bad_producer", f"Producer-Id is 1 to {MAX_VALUE_LENGTH} characters"
        )
    return Producer(
        producer_id, _number("Producer-Epoch", epoch.strip()), _number("Producer-Seq", seq.strip())
    )


def bounded(name: str, value: str | None) -> str | None:
    """A ``Stream-Seq`` or ``Content-Type`` of at most :data:`MAX_VALUE_LENGTH` characters
    (None when not sent)."""
    if value is not None and len(value) > MAX_VALUE_LENGTH:
        code = "bad_stream_seq" if name == "Stream-Seq" else "bad_content_type"
        raise StreamRefused(400, code, f"{name} is at most {MAX_VALUE_LENGTH} characters")
    return value


def sub_offset_of(text: str) -> int:
    """``Stream-Fork-Sub-Offset``: a whole number, 0 when not sent."""
    if not text:
        return 0
    if not _decimal(text) or len(text) > 16:
        raise StreamRefused(400, "bad_fork_offset", "Stream-Fork-Sub-Offset is a whole number")
    return int(text)


def cursor(now: float, given: str, jitter: int) -> str:
    """The cursor of a live response: the current interval's number, or, if the client's
    ``cursor`` is not behind it, the client's plus ``jitter`` intervals (at least 1), so
    a cursor never goes back and never repeats."""
    interval = int((now - CURSOR_EPOCH) // CURSOR_INTERVAL)
    if given.isascii() and given.isdigit() and len(given) <= 18:
        client = int(given)
        if client >= interval:
            return str(client + max(jitter, 1))
    return str(interval)
