"""The durable streams kept in Redis (``--broker redis://``): every relay process on the
server serves every stream, under the same rules as one process.

Theory of operation
-------------------
A stream has an id (``INCR tr:ds:next``), and its path maps to it (``tr:ds:p:PATH``). Its
fields (``tr:ds:s:ID``) hold its protocol state as JSON (type, expiry, tail, closure,
``Stream-Seq``, producers: :class:`StreamRecord`) and a version; its entries are a hash by
index (``tr:ds:l:ID``), with each index scored by its start position (``tr:ds:a:ID``), so a
read by offset finds its first entry in one step (:data:`~.durablescripts.READ`).

A change is read, judged and written: the stream's state is read as one cut with its sources
(:data:`~.durablescripts.LOOKUP`), the core's rules decide
(:meth:`~token_relay.core.durable.DurableStream.append`,
:func:`~token_relay.core.durablestore.plan_create`), and one script writes the new state and
entries only if the stream is still at the version read (:data:`~.durablescripts.COMMIT`),
else the change is judged again on what is there now. So producer fencing, producer and
``Stream-Seq`` sequence checks and closure hold across processes: two appends never both
pass a check on the same state. A refusal is answered only if the stream has not changed
since it was read (else it is judged again too).

A process's writes to one path go one at a time; the appends that queue meanwhile are judged
together, in the order they came, on one read, and written by one ``COMMIT``: each on the
state the ones before it left, as if it came alone right after them (a refusal among them
is answered once the group's writes are in, or, if none of them wrote, once the stream is
found unchanged). Two round trips serve a group, not each append.

Bounds, all counted in Redis within the write's script, so they hold for the cluster: at most
``--max-durable-streams`` paths (``tr:ds:count``), ``--max-durable-stream-bytes`` per stream,
and as many bytes in all (``tr:ds:bytes``) as the writing process's ``--max-memory-bytes``
leaves; each entry counts its data and :data:`~token_relay.core.durable.ENTRY_OVERHEAD`, as
in one process. A write past one is refused (507 or 413); nothing is dropped to make room.

Expiry: each stream's expiry time is in ``tr:ds:deadlines``; a lookup past it, or the sweep,
drops it (:data:`~.durablescripts.DROP`). Its keys also expire in Redis
:data:`~.durablescripts.GRACE` seconds after it (never while forks read it).
Redis down: every request is answered 503 (``broker_unavailable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from ...core.durable import (
    ENTRY_OVERHEAD,
    Appended,
    Chunk,
    DurableStream,
    Expiry,
    Limits,
)
from ...core.durableproducers import Producer
from ...core.durablestore import Create, Created, plan_create
from ...core.errors import StreamRefused
from ...core.settings import Settings
from . import durablescripts as scripts
from .connections import DOWN, Connections
from .durablewake import Wakes

__all__ = ["MAX_ATTEMPTS", "RedisStore", "StreamRecord"]

MAX_ATTEMPTS = 64
"""Times a change is judged again after another process changed the stream first; past it
the request is refused 503 (``stream_busy``)."""
SWEEP_BATCH = 64
"""Expired streams dropped per sweep at most (the next sweep goes on)."""
MAX_GROUP = 64
"""Appends to one path judged on one read and written by one script, at most."""
MAX_GROUP_BYTES = 1 << 20
"""Bytes of the bodies of one group, at most (a body over it goes alone)."""


class StreamRecord(BaseModel):
    """A stream's protocol state, as Redis keeps it (JSON)."""

    model_config = ConfigDict(extra="forbid")

    content_type: str
    ttl: int | None = None
    expires_at: float | None = None
    expires_at_text: str | None = None
    fork_position: int = 0
    tail: int = 0
    closed: bool = False
    closed_by: tuple[str, int, int] | None = None
    last_stream_seq: str | None = None
    producers: list[tuple[str, int, int]] = []
    made: dict[str, Any]
    """The first ``PUT``, without its body (a second one is compared with it)."""


class StoredStream(DurableStream):
    """A stream as read from Redis: its state at one version (its log is read on demand)."""

    version: int = 0
    made: Create = Create()


