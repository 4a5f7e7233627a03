"""The Durable Streams protocol over HTTP, at ``/v1/stream/{path}``: each request read, the
store asked (:mod:`token_relay.core.durablestore`), and its answer written.

``PUT`` creates (or forks), ``POST`` appends or closes, ``DELETE`` deletes, ``HEAD`` reads the
metadata, and ``GET`` reads: a catch-up read from ``?offset=`` (``-1``, the start, by
default; ``now``, the tail), a long-poll (``?live=long-poll``) that waits up to
``--long-poll-timeout`` for data at the tail, or an SSE stream (``?live=sse``,
:mod:`token_relay.edge.durablesse`). The rules are the core's; this module maps headers to
values and values to headers, and owns the waiting: each live reader waits on its stream's
path, and every append, close or delete there wakes them. A reader listens before each read
of the stream (:meth:`DurableStreams.listen`), so that a change whose wake comes while that
read is under way (from another process, through Redis) wakes its next wait.

Expired streams are swept at most once a second, on the next request. With the memory
broker the streams live in this process (:class:`~token_relay.core.durablestore.LocalStore`);
with ``--broker redis://`` they live in Redis (:mod:`token_relay.brokers.redis.durable`), and
every relay process serves every stream: a change made on another process wakes the live
readers here through the store's :meth:`~token_relay.core.durablestore.DurableStore.watch`.
Subscriptions live beside the streams: in this process, or in Redis
(:mod:`token_relay.brokers.redis.durablesubs`), where every process serves them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypedDict

from ..core.durable import (
    BEGINNING,
    TAIL,
    Appended,
    Chunk,
    DurableStream,
    Limits,
    offset_text,
    position_of,
)
from ..core.durablejson import json_array
from ..core.durableproducers import Producer
from ..core.durablerequests import (
    MAX_VALUE_LENGTH,
    bounded,
    closed_of,
    cursor,
    expiry_of,
    producer_of,
    sub_offset_of,
)
from ..core.durablestore import Create, DurableStore, LocalStore, MemoryStore
from ..core.errors import StreamRefused
from ..core.settings import Settings
from .durablehooks import (
    CONTROL_PREFIX,
    MAX_SUBSCRIPTIONS,
    HttpPoster,
    LocalSubscriptions,
    Post,
    SubscriptionEndpoints,
    SubscriptionState,
)
from .durablesse import DurableSse, follow
from .http import HttpRequest, ReadBody, Reply
from .routes import STREAM_PREFIX, StreamRequest
from .waiters import Waiters, woken

__all__ = ["DurableStreams"]

log = logging.getLogger("token_relay")

Headers = tuple[tuple[str, str], ...]

CURSOR_JITTER = (1, 180)
"""Cursor intervals added to a client's cursor that is not behind (20 s to an hour)."""
SWEEP_EVERY = 1.0
PUBLIC_CACHE = "public, max-age=60, stale-while-revalidate=300"
PRIVATE_CACHE = "private, max-age=60, stale-while-revalidate=300"
CONTROL_PATH = STREAM_PREFIX + CONTROL_PREFIX
"""Where the control APIs' paths start."""


