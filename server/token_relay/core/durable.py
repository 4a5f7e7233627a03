"""A durable stream (the Durable Streams protocol): its log, offsets, appends, reads and closure.

Theory of operation
-------------------
A stream is an append-only log of entries. A byte stream's entries are the bodies appended,
and a position is a count of bytes; a JSON stream's entries are messages
(:mod:`token_relay.core.durablejson`), and a position is a count of messages. An offset is a
position written as :data:`OFFSET_WIDTH` decimal digits, so offsets sort as positions do, and
never read ``-1`` or ``now`` (the protocol's sentinels).

A fork is a stream whose log starts at its fork position, over the log of its source (another
stream object, kept alive by the fork even once its path is deleted): a read below the fork
position is the source's, the rest is the fork's own. Offsets are the source's up to there,
then the fork's own appends go on from it.

What a log holds is counted as its entries' bytes and :data:`ENTRY_OVERHEAD` more for each
entry (:func:`counted_bytes`): that is what :attr:`Limits.max_bytes` and a store's total
bound, so that a body of many tiny messages counts what holding them costs.

Every entry point that depends on the time takes ``now`` (seconds since the epoch): the
sliding TTL is counted from the last read or write (:meth:`DurableStream.touch`). A refusal
changes nothing and is raised as :class:`~token_relay.core.errors.StreamRefused`; what an
append did is returned as an :class:`Appended`.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import NamedTuple

from .durablejson import messages_of
from .durableproducers import Producer, Producers, Verdict
from .errors import StreamRefused

__all__ = [
    "BEGINNING",
    "ENTRY_OVERHEAD",
    "OCTET_STREAM",
    "OFFSET_WIDTH",
    "TAIL",
    "Appended",
    "Chunk",
    "DurableStream",
    "Expiry",
    "Limits",
    "counted_bytes",
    "is_json",
    "media_type",
    "offset_text",
    "position_of",
]

OFFSET_WIDTH = 16
"""Digits of an offset's position: every position below 10**16 sorts as text as it does as a
number."""
OFFSET_EPOCH = "0" * OFFSET_WIDTH
"""The first part of every offset (``EPOCH_POSITION``): the same for every stream, so that
offsets look like the reference server's, which clients and the conformance suite know."""
BEGINNING = "-1"
TAIL = "now"
OCTET_STREAM = "application/octet-stream"
ENTRY_OVERHEAD = 96
"""Bytes each entry of a log counts on top of its data, toward :attr:`Limits.max_bytes` and a
store's total: what keeping one entry in this process costs beyond its bytes. A JSON message
is one entry (a JSON-array body appends one per element) and a byte stream's append is one,
so without it a 1 MiB body of ``[1,1,…]`` (524,287 entries) counted 0.5 MB and held 26 MB.

Measured for small entries (CPython 3.11, 64-bit): the entry's ``bytes`` object's header
(33), its start position's ``int`` (28) and its slot in each of the log's two lists (16):
83 bytes with the lists' spare room as tracemalloc counts them, up to 95 in the allocator's
16-byte size classes; 96 bounds both. The Redis store counts the same (its scripts take it
as an argument), so a body is judged alike on both; there an entry is a hash field and a
sorted-set member, about 165 bytes beyond its data in Redis 7.0's own memory."""
_OFFSET_FORMAT = f"{OFFSET_EPOCH}_%0{OFFSET_WIDTH}d"
"""An offset, ``%`` its position: one formatting per offset (each answer writes one)."""


def offset_text(position: int) -> str:
    """The offset of a position."""
    return _OFFSET_FORMAT % position


def position_of(offset: str) -> int:
    """The position an offset names; :class:`StreamRefused` (400) for a malformed one."""
    epoch, _, position = offset.partition("_")
    if (
        epoch != OFFSET_EPOCH
        or len(position) != OFFSET_WIDTH
        or not position.isascii()
        or not position.isdigit()
    ):
        raise StreamRefused(
            400, "bad_offset", f"{offset[:64]!r} is not an offset: use -1, now or one we sent"
        )
    return int(position)


def counted_bytes(entries: list[bytes]) -> int:
    """The bytes ``entries`` count: their data and :data:`ENTRY_OVERHEAD` for each."""
    return sum(map(len, entries)) + ENTRY_OVERHEAD * len(entries)


def media_type(content_type: str) -> str:
    """A Content-Type's media type, lower-cased, without its parameters."""
    return content_type.split(";", 1)[0].strip().lower()


def is_json(content_type: str) -> bool:
    """Whether a stream of this type is a JSON stream (messages, not bytes)."""
    return media_type(content_type) == "application/json"