def _record(stream: DurableStream, made: Create) -> str:
    closed_by = stream.closed_by
    return StreamRecord(
        content_type=stream.content_type,
        ttl=stream.expiry.ttl,
        expires_at=stream.expiry.expires_at,
        expires_at_text=stream.expiry.expires_at_text,
        fork_position=stream.fork_position,
        tail=stream.tail,
        closed=stream.closed,
        closed_by=None if closed_by is None else (closed_by.id, closed_by.epoch, closed_by.seq),
        last_stream_seq=stream.last_stream_seq,
        producers=stream.producers.states(),
        made={
            "content_type": made.content_type,
            "ttl": made.expiry.ttl,
            "expires_at": made.expiry.expires_at,
            "expires_at_text": made.expiry.expires_at_text,
            "closed": made.closed,
            "forked_from": made.forked_from,
            "fork_offset": made.fork_offset,
            "fork_sub_offset": made.fork_sub_offset,
            "fork_sub_offset_given": made.fork_sub_offset_given,
        },
    ).model_dump_json()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _stream(rows: list[Any], limits: Limits) -> StoredStream:
    """The stream (and its sources) of a LOOKUP's answer."""
    source: StoredStream | None = None
    for index in range(len(rows) - 2, -1, -2):
        flat = rows[index + 1]
        fields = {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}
        record = StreamRecord.model_validate_json(fields["state"])
        made = record.made
        stream = StoredStream(
            stream_id=int(rows[index]),
            content_type=record.content_type,
            expiry=Expiry(record.ttl, record.expires_at, record.expires_at_text),
            limits=limits,
            now=float(fields["touched"]),
            source=source,
            fork_position=record.fork_position,
        )
        stream.tail = record.tail
        stream.own_bytes = int(fields["bytes"])
        stream.closed = record.closed
        stream.closed_by = None if record.closed_by is None else Producer(*record.closed_by)
        stream.last_stream_seq = record.last_stream_seq
        stream.producers.restore(record.producers)
        stream.forks = int(fields["forks"])
        stream.deleted = _text(fields["deleted"]) == "1"
        stream.version = int(fields["v"])
        stream.made = Create(
            content_type=made["content_type"],
            expiry=Expiry(made["ttl"], made["expires_at"], made["expires_at_text"]),
            closed=made["closed"],
            forked_from=made["forked_from"],
            fork_offset=made["fork_offset"],
            fork_sub_offset=made["fork_sub_offset"],
            fork_sub_offset_given=made["fork_sub_offset_given"],
        )
        source = stream
    assert source is not None
    return source


def _pairs(stream: DurableStream) -> list[str | bytes]:
    return [piece for start, entry in stream.logged() for piece in (str(start), entry)]


def _unavailable() -> StreamRefused:
    return StreamRefused(503, "broker_unavailable", "Redis is unreachable: try again later")


class _Append:
    """An append waiting for its turn, and its answer once its group is written."""

    __slots__ = ("body", "close", "content_type", "done", "now", "producer", "stream_seq")

    def __init__(
        self,
        body: bytes,
        content_type: str,
        close: bool,
        now: float,
        stream_seq: str | None,
        producer: Producer | None,
    ) -> None:
        self.body, self.content_type, self.close, self.now = body, content_type, close, now
        self.stream_seq, self.producer = stream_seq, producer
        self.done: asyncio.Future[Appended] = asyncio.get_running_loop().create_future()

    def settle(self, outcome: Appended | BaseException) -> None:
        if not self.done.done():
            if isinstance(outcome, Appended):
                self.done.set_result(outcome)
            else:
                self.done.set_exception(outcome)


