"""The durable streams by path: the async store contract, and the streams of one process
(create, fork, append, delete and expiry).

:class:`DurableStore` is the async contract the HTTP edge holds a store to; :class:`MemoryStore`
keeps the streams in this process, synchronously (:class:`LocalStore` is the contract over
it), and :mod:`token_relay.brokers.redis.durable` keeps them in Redis for every process.
Both keep the protocol's rules of :mod:`token_relay.core.durable`, and the rules of a ``PUT``
(:func:`plan_create`); the store adds what concerns more than one stream:

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

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from .durable import (
    OCTET_STREAM,
    Appended,
    Chunk,
    DurableStream,
    Expiry,
    Limits,
    media_type,
    position_of,
)
from .durableproducers import Producer
from .errors import StreamRefused

__all__ = [
    "Create",
    "Created",
    "DurableStore",
    "LocalStore",
    "MemoryStore",
    "plan_create",
    "same_request",
]


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
    """What the HTTP edge asks of a store of durable streams (in this process, or shared
    through Redis). A change made elsewhere wakes the readers here through :attr:`wake`,
    for the paths :meth:`watch` was asked for."""

    max_total_bytes: int
    """Bytes all streams' data may take (the edge sets it from what ``--max-memory-bytes``
    leaves)."""

    @property
    def total_bytes(self) -> int:
        """Bytes all streams' data take now (as last counted, for a shared store)."""

    shared: bool
    """Whether other relay processes serve the same streams."""
    wake: Callable[[str], None]
    """Called with a path changed by another process (one :meth:`watch` was asked for)."""

    def __len__(self) -> int:
        """Streams held, tombstones included (as last counted, for a shared store)."""

    def tail_of(self, path: str) -> int | None:
        """The tail position of the live stream at ``path``, or None (none, or a tombstone);
        expiry is not applied. A shared store answers None: subscriptions are local."""

    def paths(self) -> list[str]:
        """The paths of every live stream (of this process's store only)."""

    async def create(self, path: str, request: Create, now: float) -> Created:
        """Create a stream (or a fork), or confirm an existing one with the same
        configuration."""

    async def get(self, path: str, now: float, *, touch: bool = False) -> DurableStream:
        """The live stream at ``path``: 404 if there is none, 410 for a tombstone; with
        ``touch``, its sliding TTL starts again (a read)."""

    async def read(self, stream: DurableStream, position: int) -> Chunk:
        """What ``stream`` (as :meth:`get` gave it) holds from ``position``."""

    async def append(
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

    async def delete(self, path: str, now: float) -> None:
        """Delete the stream at ``path`` (a tombstone while forks read it)."""

    async def expire(self, now: float) -> list[str]:
        """Drop every stream past its expiry; the paths that went."""

    async def watch(self, path: str) -> bool:
        """Make sure a change at ``path`` made elsewhere calls :attr:`wake`; True when that
        starts now (the caller looks again: a change may have come before)."""

    async def unwatch(self, keep: set[str]) -> None:
        """Stop watching every path but ``keep``."""

    async def close(self) -> None:
        """Let go of what the store holds open."""


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
        source = None if request.forked_from is None else self._lookup(request.forked_from, now)
        created = plan_create(
            path,
            request,
            existing=existing,
            made=None if existing is None else self.requests.get(existing.stream_id),
            source=source,
            stream_id=self._next_id,
            limits=self.limits,
            streams=len(self.streams),
            max_streams=self.max_streams,
            room=self.max_total_bytes - self.total_bytes,
            now=now,
        )
        if not created.created:
            return created
        stream = created.stream
        self._next_id += 1
        self.requests[stream.stream_id] = replace(request, body=b"")  # its data is the log's
        self.total_bytes += stream.own_bytes
        self.streams[path] = stream
        self.path_of[stream.stream_id] = path
        if stream.source is not None:
            stream.source.forks += 1
        return created

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


def plan_create(
    path: str,
    request: Create,
    *,
    existing: DurableStream | None,
    made: Create | None,
    source: DurableStream | None,
    stream_id: int,
    limits: Limits,
    streams: int,
    max_streams: int,
    room: int,
    now: float,
) -> Created:
    """The rules of a ``PUT`` at ``path``, for any store: ``existing`` is what is at the path
    (``made`` by its first ``PUT``), ``source`` what is at ``request.forked_from`` (expiry
    applied to both), ``streams`` the paths in use and ``room`` the bytes left. The stream
    confirmed (``created`` False), or a new one under ``stream_id`` with its body appended
    and its closure set, that the store is to keep (and its source's forks to count)."""
    if existing is not None:
        if existing.deleted:
            raise StreamRefused(
                409, "stream_gone", f"the stream at {path} was deleted; its forks live on"
            )
        if made is None or not same_request(existing, made, request):
            raise StreamRefused(
                409, "stream_exists", f"a stream with another configuration is at {path}"
            )
        return Created(existing, created=False)
    if streams >= max_streams:
        raise StreamRefused(507, "too_many_streams", "the relay holds all the streams it may")
    position = 0
    content_type = request.content_type or OCTET_STREAM
    expiry = request.expiry
    if request.forked_from is None and request.fork_sub_offset_given:
        raise StreamRefused(
            400, "bad_fork_offset", "Stream-Fork-Sub-Offset needs Stream-Forked-From"
        )
    if request.forked_from is None and request.fork_offset is not None:
        raise StreamRefused(400, "bad_fork_offset", "Stream-Fork-Offset needs Stream-Forked-From")
    if request.forked_from is not None:
        if source is None:
            raise StreamRefused(404, "stream_not_found", f"no stream at {request.forked_from}")
        if source.deleted:
            raise StreamRefused(409, "stream_gone", f"the source {request.forked_from} was deleted")
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
            try:
                position = position_of(request.fork_offset)
            except StreamRefused:
                raise StreamRefused(
                    400,
                    "bad_fork_offset",
                    f"Stream-Fork-Offset {request.fork_offset[:64]!r} is not an offset we sent",
                ) from None
            if position > source.tail:
                raise StreamRefused(
                    400, "bad_fork_offset", "the fork offset is past the source's tail"
                )
        if request.fork_sub_offset:
            position = source.position_past(position, request.fork_sub_offset)
        if expiry.ttl is None and expiry.expires_at is None:
            expiry = source.expiry
    stream = DurableStream(
        stream_id=stream_id,
        content_type=content_type,
        expiry=expiry,
        limits=limits,
        now=now,
        source=source,
        fork_position=position,
    )
    entries = stream.entries_of(request.body, creating=True)
    stream.check_room(entries, room)
    stream.extend(entries)
    stream.closed = request.closed
    return Created(stream, created=True)


def same_request(stream: DurableStream, made: Create, request: Create) -> bool:
    """Whether a ``PUT`` asks for the stream that is there (``made`` by its first ``PUT``):
    type, expiry, closure and fork alike."""
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


class LocalStore:
    """The :class:`DurableStore` contract over a :class:`MemoryStore`: the streams of this
    process (``--broker memory://``). Nothing is elsewhere, so nothing is watched."""

    shared = False

    def __init__(self, memory: MemoryStore) -> None:
        self.memory = memory
        self.wake: Callable[[str], None] = _nobody

    @property
    def max_total_bytes(self) -> int:
        return self.memory.max_total_bytes

    @max_total_bytes.setter
    def max_total_bytes(self, value: int) -> None:
        self.memory.max_total_bytes = value

    @property
    def total_bytes(self) -> int:
        return self.memory.total_bytes

    def __len__(self) -> int:
        return len(self.memory)

    def tail_of(self, path: str) -> int | None:
        return self.memory.tail_of(path)

    def paths(self) -> list[str]:
        return self.memory.paths()

    async def create(self, path: str, request: Create, now: float) -> Created:
        return self.memory.create(path, request, now)

    async def get(self, path: str, now: float, *, touch: bool = False) -> DurableStream:
        stream = self.memory.get(path, now)
        if touch:
            stream.touch(now)
        return stream

    async def read(self, stream: DurableStream, position: int) -> Chunk:
        return stream.read(position)

    async def append(
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
        return self.memory.append(
            path,
            body,
            content_type=content_type,
            close=close,
            now=now,
            stream_seq=stream_seq,
            producer=producer,
        )

    async def delete(self, path: str, now: float) -> None:
        self.memory.delete(path, now)

    async def expire(self, now: float) -> list[str]:
        return self.memory.expire(now)

    async def watch(self, path: str) -> bool:
        return False

    async def unwatch(self, keep: set[str]) -> None:
        return None

    async def close(self) -> None:
        return None


def _nobody(path: str) -> None:
    """No reader is woken from elsewhere: nothing is elsewhere."""