@dataclass(frozen=True, slots=True)
class Expiry:
    """When a stream expires: a sliding TTL (seconds after its last read or write), an
    absolute time, or never."""

    ttl: int | None = None
    expires_at: float | None = None
    """Seconds since the epoch."""
    expires_at_text: str | None = None
    """``Stream-Expires-At`` as it was given (HEAD returns it)."""

    def deadline(self, touched: float) -> float | None:
        """When a stream last read or written at ``touched`` expires, or None."""
        if self.ttl is not None:
            return touched + self.ttl
        return self.expires_at


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one stream."""

    max_bytes: int
    """Bytes of its own log (a fork's inherited data is its source's), each entry counted
    with :data:`ENTRY_OVERHEAD` (:func:`counted_bytes`)."""
    max_producers: int
    """Idempotent producers remembered (the least recent is forgotten past it)."""
    max_read_bytes: int = 1024 * 1024
    """Bytes one read returns at most (a JSON read always returns at least one message)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """What a read returns: its entries (or slices of them) and the position after them."""

    entries: tuple[bytes, ...]
    next: int


class Appended(NamedTuple):
    """What an accepted append (or close) did (a named tuple: one is made per append)."""

    next: int
    """The tail position after it."""
    closed: bool
    """Whether the stream is closed now."""
    before: int
    """The tail position before it (the stream as the append found it)."""
    duplicate: bool = False
    """A producer's retry, or a close of a closed stream: nothing was appended."""
    producer_epoch: int | None = None
    producer_seq: int | None = None
    """For a producer: its epoch and the highest seq accepted in it."""
    added_bytes: int = 0
    """The bytes it added to the stream's count (:func:`counted_bytes`)."""