class DurableStreams:
    """Every Durable Streams request of one relay process."""

    def __init__(
        self,
        settings: Settings,
        elsewhere: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.time,
        spawn: Callable[[Coroutine[Any, Any, None]], None] | None = None,
        post: Post | None = None,
        store: DurableStore | None = None,
    ) -> None:
        self.settings = settings
        self.elsewhere = elsewhere
        """Bytes of ``--max-memory-bytes`` held by the relay's messages (as last counted):
        stream data may take what they leave."""
        self.clock = clock
        self.store: DurableStore = store if store is not None else store_for(settings)
        self.store.wake = self._wake
        self._waiters = Waiters()
        self._swept = 0.0
        self.poster = HttpPoster(settings.webhook_timeout)
        self.hooks = SubscriptionEndpoints(
            state=self._subscription_state(),
            append_wake=self._append_wake,
            spawn=spawn or _run_soon,
            post=post or self.poster,
            clock=clock,
        )
        self._polls = 0
        """Long-polls in progress (their answer is written in the step that ends them)."""
        self.stopping = False
        """The relay is shutting down: live reads answer now (204, or the end of an SSE
        response) instead of waiting."""
        self._cache = PUBLIC_CACHE if settings.open_access else PRIVATE_CACHE

    # ------------------------------------------------------------------ waiting

    def _wake(self, path: str) -> None:
        self._waiters.wake(path)

    def listen(self, path: str) -> asyncio.Future[None]:
        """A waiter for the next change at ``path``, registered before the read it follows:
        a change made while that read is under way (its wake heard before the read's answer)
        wakes it, where a waiter registered after the read would miss it and sleep on."""
        return self._waiters.listen(path)

    def discard(self, path: str, waiter: asyncio.Future[None]) -> None:
        """Forget ``waiter`` (woken, timed out, or its reader done)."""
        self._waiters.discard(path, waiter)

    async def wait(
        self,
        path: str,
        waiter: asyncio.Future[None],
        timeout: float,  # noqa: ASYNC109
        gone: asyncio.Future[None] | None = None,
    ) -> None:
        """Wait until the stream at ``path`` changes after the read ``waiter`` was
        registered before (:meth:`listen`), ``timeout`` seconds pass, or the reader is
        ``gone``; the waiter is done with either way (the caller listens again before it
        reads again). Nothing is cut short: a round trip to Redis under way ends first."""
        try:
            if timeout <= 0 or self.stopping:
                return
            if await self.store.watch(path):
                return  # watched from now on: the caller looks again, for a change before
            await woken(waiter, timeout, gone)
        finally:
            self.discard(path, waiter)

    async def sweep(self) -> None:
        """Drop expired streams (at most once a second), waking their readers; deliver
        the subscriptions' wakes that are due (retries, leases run out); and stop watching
        the paths no reader waits on."""
        try:
            await self._now()
            await self.store.unwatch(set(self._waiters))
        except StreamRefused as exc:
            # Redis out of reach: the broker logs the outage; the next sweep goes on.
            log.debug("durable streams not swept: %s", exc.message)
        try:
            await self.hooks.tick()
        except StreamRefused as exc:
            log.debug("subscriptions not swept: %s", exc.message)

    @property
    def polls(self) -> int:
        """Long-polls in progress."""
        return self._polls

    async def stop(self) -> None:
        """The relay is shutting down: every long-poll answers at once (204), and this
        returns once their answers are written, before their sockets close."""
        self.stopping = True
        self._waiters.wake_all()
        while self._polls:  # noqa: ASYNC110 - each poll ends in the loop's next passes
            await asyncio.sleep(0)
        await self.poster.close()
        await self.store.close()

    # ------------------------------------------------------------------ subscriptions

    def _subscription_state(self) -> SubscriptionState:
        """The subscriptions: beside the streams, in this process or in Redis."""
        if self.store.shared:
            from ..brokers.redis.durable import RedisStore
            from ..brokers.redis.durablesubs import RedisSubscriptions

            assert isinstance(self.store, RedisStore)
            return RedisSubscriptions(self.store, MAX_SUBSCRIPTIONS, STREAM_PREFIX)
        return LocalSubscriptions(self._tail_of, self._paths)

    async def _changed(self, path: str, before: int) -> None:
        """The stream at ``path`` got data past ``before``: wake its readers, and the
        subscriptions it concerns."""
        self._wake(path)
        if not self.hooks.quiet():
            await self._tell(path, before)

    async def _tell(self, path: str, before: int) -> None:
        """The subscriptions the stream at ``path`` concerns: it got data past ``before``."""
        try:
            await self.hooks.appended(path.removeprefix(STREAM_PREFIX), before)
        except StreamRefused as exc:
            log.warning("subscriptions not told of %s: %s", path, exc.message)

    async def _gone(self, path: str) -> None:
        """The stream at ``path`` was deleted or expired."""
        self._wake(path)
        try:
            await self.hooks.deleted(path.removeprefix(STREAM_PREFIX))
        except StreamRefused as exc:
            log.warning("subscriptions not told of %s: %s", path, exc.message)

    def _tail_of(self, path: str) -> int | None:
        return self.store.tail_of(STREAM_PREFIX + path)

    def _paths(self) -> list[str]:
        return [path.removeprefix(STREAM_PREFIX) for path in self.store.paths()]

    def _append_wake(self, path: str, body: bytes) -> None:
        """A pull-wake's events, appended to its wake stream (if it is there)."""
        self.hooks.spawn(self._append_wake_now(path, body))

    async def _append_wake_now(self, path: str, body: bytes) -> None:
        key = STREAM_PREFIX + path
        try:
            appended = await self.store.append(
                key, body, content_type="application/json", close=False, now=self.clock()
            )
        except StreamRefused as exc:
            log.warning("wake events not written to %s: %s", path, exc.message)
            return
        await self._changed(key, appended.before)

    async def _now(self) -> float:
        self.store.max_total_bytes = max(0, self.settings.max_memory_bytes - self.elsewhere())
        now = self.clock()
        if now - self._swept >= SWEEP_EVERY:
            self._swept = now
            for path in await self.store.expire(now):
                await self._gone(path)
        return now

    # ------------------------------------------------------------------ requests

    async def serve(self, reading: ReadBody, body: bytes) -> Reply:
        """Answer one request (anything but an SSE read)."""
        route = reading.route
        assert isinstance(route, StreamRequest)
        request = reading.request
        try:
            if route.stream.startswith(CONTROL_PATH):
                return await self.hooks.serve(
                    route.method, route.stream.removeprefix(CONTROL_PATH), request, body
                )
            if route.method == "POST":
                return await self._append(route, request, body)
            if route.method == "PUT":
                return await self._create(route, request, body)
            if route.method == "DELETE":
                await self.store.delete(route.stream, await self._now())
                await self._gone(route.stream)
                return Reply(204, b"")
            if route.method == "HEAD":
                return await self._head(route)
            return await self._read(route, request, reading.gone)
        except StreamRefused as exc:
            return refusal(exc)

    async def _create(self, route: StreamRequest, request: HttpRequest, body: bytes) -> Reply:
        content_type = bounded("Content-Type", request.header("content-type"))
        forked_from = _optional(request, "stream-forked-from")
        created = await self.store.create(
            route.stream,
            Create(
                content_type=content_type or None,
                expiry=expiry_of(request.header("stream-ttl"), request.header("stream-expires-at")),
                closed=closed_of(request.header("stream-closed")),
                body=body,
                forked_from=forked_from,
                fork_offset=_optional(request, "stream-fork-offset"),
                fork_sub_offset=sub_offset_of(request.header("stream-fork-sub-offset")),
                fork_sub_offset_given=_optional(request, "stream-fork-sub-offset") is not None,
            ),
            await self._now(),
        )
        stream = created.stream
        if created.created:
            await self._changed(route.stream, stream.fork_position)
        headers: Headers = (("Stream-Next-Offset", offset_text(stream.tail)),)
        if stream.closed:
            headers += (("Stream-Closed", "true"),)
        if created.created:
            location = f"{request.scheme}://{request.header('host') or 'localhost'}{route.stream}"
            return Reply(201, b"", stream.content_type, (("Location", location), *headers))
        return Reply(200, b"", stream.content_type, headers)

    def append_now(self, reading: ReadBody, body: bytes) -> Reply | None:
        """A ``POST`` (append) answered within the call, with no task: to a stream in this
        process's memory, with no subscription to tell and no sweep due, exactly as
        :meth:`serve` answers it; None (nothing done) for any other request."""
        route = reading.route
        store = self.store
        if (
            not isinstance(route, StreamRequest)
            or route.method != "POST"
            or not isinstance(store, LocalStore)
            or route.stream.startswith(CONTROL_PATH)
            or not self.hooks.quiet()
        ):
            return None
        now = self.clock()
        if now - self._swept >= SWEEP_EVERY:
            return None  # the sweep is due: serve() runs it first
        try:
            producer, sent = _producer_of(reading.request)
            stream_seq = sent.get("stream-seq")
            if stream_seq is not None and len(stream_seq) > MAX_VALUE_LENGTH:
                return None
            store.max_total_bytes = max(0, self.settings.max_memory_bytes - self.elsewhere())
            options = _append_options(sent, now, stream_seq, producer)
            appended = store.memory.append(route.stream, body, **options)
        except StreamRefused as exc:
            return refusal(exc)
        if appended.next > appended.before or not appended.duplicate:
            self._wake(route.stream)  # quiet: no subscription to tell
        return _appended_reply(appended, producer, body)

    async def _append(self, route: StreamRequest, request: HttpRequest, body: bytes) -> Reply:
        producer, sent = _producer_of(request)
        now = await self._now()
        stream_seq = sent.get("stream-seq")
        if stream_seq is not None and len(stream_seq) > MAX_VALUE_LENGTH:
            await self.store.get(route.stream, now)  # no stream there answers first
            bounded("Stream-Seq", stream_seq)
        options = _append_options(sent, now, stream_seq, producer)
        appended = await self.store.append(route.stream, body, **options)
        before = appended.before
        if appended.next > before:
            self._wake(route.stream)  # as _changed does, without a coroutine when quiet
            if not self.hooks.quiet():
                await self._tell(route.stream, before)
        elif not appended.duplicate:
            self._wake(route.stream)  # closed: its readers learn it now
        return _appended_reply(appended, producer, body)

    async def _head(self, route: StreamRequest) -> Reply:
        stream = await self.store.get(route.stream, await self._now())
        headers: Headers = (
            ("Stream-Next-Offset", offset_text(stream.tail)),
            ("Cache-Control", "no-store"),
        )
        if stream.expiry.ttl is not None:
            headers += (("Stream-TTL", str(stream.expiry.ttl)),)
        if stream.expiry.expires_at_text is not None:
            headers += (("Stream-Expires-At", stream.expiry.expires_at_text),)
        if stream.closed:
            headers += (("Stream-Closed", "true"),)
        return Reply(200, b"", stream.content_type, headers)

    def _start(self, stream: DurableStream, offset: str | None) -> int:
        """Where a read starts: ``-1`` (or none) is the beginning, ``now`` the tail."""
        if offset is None or offset == BEGINNING:
            return 0
        if offset == TAIL:
            return stream.tail
        position = position_of(offset)
        if position > stream.tail:
            raise StreamRefused(400, "bad_offset", "the offset is past the stream's tail")
        return position

    async def _read(
        self, route: StreamRequest, request: HttpRequest, gone: asyncio.Future[None] | None
    ) -> Reply:
        if route.live == "long-poll":
            self._polls += 1
            try:
                return await self._poll(route, request, gone)
            finally:
                self._polls -= 1
        stream = await self.store.get(route.stream, await self._now(), touch=True)
        position = self._start(stream, route.offset)
        return await self._catch_up(route, request, stream, position)

    async def _poll(
        self, route: StreamRequest, request: HttpRequest, gone: asyncio.Future[None] | None
    ) -> Reply:
        """A long-poll: a catch-up read once there is data past its offset, or 204 at the
        timeout (at once at the tail of a closed stream, or when the relay stops). Once its
        client is ``gone`` it stops waiting: what it answers then goes nowhere."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.long_poll_timeout
        waiter = self.listen(route.stream)  # before the read: no change falls between
        try:
            stream = await self.store.get(route.stream, await self._now(), touch=True)
            position = self._start(stream, route.offset)
            while position >= stream.tail and not stream.closed:
                left = deadline - loop.time()
                if left <= 0 or self.stopping or (gone is not None and gone.done()):
                    return _nothing_new(stream, ("Stream-Cursor", self.cursor(route)))
                await self.wait(route.stream, waiter, left, gone)
                waiter = self.listen(route.stream)
                stream = await self.same(route.stream, stream)
        finally:
            self.discard(route.stream, waiter)
        if position >= stream.tail:
            return _nothing_new(stream, ("Stream-Closed", "true"))
        return await self._catch_up(route, request, stream, position)

    async def _catch_up(
        self, route: StreamRequest, request: HttpRequest, stream: DurableStream, position: int
    ) -> Reply:
        """What there is from ``position``, as a catch-up read (or a long-poll's data)."""
        chunk = await self.store.read(stream, position)
        body = _body(stream, chunk)
        up_to_date = chunk.next >= stream.tail
        etag = stream.etag(position, chunk.next)
        headers: Headers = (
            ("Stream-Next-Offset", offset_text(chunk.next)),
            ("ETag", etag),
        )
        if up_to_date:
            headers += (("Stream-Up-To-Date", "true"),)
            if stream.closed:
                headers += (("Stream-Closed", "true"),)
        if route.live or not stream.closed:
            headers += (("Stream-Cursor", self.cursor(route)),)
        tail_read = route.offset == TAIL or up_to_date
        headers += (("Cache-Control", "no-store" if tail_read else self._cache),)
        if not route.live and etag in _tags(request.header("if-none-match")):
            return Reply(304, b"", headers=headers)
        return Reply(200, body, stream.content_type, headers)

    async def same(self, path: str, stream: DurableStream) -> DurableStream:
        """The stream a live read follows, still at its path: 404 once it was deleted (or
        expired), even if another stream was made there since."""
        found = await self.store.get(path, await self._now())
        if found.stream_id != stream.stream_id:
            raise StreamRefused(404, "stream_not_found", f"the stream at {path} was deleted")
        return found

    async def read(self, stream: DurableStream, position: int) -> Chunk:
        """What ``stream`` holds from ``position``."""
        return await self.store.read(stream, position)

    def cursor(self, route: StreamRequest) -> str:
        return cursor(self.clock(), route.cursor, random.randint(*CURSOR_JITTER))

    # ------------------------------------------------------------------ SSE

    async def serve_sse(self, sse: DurableSse, route: StreamRequest) -> None:
        """A live read as Server-Sent Events: what there is from ``?offset=``, each batch a
        ``data`` event and a ``control`` event, then new data as it comes, until the stream
        closes (or is deleted), the client goes, or :data:`SSE_LIFETIME` passes."""
        if route.stream.removeprefix(STREAM_PREFIX).startswith(CONTROL_PREFIX):
            sse.refuse(
                refusal(StreamRefused(404, "stream_not_found", "the control APIs are not streams"))
            )
            return
        waiter = self.listen(route.stream)  # before the read: no change falls between
        try:
            stream = await self.store.get(route.stream, await self._now(), touch=True)
            position = self._start(stream, route.offset)
        except StreamRefused as exc:
            self.discard(route.stream, waiter)
            sse.refuse(refusal(exc))
            return
        await follow(sse, self, route, stream, position, waiter)


def store_for(settings: Settings) -> DurableStore:
    """The store of ``settings``'s broker: in this process with ``memory://``, in Redis
    with ``redis://`` (imported only then)."""
    if settings.broker.startswith(("redis://", "rediss://", "unix://")):
        from ..brokers.redis.durable import RedisStore

        return RedisStore(settings)
    return LocalStore(
        MemoryStore(
            max_streams=settings.max_durable_streams,
            max_total_bytes=settings.max_memory_bytes,
            limits=Limits(
                max_bytes=settings.max_durable_stream_bytes,
                max_producers=settings.max_durable_producers,
            ),
        )
    )


def _run_soon(coroutine: Coroutine[Any, Any, None]) -> None:
    asyncio.ensure_future(coroutine)  # noqa: RUF006 - the relay passes its own spawn


def _nothing_new(stream: DurableStream, last: tuple[str, str]) -> Reply:
    """A long-poll's 204: up to date at ``stream``'s tail, and ``last`` (its cursor, or that
    the stream is closed)."""
    return Reply(
        204,
        b"",
        headers=(
            ("Stream-Next-Offset", offset_text(stream.tail)),
            ("Stream-Up-To-Date", "true"),
            last,
            ("Cache-Control", "no-store"),
        ),
    )


def refusal(exc: StreamRefused) -> Reply:
    """A refused request: the protocol's headers, and an ``error`` frame as JSON."""
    body = json.dumps({"type": "error", "code": exc.code, "message": exc.message})
    return Reply(exc.status, body.encode(), "application/json", exc.headers)


def _optional(request: HttpRequest, name: str) -> str | None:
    """A header's last value, or None when it was not sent (not even empty)."""
    found: str | None = None
    for key, value in request.headers:
        if key == name:
            found = value
    return found


def _tags(header: str) -> set[str]:
    return {tag.strip() for tag in header.split(",") if tag.strip()}


def _body(stream: DurableStream, chunk: Chunk) -> bytes:
    if stream.json:
        return json_array(list(chunk.entries))
    return b"".join(chunk.entries)


def _producer_of(request: HttpRequest) -> tuple[Producer | None, dict[str, str]]:
    """An append's idempotent producer (None without its headers), and each header's last
    value, read in one pass."""
    sent = dict(request.headers)
    producer_id = sent.get("producer-id")
    epoch = sent.get("producer-epoch")
    seq = sent.get("producer-seq")
    if producer_id is None and epoch is None and seq is None:
        return None, sent
    return producer_of(producer_id, epoch, seq), sent


class _AppendOptions(TypedDict):
    """What a store's ``append`` is told of an append, besides its path and body."""

    content_type: str
    close: bool
    now: float
    stream_seq: str | None
    producer: Producer | None


def _append_options(
    sent: dict[str, str], now: float, stream_seq: str | None, producer: Producer | None
) -> _AppendOptions:
    """An append's options, from its headers (each one's last value)."""
    closed = sent.get("stream-closed")
    return _AppendOptions(
        content_type=sent.get("content-type", ""),
        close=closed is not None and closed_of(closed),
        now=now,
        stream_seq=stream_seq,
        producer=producer,
    )


def _appended_reply(appended: Appended, producer: Producer | None, body: bytes) -> Reply:
    """The answer to an append that was made."""
    if appended.producer_epoch is None:
        if appended.closed:
            headers: Headers = (
                ("Stream-Next-Offset", offset_text(appended.next)),
                ("Stream-Closed", "true"),
            )
        else:
            headers = (("Stream-Next-Offset", offset_text(appended.next)),)
        return Reply(204, b"", headers=headers)
    headers = (("Stream-Next-Offset", offset_text(appended.next)),)
    if appended.closed:
        headers += (("Stream-Closed", "true"),)
    headers += (
        ("Producer-Epoch", str(appended.producer_epoch)),
        ("Producer-Seq", str(appended.producer_seq)),
    )
    status = 200 if producer is not None and not appended.duplicate and body else 204
    return Reply(status, b"", headers=headers)