class _Turn:
    """The writes to one path waiting in this process, one at a time; the appends among
    them queue here, to be written together by whichever takes the turn first."""

    __slots__ = ("appends", "lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
        self.appends: deque[_Append] = deque()


def _group(waiting: deque[_Append]) -> list[_Append]:
    """The next group of ``waiting`` appends (taken off it): the first, and those after it
    within :data:`MAX_GROUP` and :data:`MAX_GROUP_BYTES`."""
    group = [waiting.popleft()]
    size = len(group[0].body)
    while waiting and len(group) < MAX_GROUP and size + len(waiting[0].body) <= MAX_GROUP_BYTES:
        size += len(waiting[0].body)
        group.append(waiting.popleft())
    return group


class RedisStore:
    """The :class:`~token_relay.core.durablestore.DurableStore` contract over Redis."""

    shared = True

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.max_streams = settings.max_durable_streams
        self.max_total_bytes = settings.max_memory_bytes
        self.limits = Limits(
            max_bytes=settings.max_durable_stream_bytes,
            max_producers=settings.max_durable_producers,
        )
        self._connections = Connections(settings.broker)
        self._opened = False
        self._scripts: dict[str, Any] = {}
        self._count = 0
        self._bytes = 0
        self.subscribed = False
        """Whether there were subscriptions (``tr:ds:subs``) at the last write's script: an
        append asks nothing more of Redis when there were none."""
        self.wake: Callable[[str], None] = lambda path: None
        self._wakes = Wakes(self._client, lambda path: self.wake(path))
        self._turns: dict[str, _Turn] = {}
        """Per path, this process's writes in progress (bounded by its requests)."""

    @contextlib.asynccontextmanager
    async def _turn(self, path: str) -> AsyncIterator[None]:
        """This process's writes to one path go one at a time: each is judged on the
        stream as the last one left it, so they never retry against each other. Writes
        from other processes may still race one (the version check settles it)."""
        turn = self._turns.get(path)
        if turn is None:
            turn = self._turns[path] = _Turn()
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if not turn.users:
                del self._turns[path]

    # ------------------------------------------------------------------ counts

    @property
    def total_bytes(self) -> int:
        """Bytes of every stream's data in Redis, as last counted."""
        return self._bytes

    def __len__(self) -> int:
        return self._count

    def tail_of(self, path: str) -> int | None:
        """Subscriptions are kept per process: none follows a shared stream."""
        return None

    def paths(self) -> list[str]:
        """Subscriptions are kept per process: none follows a shared stream."""
        return []

    # ------------------------------------------------------------------ Redis

    def _client(self) -> Redis:
        if not self._opened:
            self._connections.open()
            self._opened = True
        return self._connections.client()

    async def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self._client().register_script(getattr(scripts, name))
        try:
            return await script(keys=keys, args=args)
        except (*DOWN, redis_errors.RedisError):
            raise _unavailable() from None

    async def _command(self, *args: Any) -> Any:
        try:
            return await self._client().execute_command(*args)  # type: ignore[no-untyped-call]
        except (*DOWN, redis_errors.RedisError):
            raise _unavailable() from None

    def _counted(self, totals: list[Any]) -> None:
        self._count, self._bytes = int(totals[0]), int(totals[1])
        if len(totals) > 2:
            self.subscribed = int(totals[2]) > 0

    async def command(self, *args: Any) -> Any:
        """One Redis command: 503 (``broker_unavailable``) when Redis is out of reach."""
        return await self._command(*args)

    async def script(self, source: str, keys: list[str], args: list[Any]) -> Any:
        """A Lua script (registered on first use), as :meth:`command`."""
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self._client().register_script(source)
        try:
            return await script(keys=keys, args=args)
        except (*DOWN, redis_errors.RedisError):
            raise _unavailable() from None

    # ------------------------------------------------------------------ lookups

    async def _lookup(self, path: str, now: float) -> StoredStream | None:
        """The stream at ``path`` (a tombstone too), after its expiry is applied."""
        for _ in range(MAX_ATTEMPTS):
            rows = await self._run("LOOKUP", [f"tr:ds:p:{path}"], [])
            if not rows:
                return None
            stream = _stream(rows, self.limits)
            if stream.deleted or not stream.expired(now):
                return stream
            if await self._run("DROP", [], [stream.stream_id, repr(now), 1]):
                self.wake(path)
        raise StreamRefused(503, "stream_busy", "the stream changes too fast: try again")

    async def get(self, path: str, now: float, *, touch: bool = False) -> DurableStream:
        """The live stream at ``path``: 404 if there is none, 410 for a tombstone."""
        stream = await self._lookup(path, now)
        if stream is None:
            raise StreamRefused(404, "stream_not_found", f"no stream at {path}")
        if stream.deleted:
            raise StreamRefused(410, "stream_gone", f"the stream at {path} was deleted")
        if touch:
            await self._run("TOUCH", [], [stream.stream_id, repr(now)])
            stream.touch(now)
        return stream

    async def read(self, stream: DurableStream, position: int) -> Chunk:
        """What ``stream`` held (at the version read) from ``position``."""
        await self._hold(stream, position)
        return stream.read(position)

    async def _hold(self, stream: DurableStream, position: int) -> None:
        """Read into ``stream`` (and its sources) the window of its log a read from
        ``position`` may return."""
        if position < stream.fork_position and stream.source is not None:
            await self._hold(stream.source, position)
        start = max(position, stream.fork_position)
        if start >= stream.tail:
            stream.hold([])
            return
        rows = await self._run(
            "READ",
            [f"tr:ds:l:{stream.stream_id}", f"tr:ds:a:{stream.stream_id}"],
            [start, self.limits.max_read_bytes],
        )
        stream.hold([(int(float(rows[i])), rows[i + 1]) for i in range(0, len(rows), 2)])

    # ------------------------------------------------------------------ changes

    async def create(self, path: str, request: Create, now: float) -> Created:
        """A ``PUT`` at ``path`` (see :func:`~token_relay.core.durablestore.plan_create`)."""
        async with self._turn(path):
            for _ in range(MAX_ATTEMPTS):
                existing = await self._lookup(path, now)
                source = None
                if request.forked_from is not None:
                    source = await self._lookup(request.forked_from, now)
                held = await self._command("MGET", "tr:ds:count", "tr:ds:bytes")
                self._counted([held[0] or 0, held[1] or 0])
                created = plan_create(
                    path,
                    request,
                    existing=existing,
                    made=None if existing is None else existing.made,
                    source=source,
                    stream_id=0,
                    limits=self.limits,
                    streams=self._count,
                    max_streams=self.max_streams,
                    room=self.max_total_bytes - self._bytes,
                    now=now,
                )
                if not created.created:
                    return created
                stream = created.stream
                stream.stream_id = int(await self._command("INCR", "tr:ds:next"))
                expiry = stream.expiry
                made = Create(
                    content_type=request.content_type,
                    expiry=request.expiry,
                    closed=request.closed,
                    forked_from=request.forked_from,
                    fork_offset=request.fork_offset,
                    fork_sub_offset=request.fork_sub_offset,
                    fork_sub_offset_given=request.fork_sub_offset_given,
                )
                answer = await self._run(
                    "CREATE",
                    [],
                    [
                        path,
                        stream.stream_id,
                        _record(stream, made),
                        repr(now),
                        "" if source is None else source.stream_id,
                        stream.own_bytes,
                        self.max_streams,
                        self.max_total_bytes,
                        "" if expiry.ttl is None else expiry.ttl,
                        "" if expiry.expires_at is None else repr(expiry.expires_at),
                        ENTRY_OVERHEAD,
                        *_pairs(stream),
                    ],
                )
                if isinstance(answer, list):
                    self._counted(answer)
                    return created
                refused = _text(answer)
                if refused == "too_many":
                    raise StreamRefused(
                        507, "too_many_streams", "the relay holds all the streams it may"
                    )
                if refused == "full":
                    raise StreamRefused(
                        507, "store_full", "the relay holds all the stream data it may"
                    )
            raise StreamRefused(503, "stream_busy", "the stream changes too fast: try again")

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
        """A ``POST`` at ``path``: judged on the stream as read, written if it is still so.

        Appends to one path that wait for this process's turn there are judged together,
        in the order they came, on one read of the stream, and written by one script (at
        most :data:`MAX_GROUP` of them and :data:`MAX_GROUP_BYTES` of bodies): each is
        answered as if it had been judged and written alone, right after the one before
        it. The group is written in a task of its own, so a request that goes away while
        it is being written cuts no other request's answer short."""
        pending = _Append(body, content_type, close, now, stream_seq, producer)
        turn = self._turns.get(path)
        if turn is None:
            turn = self._turns[path] = _Turn()
        turn.appends.append(pending)
        async with self._turn(path):
            if not pending.done.done():
                group = _group(turn.appends)
                await asyncio.shield(asyncio.ensure_future(self._write_group(path, group)))
        return await pending.done

    async def _write_group(self, path: str, group: list[_Append]) -> None:
        """Judge ``group`` (appends in their order) on one read of the stream and write
        what they did in one script; settle each one's answer. Judged again, whole, if the
        stream changed meanwhile; one at a time if together they would pass the store's
        bytes."""
        try:
            for _ in range(MAX_ATTEMPTS):
                outcomes = await self._judge_and_commit(path, group)
                if outcomes is None:
                    continue  # another process changed the stream first: judge again
                if isinstance(outcomes, str):  # together past the store's bytes
                    if len(group) == 1:
                        group[0].settle(
                            StreamRefused(
                                507, "store_full", "the relay holds all the stream data it may"
                            )
                        )
                        return
                    for alone in group:  # which of them still fit: each on its own
                        await self._write_group(path, [alone])
                    return
                for pending, outcome in zip(group, outcomes, strict=True):
                    pending.settle(outcome)
                return
            busy = StreamRefused(503, "stream_busy", "the stream changes too fast: try again")
            for pending in group:
                pending.settle(busy)
        except StreamRefused as refused:  # no stream there, or Redis out of reach
            for pending in group:
                pending.settle(refused)
        except BaseException as exc:
            for pending in group:
                pending.settle(exc)
            raise

    async def _judge_and_commit(
        self, path: str, group: Sequence[_Append]
    ) -> list[Appended | StreamRefused] | str | None:
        """One attempt: the group's outcomes; ``full`` if its writes pass the store's bytes;
        None if the stream changed since it was read."""
        stream = await self.get(path, group[-1].now)
        assert isinstance(stream, StoredStream)
        stream.hold([])
        outcomes: list[Appended | StreamRefused] = []
        changed = written = False
        for pending in group:
            try:
                appended = stream.append(
                    pending.body,
                    content_type=pending.content_type,
                    close=pending.close,
                    now=pending.now,
                    room=self.max_total_bytes,
                    stream_seq=pending.stream_seq,
                    producer=pending.producer,
                )
            except StreamRefused as refused:  # judged on the state the ones before left
                outcomes.append(refused)
                continue
            if appended.duplicate:
                stream.touch(pending.now)
            grew = appended.added_bytes > 0 or (pending.close and not appended.duplicate)
            changed = changed or grew
            written = True
            outcomes.append(appended)
        if not written:  # every one refused: answered only on the stream as it still is
            return outcomes if await self._still(stream) else None
        answer = await self._run(
            "COMMIT",
            [],
            [
                stream.stream_id,
                stream.version,
                _record(stream, stream.made),
                repr(max(pending.now for pending in group)),
                self.max_total_bytes,
                "1" if changed else "0",
                ENTRY_OVERHEAD,
                *_pairs(stream),
            ],
        )
        if isinstance(answer, list):
            self._counted(answer)
            return outcomes
        return "full" if _text(answer) == "full" else None

    async def _still(self, stream: StoredStream) -> bool:
        """Whether the stream is still at the version it was read at."""
        version = await self._command("HGET", f"tr:ds:s:{stream.stream_id}", "v")
        return version is not None and int(version) == stream.version

    async def delete(self, path: str, now: float) -> None:
        """A ``DELETE`` at ``path``: 404 if none, 410 for a tombstone."""
        async with self._turn(path):
            for _ in range(MAX_ATTEMPTS):
                stream = await self.get(path, now)
                if await self._run("DROP", [], [stream.stream_id, repr(now), 0]):
                    await self._recount()
                    return
            raise StreamRefused(503, "stream_busy", "the stream changes too fast: try again")

    async def expire(self, now: float) -> list[str]:
        """Drop the streams past their expiry (at most :data:`SWEEP_BATCH`); their paths.

        A process that has served no stream yet leaves the sweep to those that have (and to
        Redis's own expiry of the keys): it opens no connection for streams until one is
        asked for."""
        if not self._opened:
            return []
        due = await self._command(
            "ZRANGEBYSCORE", "tr:ds:deadlines", "-inf", repr(now), "LIMIT", 0, SWEEP_BATCH
        )
        gone: list[str] = []
        for stream_id in due:
            path = await self._run("DROP", [], [_text(stream_id), repr(now), 1])
            if path:
                gone.append(_text(path))
        await self._recount()
        return gone

    async def _recount(self) -> None:
        held = await self._command("MGET", "tr:ds:count", "tr:ds:bytes")
        self._counted([held[0] or 0, held[1] or 0])

    # ------------------------------------------------------------------ waking

    async def watch(self, path: str) -> bool:
        """Hear the changes other processes make at ``path``."""
        return await self._wakes.watch(path)

    async def unwatch(self, keep: set[str]) -> None:
        """Stop hearing paths no reader here waits on."""
        await self._wakes.unwatch(keep)

    async def close(self) -> None:
        """Stop the pub/sub reader and disconnect."""
        await self._wakes.close()
        if self._opened:
            await self._connections.close()
