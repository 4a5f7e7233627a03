"""The durable streams of one relay process, by path: create, fork, append, delete and expiry.

:class:`DurableStore` is the contract the HTTP edge holds a store to; :class:`MemoryStore`
keeps the streams in this process (a store shared through Redis is to follow it). Both keep
the protocol's rules of :mod:`token_relay.core.durable`; the store adds what concerns more
than one stream:

* **Paths.** A path names one stream at a time. A deleted (or expired) stream's path is free
  again at once, unless forks still read the stream: then the path is a tombstone, answered
  410 (and 409 to a ``PUT``) until the last fork is gone, and the stream's data stays for
  the forks' reads.
* **Expiry.** A stream past its TTL or expiry time is gone for every request from then on
  (checked on every access, and swept by :meth:`MemoryStore.expire`).
* **Bounds.** At most ``max_streams`` paths (tombstones included): one more ``PUT`` is
  refused with 507 (``too_many_streams``). At most ``max_total_bytes`` of stream data in
  all: an append (or create) past it is refused with 507 (``store_full``), and one stream's
  own past :attr:`~token_relay.core.durable.Limits.max_bytes` with 413 (``stream_full``).
  Nothing is ever dropped to make room: a refusal changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

from .durable import (
    OCTET_STREAM,
    Appended,
    DurableStream,
    Expiry,
    Limits,
    media_type,
    position_of,
)
from .durableproducers import Producer
from .errors import StreamRefused

__all__ = ["Create", "Created", "DurableStore", "MemoryStore"]


@dataclass(frozen=True, slots=True)
class Create:
    """A ``PUT``: what the new stream is to be."""

    content_type: str | None = None
    """None when the request named none (a stream is then octet-stream, a fork its
    source's type)."""
    expiry: Expiry = field(default_factory=Expiry)
    closed: bool = False
    body: bytes = b""
    forked_from: str | None = None
    """The source's path (``Stream-Forked-From``), for a fork."""
    fork_offset: str | None = None
    """``Stream-Fork-Offset``; None: the source's tail."""
    fork_sub_offset: int = 0
    fork_sub_offset_given: bool = False
    """Whether ``Stream-Fork-Sub-Offset`` was sent (0 included)."""


@dataclass(frozen=True, slots=True)
class Created:
    """What a ``PUT`` found or made."""

    stream: DurableStream
    created: bool
    """False: the stream existed with the same configuration (200, not 201)."""


class DurableStore(Protocol):
    """What the HTTP edge asks of a store of durable streams."""

    max_total_bytes: int
    """Bytes all streams' data may take (the edge sets it from what ``--max-memory-bytes``
    leaves)."""
    total_bytes: int
    """Bytes all streams' data take now."""

    def __len__(self) -> int:
        """Streams held, tombstones included."""

    def tail_of(self, path: str) -> int | None:
        """The tail position of the live stream at ``path``, or None (none, or a tombstone);
        expiry is not applied."""

    def paths(self) -> list[str]:
        """The paths of every live stream."""

    def create(self, path: str, request: Create, now: float) -> Created:
        """Create a stream (or a fork), or confirm an existing one with the same
        configuration."""

    def get(self, path: str, now: float) -> DurableStream:
        """The live stream at ``path``: 404 if there is none, 410 for a tombstone."""

    def append(
        self,
        path: str,
        body: bytes,
        *,
        content_type: str,
        close: bool,
        now: float,
        stream_seq: str | None = None,
        producer: Producer | None = None,
    ) -> Appended:
        """Append to (and maybe close) the stream at ``path``."""

    def delete(self, path: str, now: float) -> None:
        """Delete the stream at ``path`` (a tombstone while forks read it)."""

    def expire(self, now: float) -> list[str]:
        """Drop every stream past its expiry; the paths that went."""


class MemoryStore:
    """Durable streams kept in this process."""

    def __init__(self, *, max_streams: int, max_total_bytes: int, limits: Limits) -> None:
        self.max_streams = max_streams
        self.max_total_bytes = max_total_bytes
        self.limits = limits
        self.streams: dict[str, DurableStream] = {}
        """Every path in use, tombstones included."""
        self.path_of: dict[int, str] = {}
        """The path of each stream still at one, by stream id."""
        self.requests: dict[int, Create] = {}
        """The ``PUT`` that created each stream still at a path, by stream id (a second
        ``PUT`` is compared with it)."""
        self.total_bytes = 0
        """Bytes of every stream's own log, tombstones' and unreachable sources' included."""
        self._next_id = 1

    def __len__(self) -> int:
        return len(self.streams)

    def tail_of(self, path: str) -> int | None:
        """The tail position of the live stream at ``path``, or None."""
        stream = self.streams.get(path)
        return None if stream is None or stream.deleted else stream.tail

    def paths(self) -> list[str]:
        """The paths of every live stream."""
        return [path for path, stream in self.streams.items() if not stream.deleted]

    # ------------------------------------------------------------------ lookups

    def _lookup(self, path: str, now: float) -> DurableStream | None:
        """The stream at ``path`` (a tombstone too), after its expiry is applied."""
        stream = self.streams.get(path)
        if stream is not None and not stream.deleted and stream.expired(now):
            self._drop(path, stream)
            stream = self.streams.get(path)
        return stream

    def get(self, path: str, now: float) -> DurableStream:
        """The live stream at ``path``: 404 if there is none, 410 for a tombstone."""
        stream = self._lookup(path, now)
        if stream is None:
            raise StreamRefused(404, "stream_not_found", f"no stream at {path}")
        if stream.deleted:
            raise StreamRefused(410, "stream_gone", f"the stream at {path} was deleted")
        return stream

    # ------------------------------------------------------------------ create

    def create(self, path: str, request: Create, now: float) -> Created:
        """A ``PUT`` at ``path``: 201 for a new stream, 200 for one that exists with the same
        configuration, 409 for one that differs (or a tombstone)."""
        existing = self._lookup(path, now)
        if existing is not None:
            if existing.deleted:
                raise StreamRefused(
                    409, "stream_gone", f"the stream at {path} was deleted; its forks live on"
                )
            if not self._same(existing, self.requests[existing.stream_id], request):
                raise StreamRefused(
                    409, "stream_exists", f"a stream with another configuration is at {path}"
                )
            return Created(existing, created=False)
        if len(self.streams) >= self.max_streams:
            raise StreamRefused(507, "too_many_streams", "the relay holds all the streams it may")
        source, position = None, 0
        content_type = request.content_type or OCTET_STREAM
        expiry = request.expiry
        if request.forked_from is None and request.fork_sub_offset_given:
            raise StreamRefused(
                400, "bad_fork_offset", "Stream-Fork-Sub-Offset needs Stream-Forked-From"
            )
        if request.forked_from is None and request.fork_offset is not None:
            raise StreamRefused(
                400, "bad_fork_offset", "Stream-Fork-Offset needs Stream-Forked-From"
            )
        if request.forked_from is not None:
            found = self._lookup(request.forked_from, now)
            if found is not None and found.deleted:
                raise StreamRefused(
                    409, "stream_gone", f"the source {request.forked_from} was deleted"
                )
            source = self.get(request.forked_from, now)
            if request.content_type is None:
                content_type = source.content_type
            elif media_type(request.content_type) != media_type(source.content_type):
                raise StreamRefused(
                    409,
                    "content_type_mismatch",
                    f"a fork's type is its source's, {source.content_type}",
                )
            position = source.tail
            if request.fork_offset is not None:
                position = position_of(request.fork_offset)
                if position > source.tail:
                    raise StreamRefused(
                        400, "bad_fork_offset", "the fork offset is past the source's tail"
                    )
            if request.fork_sub_offset:
                position = source.position_past(position, request.fork_sub_offset)
            if expiry.ttl is None and expiry.expires_at is None:
                expiry = source.expiry
        stream = DurableStream(
            stream_id=self._next_id,
            content_type=content_type,
            expiry=expiry,
            limits=self.limits,
            now=now,
            source=source,
            fork_position=position,
        )
        entries = stream.entries_of(request.body, creating=True)
        size = stream.check_room(entries, self.max_total_bytes - self.total_bytes)
        self._next_id += 1
        stream.extend(entries)
        stream.closed = request.closed
        self.requests[stream.stream_id] = replace(request, body=b"")  # its data is the log's
        self.total_bytes += size
        self.streams[path] = stream
        self.path_of[stream.stream_id] = path
        if source is not None:
            source.forks += 1
        return Created(stream, created=True)

    @staticmethod
    def _same(stream: DurableStream, made: Create, request: Create) -> bool:
        """Whether a ``PUT`` asks for the stream that is there (``made`` by its first
        ``PUT``): type, expiry, closure and fork alike."""
        wanted_type = request.content_type or (
            stream.content_type if request.forked_from is not None else OCTET_STREAM
        )
        return (
            media_type(wanted_type) == media_type(stream.content_type)
            and request.expiry.ttl == made.expiry.ttl
            and request.expiry.expires_at == made.expiry.expires_at
            and request.closed == stream.closed
            and request.forked_from == made.forked_from
            and (request.forked_from is None or request.fork_offset in (None, made.fork_offset))
            and request.fork_sub_offset == made.fork_sub_offset
        )

    # ------------------------------------------------------------------ append

    def append(
        self,
        path: str,
        body: bytes,
        *,
        content_type: str,
        close: bool,
        now: float,
        stream_seq: str | None = None,
        producer: Producer | None = None,
    ) -> Appended:
        """A ``POST`` at ``path``."""
        stream = self.get(path, now)
        appended = stream.append(
            body,
            content_type=content_type,
            close=close,
            now=now,
            room=self.max_total_bytes - self.total_bytes,
            stream_seq=stream_seq,
            producer=producer,
        )
        self.total_bytes += appended.added_bytes
        if appended.duplicate:
            stream.touch(now)
        return appended

    # ------------------------------------------------------------------ delete

    def delete(self, path: str, now: float) -> None:
        """A ``DELETE`` at ``path``: 404 if none, 410 for a tombstone."""
        stream = self.get(path, now)
        self._drop(path, stream)

    def expire(self, now: float) -> list[str]:
        """Drop every stream past its expiry; the paths that went (tombstones stay)."""
        gone = [
            path
            for path, stream in self.streams.items()
            if not stream.deleted and stream.expired(now)
        ]
        for path in gone:
            self._drop(path, self.streams[path])
        return gone

    def _drop(self, path: str, stream: DurableStream) -> None:
        """Delete (or expire) a stream: a tombstone while it has forks, else gone, and its
        source's tombstone with it once its last fork is gone."""
        if stream.forks > 0:
            stream.deleted = True
            return
        self.streams.pop(path, None)
        self.path_of.pop(stream.stream_id, None)
        self.requests.pop(stream.stream_id, None)
        self.total_bytes -= stream.own_bytes
        source = stream.source
        while source is not None:
            source.forks -= 1
            if source.forks > 0 or not source.deleted:
                break
            source_path = self.path_of.pop(source.stream_id, None)
            self.requests.pop(source.stream_id, None)
            if source_path is not None:
                self.streams.pop(source_path, None)
            self.total_bytes -= source.own_bytes
            source = source.source