class DurableStream:
    """One stream's log and state."""

    def __init__(
        self,
        *,
        stream_id: int,
        content_type: str,
        expiry: Expiry,
        limits: Limits,
        now: float,
        source: DurableStream | None = None,
        fork_position: int = 0,
    ) -> None:
        self.stream_id = stream_id
        """Unique in its store, for ETags: a path deleted and created again is another."""
        self.content_type = content_type
        self.media_type = media_type(content_type)
        self.json = self.media_type == "application/json"
        self.expiry = expiry
        self.limits = limits
        self.touched = now
        self.source = source
        self.fork_position = fork_position
        self.tail = fork_position
        self.own_bytes = 0
        """The bytes its own log counts (:func:`counted_bytes`)."""
        self.closed = False
        self.closed_by: Producer | None = None
        self.last_stream_seq: str | None = None
        self.producers = Producers(limits.max_producers)
        self.forks = 0
        """Live forks whose source this is."""
        self.deleted = False
        """Deleted while forks still read it (410 at its path, until they are gone)."""
        self._starts: list[int] = []
        self._entries: list[bytes] = []

    # ------------------------------------------------------------------ time

    def touch(self, now: float) -> None:
        """A read or a write: the sliding TTL starts again."""
        self.touched = now

    def expired(self, now: float) -> bool:
        """Whether its TTL or expiry time has passed."""
        expiry = self.expiry  # Expiry.deadline, without a call: each request asks this
        if expiry.ttl is not None:
            return now >= self.touched + expiry.ttl
        return expiry.expires_at is not None and now >= expiry.expires_at

    # ------------------------------------------------------------------ reads

    def read(self, position: int, end: int | None = None, budget: int | None = None) -> Chunk:
        """Entries from ``position`` up to ``end`` (the tail by default), at most ``budget``
        bytes (:attr:`Limits.max_read_bytes`); 400 past the tail."""
        end = self.tail if end is None else min(end, self.tail)
        if position > self.tail:
            raise StreamRefused(400, "bad_offset", "the offset is past the stream's tail")
        budget = self.limits.max_read_bytes if budget is None else budget
        found: list[bytes] = []
        if position < self.fork_position and self.source is not None:
            inherited = self.source.read(position, min(end, self.fork_position), budget)
            found.extend(inherited.entries)
            position = inherited.next
            budget -= sum(len(entry) for entry in inherited.entries)
            if position < self.fork_position:
                return Chunk(tuple(found), position)
        index = bisect_right(self._starts, position) - 1
        if index < 0:
            index = 0
        while index < len(self._entries) and position < end:
            start, entry = self._starts[index], self._entries[index]
            index += 1
            if self.json:
                if start < position:
                    continue
                if found and len(entry) > budget:
                    break
                found.append(entry)
                budget -= len(entry)
                position = start + 1
            else:
                if start + len(entry) <= position:
                    continue
                piece = entry[position - start : end - start]
                if len(piece) > budget:
                    piece = piece[: max(budget, 0 if found else 1)]
                if not piece:
                    break
                found.append(piece)
                budget -= len(piece)
                position += len(piece)
            if budget <= 0:
                break
        return Chunk(tuple(found), position)

    def position_past(self, position: int, count: int) -> int:
        """The position ``count`` entries (JSON) or bytes past ``position``; 400 past the
        tail (a fork's ``Stream-Fork-Sub-Offset``)."""
        target = position + count
        if target > self.tail:
            raise StreamRefused(400, "bad_fork_offset", "the fork offset is past the tail")
        return target

    # ------------------------------------------------------------------ writes

    def entries_of(self, body: bytes, *, creating: bool) -> list[bytes]:
        """The entries a body appends: a JSON stream's messages (validated, one level of
        array flattened; ``[]`` is refused on append), or the body itself."""
        if not self.json:
            return [body] if body else []
        if not body:
            return []
        messages = messages_of(body)
        if not messages and not creating:
            raise StreamRefused(400, "empty_batch", "an empty JSON array appends nothing")
        return messages

    def check_room(self, entries: list[bytes], room: int) -> int:
        """The bytes the entries count (:func:`counted_bytes`); 413 past the stream's bound,
        507 past ``room`` (what the store has left)."""
        size = counted_bytes(entries)
        self.check_size(size, room)
        return size

    def check_size(self, size: int, room: int) -> None:
        """413 if ``size`` more bytes pass the stream's bound, 507 past ``room``."""
        if self.own_bytes + size > self.limits.max_bytes:
            raise StreamRefused(
                413, "stream_full", f"the stream would pass {self.limits.max_bytes} bytes"
            )
        if size > room:
            raise StreamRefused(507, "store_full", "the relay holds all the stream data it may")

    def extend(self, entries: list[bytes]) -> int:
        """Append entries, without a check (:meth:`append` checks); the bytes they count
        (:func:`counted_bytes`)."""
        for entry in entries:
            self._starts.append(self.tail)
            self._entries.append(entry)
            self.tail += 1 if self.json else len(entry)
        added = counted_bytes(entries)
        self.own_bytes += added
        return added

    def logged(self) -> list[tuple[int, bytes]]:
        """The entries this object holds, each with its start position (a store that keeps
        the log elsewhere writes what an append added here)."""
        return list(zip(self._starts, self._entries, strict=True))

    def hold(self, entries: list[tuple[int, bytes]]) -> None:
        """Hold these entries of the log (with their start positions, in order) for
        :meth:`read`: a store that keeps the log elsewhere reads a window of it into a
        stream whose state it loaded."""
        self._starts = [start for start, _ in entries]
        self._entries = [entry for _, entry in entries]

    def append(
        self,
        body: bytes,
        *,
        content_type: str,
        close: bool,
        now: float,
        room: int,
        stream_seq: str | None = None,
        producer: Producer | None = None,
    ) -> Appended:
        """A ``POST``: append ``body`` (and close, with ``close``), by the protocol's rules,
        in its order of precedence: a closed stream first, then the content type, then the
        producer, then ``Stream-Seq``."""
        if self.closed:
            if producer is not None and producer == self.closed_by:
                return self._duplicate(producer)
            if not body and close:
                return Appended(self.tail, True, self.tail, duplicate=True)
            raise StreamRefused(
                409,
                "stream_closed",
                "the stream is closed: nothing more can be appended",
                (("Stream-Closed", "true"), ("Stream-Next-Offset", offset_text(self.tail))),
            )
        if not body and not close:
            raise StreamRefused(400, "empty_body", "an append needs a body (or Stream-Closed)")
        if body:
            if not content_type:
                raise StreamRefused(400, "content_type_required", "an append needs Content-Type")
            if content_type != self.content_type and media_type(content_type) != self.media_type:
                raise StreamRefused(
                    409,
                    "content_type_mismatch",
                    f"the stream's type is {self.content_type}, not {content_type}",
                )
        if producer is not None and self.producers.judge(producer) is Verdict.DUPLICATE:
            self.producers.touch(producer.id)
            return self._duplicate(producer)
        if (
            stream_seq is not None
            and self.last_stream_seq is not None
            and stream_seq <= self.last_stream_seq
        ):
            raise StreamRefused(
                409,
                "stream_seq_regression",
                f"Stream-Seq {stream_seq[:64]!r} is not past {self.last_stream_seq[:64]!r}",
            )
        before = self.tail
        if self.json or not body:
            entries = self.entries_of(body, creating=False)
            self.check_room(entries, room)
            added = self.extend(entries)
        else:  # a byte stream's body is one entry: checked and logged as extend would
            added = len(body) + ENTRY_OVERHEAD
            self.check_size(added, room)
            self._starts.append(before)
            self._entries.append(body)
            self.tail = before + len(body)
            self.own_bytes += added
        self.touched = now  # touch(), inline
        if stream_seq is not None:
            self.last_stream_seq = stream_seq
        if producer is not None:
            self.producers.record(producer)
        if close:
            self.closed = True
            self.closed_by = producer
        return Appended(
            self.tail,
            self.closed,
            before,
            producer_epoch=None if producer is None else producer.epoch,
            producer_seq=None if producer is None else producer.seq,
            added_bytes=added,
        )

    def _duplicate(self, producer: Producer) -> Appended:
        return Appended(
            self.tail,
            self.closed,
            self.tail,
            duplicate=True,
            producer_epoch=self.producers.epoch(producer.id),
            producer_seq=self.producers.last_seq(producer.id),
        )

    def etag(self, start: int, end: int) -> str:
        """The ETag of a read from ``start`` to ``end``: it changes with the data and with
        the closure (``:c``)."""
        closed = ":c" if self.closed and end == self.tail else ""
        return f'"{self.stream_id}:{offset_text(start)}:{offset_text(end)}{closed}"'
