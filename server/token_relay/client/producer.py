"""``RelayProducer``: a resilient producer connection for a model gateway."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, Literal

from pydantic import MISSING
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from ..core.errors import ErrorCode, MessageFailed, RelayProtocolError, UsageError
from ..core.protocol import (
    MAX_FRAME_HEADER,
    SERVER_FRAME,
    Ack,
    AckBatch,
    AnyServerFrame,
    Cancel,
    ChatRequest,
    Chunk,
    ErrorFrame,
    Meta,
    ProducerEvent,
    SessionFrame,
)
from .base import Background, Backoff, relay_url

__all__ = ["RelayProducer"]

RETRIED = frozenset({ErrorCode.RATE_LIMITED, ErrorCode.BROKER_UNAVAILABLE, ErrorCode.OVERLOADED})
"""Refusals that pass: the message is sent again shortly, from where the relay says."""

log = logging.getLogger("token_relay.client")

RESEND_BATCH = 500
"""Events per frame, at most, when sending buffered events again after a reconnect."""
RESEND_BYTES = 256 * 1024
"""Bytes per frame, at most, when sending buffered events again (an event past it goes in a
frame of its own): a quarter of the relay's default ``--max-frame-bytes``. A completed
message is sent again as one whole event only within it. A 1009 (a frame past the relay's
``--max-frame-bytes``, or a proxy's limit) halves it for that producer, down to
:data:`MIN_RESEND_BYTES`, and makes the next resend careful: an event a frame, each
confirmed before the next, so that an event refused alone fails its message rather than
close the connection at every reconnect."""
MIN_RESEND_BYTES = 1024
"""The least :data:`RESEND_BYTES` is halved to: past it, each event goes in a frame of its own."""

MAX_FAILED = 10_000
"""Failed message ids remembered, so a later event for one raises instead of starting anew."""

MAX_UNREAD_REQUESTS = 1000
"""Chat requests held until :meth:`RelayProducer.requests` reads them. One past them is
refused at once: its reply is opened and aborted with reason ``error`` (``meta.errorText``
says why), so the chat ends it at once rather than waiting for ``no_reply``."""
MAX_REFUSING = 100
"""Refusals being sent at once; past them a request is dropped (the relay's ``no_reply``
ends it)."""
RETRY_DELAY = 0.25
"""Seconds before sending again what the relay refused for now (rate limit, broker down)."""


class RelayProducer(Background):
    """A resilient producer connection for a model gateway."""

    def __init__(
        self,
        url: str,
        *,
        channel: str | None = None,
        token: str | None = None,
        max_unacked: int = 10_000,
        backoff: tuple[float, float] = (0.05, 5.0),
    ) -> None:
        super().__init__()
        self.url = url
        self.channel = channel
        self.token = token
        self.max_unacked = max_unacked
        self.session: str | None = None
        self.reconnects = 0
        self._backoff = Backoff(*backoff)
        self._ws: ClientConnection | None = None
        self._lock = asyncio.Lock()
        self._room = asyncio.Condition()
        self._seq: dict[str, int] = {}
        self._unacked: dict[str, list[str]] = {}
        self._buffered = 0
        self._acks: dict[str, asyncio.Future[Ack]] = {}
        self._cancels: asyncio.Queue[Cancel] = asyncio.Queue(1000)
        self._requests: asyncio.Queue[ChatRequest] = asyncio.Queue(MAX_UNREAD_REQUESTS)
        self._refusing = 0
        self._retrying: set[str] = set()
        self._failed: collections.OrderedDict[str, MessageFailed] = collections.OrderedDict()
        """Ids the relay gave up, most recent last (bounded): their events raise again."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._stops: dict[str, asyncio.Event] = {}
        """Messages being forwarded, each with the event its Stop sets."""
        self._closing = False
        self._resend_bytes = RESEND_BYTES
        """Bytes per frame of events sent again: within the relay's frame limit once it is
        known, and halved at each 1009 from the relay."""
        self._frame_limit: int | None = None
        """The relay's ``--max-frame-bytes``, as its last handshake gave it: an event past
        it is refused by :meth:`send` rather than sent."""
        self._learned_limit: int | None = None
        """The most bytes a frame may have on the way to the relay, as a 1009 taught it (a
        proxy's limit of its own, which no handshake gives): one less than the least event
        refused alone. Past it, as past :attr:`_frame_limit`, an event is never sent."""
        self._careful = False
        """After a 1009: the next resend goes an event a frame, each confirmed (the pong of
        a ping sent after it) before the next, so that an event refused alone is known."""
        self._confirming: str | None = None
        """The first event of a careful resend not confirmed when its connection closed."""

    async def close(self) -> None:
        """Close the connection (unfinished messages are aborted by the relay)."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await super().close()
        if self._ws is not None:
            await self._ws.close()
        for future in self._acks.values():
            if not future.done():
                future.cancel()

    async def send(
        self,
        message_id: str,
        delta: str,
        *,
        channel: str | None = None,
        meta: Meta | None = None,
    ) -> None:
        """Append ``delta`` to a message; returns once it is buffered and sent (or queued).

        ``meta`` (usage, a model name...) merges into the message's metadata, shallowly,
        last write wins, as the protocol's ``meta`` does.
        Raises :class:`MessageFailed` if the relay already gave this message up: a later
        part of it is never sent alone, so no subscriber sees a message missing its start.
        Raises :class:`UsageError`, sending nothing, if the event would pass the relay's
        ``--max-frame-bytes`` (the message goes on: send the delta in parts).
        """
        await self._submit(message_id, delta, final=False, channel=channel, meta=meta)

    async def send_chunk(
        self,
        message_id: str,
        chunk: Chunk,
        *,
        channel: str | None = None,
        meta: Meta | None = None,
    ) -> None:
        """Apply an AI SDK ``UIMessageChunk`` (``reasoning-delta``, ``tool-input-start``,
        ``source-url``...) to a message's parts, as :meth:`send` appends text; the message
        becomes structured, and :meth:`send` then extends its implicit text part.

        Raises :class:`MessageFailed` as :meth:`send` does; a chunk the relay refuses fails
        the message with the refusal's code.
        """
        await self._submit(message_id, None, final=False, channel=channel, chunk=chunk, meta=meta)

    async def finish(
        self, message_id: str, *, channel: str | None = None, meta: Meta | None = None
    ) -> Ack:
        """Complete a message and wait for the relay's acknowledgement.

        ``meta`` merges into the message's metadata as :meth:`send`'s does (the final's is
        the last write). Raises :class:`MessageFailed` naming the id if the relay gave the
        message up.
        """
        self._check(message_id)
        future = self._acks.get(message_id)
        if future is None or future.done():
            future = self._acks[message_id] = asyncio.get_running_loop().create_future()
        await self._submit(message_id, None, final=True, channel=channel, meta=meta)
        return await future

    async def abort(
        self,
        message_id: str,
        *,
        reason: Literal["cancelled", "error"] = "cancelled",
        channel: str | None = None,
        meta: Meta | None = None,
    ) -> None:
        """End an unfinished message: ``cancelled`` (the gateway obeyed a Stop) or ``error``
        (its model failed; put the text in ``meta["errorText"]``). Subscribers get its
        ``aborted`` frame with that reason, with its text and parts so far.

        Nothing is acknowledged: the message's buffered events are dropped once the abort
        is sent. If the connection drops before it arrives and the session resumes, the
        relay aborts the message after its idle timeout instead.
        """
        self._check(message_id)
        await self._submit(message_id, None, final=False, channel=channel, meta=meta, abort=reason)
        future = self._acks.pop(message_id, None)
        if future is not None and not future.done():
            future.cancel()
        await self._release(message_id)

    async def fail(self, message_id: str, error_text: str, *, channel: str | None = None) -> None:
        """End a reply as an error, begun or not (its model refused, or failed before its
        first token): subscribers get it ``aborted``, reason ``error``, with ``error_text``
        as its ``meta.errorText`` (a chat transport shows it as the reply's error). A reply
        not begun yet is opened by an empty delta first, since an abort has nothing to end
        otherwise."""
        meta: Meta = {"errorText": error_text}
        await self.send(message_id, "", channel=channel, meta=meta)
        await self.abort(message_id, reason="error", channel=channel)

    async def forward(self, stream: Any, *, id: str, channel: str | None = None) -> Ack | None:
        """Forward a model's stream as message ``id``, as it is: the ``openai`` SDK's Chat
        Completions or Responses stream, or the ``anthropic`` SDK's Messages stream (raw
        events, or ``messages.stream()``), sync or async.

        Text, reasoning and tool calls go as parts, usage and the finish reason as ``meta``
        (see :mod:`token_relay.client.forward`). Returns the final's acknowledgement; None
        if a Stop for ``id`` came first: the upstream stream is then closed and the message
        ends as cancelled.
        """
        from .forward import forward

        return await forward(self, stream, message_id=id, channel=channel)

    def stop_requested(self, message_id: str) -> asyncio.Event:
        """An event set when a Stop (a subscriber's ``cancel``) for ``message_id`` arrives;
        call :meth:`stop_done` once the message has ended. The Stop is also yielded by
        :meth:`cancellations`. At most ``max_unacked`` ids are watched at once."""
        stop = self._stops.get(message_id)
        if stop is None:
            if len(self._stops) >= self.max_unacked:
                raise UsageError(f"more than {self.max_unacked} messages watched for a Stop")
            stop = self._stops[message_id] = asyncio.Event()
        return stop

    def stop_done(self, message_id: str) -> None:
        """Stop watching ``message_id`` for a Stop."""
        self._stops.pop(message_id, None)

    async def cancellations(self) -> AsyncIterator[Cancel]:
        """Cancels sent by subscribers (a user pressed Stop), as they arrive."""
        while True:
            yield await self._cancels.get()

    @property
    def unread_requests(self) -> int:
        """Chat requests received and not yet read from :meth:`requests`."""
        return self._requests.qsize()

    async def requests(self) -> AsyncIterator[ChatRequest]:
        """Chat requests of the channel (a ``send`` of the AI SDK's ``WebSocketChatTransport``
        at ``/ai-sdk/ws``), as they arrive; only a producer connected with ``channel=`` gets
        them. Answer each by streaming a reply under ``request.id`` (:meth:`send`,
        :meth:`send_chunk`, :meth:`finish`, with ``channel=request.channel``).

        At most :data:`MAX_UNREAD_REQUESTS` requests wait to be read; one past them is
        refused at once: its reply ends ``aborted``, reason ``error``, its
        ``meta.errorText`` saying why."""
        while True:
            yield await self._requests.get()

    # ------------------------------------------------------------------ internals

    def _check(self, message_id: str) -> None:
        self._raise_if_fatal()
        failed = self._failed.get(message_id)
        if failed is not None:
            raise failed

    def _on_fatal(self, exc: BaseException) -> None:
        for future in self._acks.values():
            if not future.done():
                future.set_exception(exc)

    async def _submit(
        self,
        message_id: str,
        delta: str | None,
        *,
        final: bool,
        channel: str | None,
        chunk: Chunk | None = None,
        meta: Meta | None = None,
        abort: str | None = None,
    ) -> None:
        self._check(message_id)
        async with self._room:
            await self._room.wait_for(lambda: self._buffered < self.max_unacked)
            seq = self._seq.get(message_id, 0) + 1
            fields: dict[str, Any] = {"id": message_id, "seq": seq, "final": final}
            if delta is not None:
                fields["delta"] = delta
            if chunk is not None:
                fields["chunk"] = chunk
            if channel is not None:
                fields["channel"] = channel
            if meta is not None:
                fields["meta"] = meta
            if abort is not None:
                fields["abort"] = abort
            frame = ProducerEvent(**fields).model_dump_json(exclude_defaults=True)
            limit = self._limit()
            if limit is not None and len(frame) > limit // 4 and len(frame.encode()) > limit:
                # The relay would close the connection (1009), and again at every resend.
                raise UsageError(
                    f"an event of message {message_id!r} is {len(frame.encode())} bytes, past "
                    f"{self._limit_named(limit)}: send its delta in parts"
                )
            self._seq[message_id] = seq
            self._unacked.setdefault(message_id, []).append(frame)
            self._buffered += 1
        async with self._lock:
            ws = self._ws
            if ws is not None:
                with contextlib.suppress(ConnectionClosed):
                    await ws.send(frame)

    async def _release(self, message_id: str) -> None:
        frames = self._unacked.pop(message_id, [])
        self._seq.pop(message_id, None)
        async with self._room:
            self._buffered -= len(frames)
            self._room.notify_all()

    _role = "producer"

    def _stopping(self) -> bool:
        return self._closing

    def _target(self) -> str:
        return relay_url(
            self.url, "/produce", channel=self.channel, token=self.token, session=self.session
        )

    def _limit(self) -> int | None:
        """The most bytes an event may have: the relay's frame limit, or less if a 1009 on
        the way taught less (None if neither is known)."""
        given, learned = self._frame_limit, self._learned_limit
        if given is None or learned is None:
            return learned if given is None else given
        return min(given, learned)

    def _limit_named(self, limit: int) -> str:
        """Where ``limit`` (:meth:`_limit`'s) comes from, for a refusal's reason."""
        if limit == self._frame_limit:
            return f"the relay's --max-frame-bytes ({limit})"
        return f"the {limit} bytes a frame may have on the way to the relay (a 1009 said so)"

    async def _serve(self, ws: ClientConnection) -> None:
        limit = _frame_limit(ws)
        if limit is not None:
            self._frame_limit = limit
            self._resend_bytes = min(self._resend_bytes, limit)
        self._confirming = None
        try:
            hello = SERVER_FRAME.validate_json(await ws.recv())
            if not isinstance(hello, SessionFrame):
                raise RelayProtocolError(f"expected a session frame, got {hello!r}")
            await self._start(ws, hello)
            async for raw in ws:
                await self._handle(SERVER_FRAME.validate_json(raw))
        except ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code == CloseCode.MESSAGE_TOO_BIG:
                self._too_big(self._confirming)
            raise

    def _too_big(self, refused: str | None) -> None:
        """A frame of ours was refused with 1009: by the relay (past its --max-frame-bytes)
        or by a proxy on the way, with a limit of its own that no handshake gives.

        ``refused``: the event a careful resend sent alone and had not yet confirmed, which
        is then the one refused. Every event of its size or more never passes, so its
        message fails at the next handshake (see :meth:`_past_limit`), and later ones are
        refused by :meth:`send`. Otherwise which frame it was is not known: the next resend
        is careful, and what is sent again after it goes in frames half the size."""
        if refused is not None:
            size = len(refused.encode())
            if self._learned_limit is None or size - 1 < self._learned_limit:
                self._learned_limit = size - 1
                # As for the relay's own limit: what is sent again stays within it.
                self._resend_bytes = min(self._resend_bytes, size - 1)
            log.warning("a frame of one event, %d bytes, was refused as too big (1009)", size)
            return
        self._careful = True
        self._resend_bytes = max(MIN_RESEND_BYTES, self._resend_bytes // 2)
        log.warning(
            "relay refused a frame as too big: sending again in frames of %d bytes",
            self._resend_bytes,
        )

    async def _dropped(self) -> None:
        async with self._lock:
            self._ws = None

    async def _start(self, ws: ClientConnection, hello: SessionFrame) -> None:
        if self.session is not None and not hello.resumed and self._unacked:
            # The relay no longer has our session: every unacknowledged message is sent
            # again whole, from seq 1, under its own id (a completed plain one as one whole
            # event, see _make_whole); a message the relay cannot take again fails (finish
            # raises MessageFailed) rather than arrive cut.
            log.warning(
                "relay session not resumed: sending %d messages again from the start",
                len(self._unacked),
            )
        self.session = hello.session
        async with self._lock:
            if not hello.resumed:
                await self._make_whole()
            ended = self._past_limit()
            pending = [
                frame
                for message_id, frames in self._unacked.items()
                for frame in ended.get(message_id, frames)
            ]
            if self._careful:
                await self._send_confirmed(ws, pending)
            else:
                await _send_batches(ws, pending, self._resend_bytes)
            for message_id in ended:  # aborted: nothing of it is acked
                await self._release(message_id)
            self._ws = ws
        self._started.set()

    async def _send_confirmed(self, ws: ClientConnection, frames: list[str]) -> None:
        """Send ``frames`` an event a frame, each followed by a ping, whose pong comes only
        once everything on the way read the event and let it pass; the pongs are awaited
        together, so this takes one round trip, not one per event. If the connection closes
        on the way, the first event not confirmed is the one refused (see
        :meth:`_too_big`). Once every event is confirmed, the resends are no longer
        careful."""
        sent: list[tuple[str, Awaitable[float]]] = []
        try:
            for frame in frames:
                await ws.send(frame)
                sent.append((frame, await ws.ping()))
            for _, pong in sent:
                await pong
        except ConnectionClosed:
            self._confirming = next((frame for frame, pong in sent if not _confirmed(pong)), None)
            raise
        self._careful = False

    def _past_limit(self) -> dict[str, list[str]]:
        """Fail each unacknowledged message holding an event past the relay's frame limit
        (buffered before the limit was known, or before a restart lowered it): sent, it
        would close the connection with 1009, and again at every reconnect. What came
        before that event is sent, with an abort (reason ``error``) in its place, so that
        subscribers see the message end with what the relay has of it, not wait for it;
        ``finish`` raises :class:`MessageFailed` (``message_too_large``). The frames to send
        for each message failed, which is released once they are sent."""
        limit = self._limit()
        if limit is None:
            return {}
        ended: dict[str, list[str]] = {}
        for message_id, frames in self._unacked.items():
            first = next((n for n, frame in enumerate(frames) if len(frame.encode()) > limit), None)
            if first is None:
                continue
            size = len(frames[first].encode())
            reason = f"an event of {size} bytes is past {self._limit_named(limit)}"
            log.warning("message %r failed: %s", message_id, reason)
            self._fail(message_id, ErrorCode.MESSAGE_TOO_LARGE.value, reason)
            if not first:
                ended[message_id] = []  # nothing of it sent before: nothing to end
                continue
            # With no seq, the abort ends the message whatever the relay applied of it: a
            # resumed session's relay may hold the event itself (sent under a higher limit).
            fields: dict[str, Any] = {"id": message_id, "abort": "error"}
            channel = json.loads(frames[0]).get("channel")
            if channel is not None:
                fields["channel"] = channel
            fields["meta"] = {"errorText": f"message_too_large: {reason}"}
            abort = ProducerEvent(**fields).model_dump_json(exclude_defaults=True)
            ended[message_id] = [*frames[:first], abort]
        return ended

    async def _make_whole(self) -> None:
        """In a new session, each completed plain message still unacknowledged becomes one
        whole event (``{"id", "seq": 1, "delta", "final": true}``): if the relay published
        it before its ack was lost with the old session, the same whole message is acked as
        published, not refused as another owner's (see the protocol's ids' hold)."""
        merged = 0
        for message_id, frames in self._unacked.items():
            whole = _whole(message_id, frames, self._resend_bytes)
            if whole is not None:
                merged += len(frames) - 1
                frames[:] = [whole]
                self._seq[message_id] = 1
        if merged:
            async with self._room:
                self._buffered -= merged
                self._room.notify_all()

    async def _handle(self, frame: AnyServerFrame) -> None:
        if isinstance(frame, Ack):
            await self._acked(frame.id, frame)
        elif isinstance(frame, AckBatch):
            for entry in frame.acks:
                ack = Ack(id=entry.id, channel=entry.channel, duplicate=entry.duplicate)
                await self._acked(entry.id, ack)
        elif isinstance(frame, Cancel):
            stop = self._stops.get(frame.id)
            if stop is not None:
                stop.set()
            with contextlib.suppress(asyncio.QueueFull):
                self._cancels.put_nowait(frame)
        elif isinstance(frame, ChatRequest):
            try:
                self._requests.put_nowait(frame)
            except asyncio.QueueFull:
                self._refuse(frame)
        elif isinstance(frame, ErrorFrame):
            if frame.code in RETRIED:
                # Transient: send again shortly; what was applied meanwhile is dropped by seq.
                start = 1 if frame.expected is MISSING else frame.expected
                self._retry_later(frame.id, start)
            elif frame.id is None:
                log.warning("relay refused a frame: %s: %s", frame.code, frame.message)
            elif frame.code is ErrorCode.SEQ_GAP and frame.expected is not MISSING:
                await self._resend_from(frame.id, frame.expected)
            else:
                self._fail(frame.id, frame.code, frame.message)
                await self._release(frame.id)

    def _retry_later(self, message_id: str | None, start: int) -> None:
        """Send again, after a pause, one message's events from ``start`` (or every message's).

        One event per frame, so that a relay limiting the rate takes what it can of them.
        """
        key = message_id or ""
        if key in self._retrying:
            return
        self._retrying.add(key)

        async def retry() -> None:
            try:
                await asyncio.sleep(RETRY_DELAY)
                targets = (
                    [(message_id, start)]
                    if message_id
                    else [(target, 1) for target in list(self._unacked)]
                )
                for target, first in targets:
                    await self._resend_from(target, first, batch=False)
            finally:
                self._retrying.discard(key)

        task = asyncio.create_task(retry())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refuse(self, request: ChatRequest) -> None:
        """A chat request past :data:`MAX_UNREAD_REQUESTS`: end its reply as an error."""
        if self._refusing >= MAX_REFUSING:
            return

        async def refuse() -> None:
            why = f"the gateway has {MAX_UNREAD_REQUESTS} chat requests it has not read yet"
            try:
                await self.fail(request.id, why, channel=request.channel)
            finally:
                self._refusing -= 1

        self._refusing += 1
        task = asyncio.create_task(refuse())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _acked(self, message_id: str, ack: Ack) -> None:
        future = self._acks.pop(message_id, None)
        if future is not None and not future.done():
            future.set_result(ack)
        await self._release(message_id)

    def _fail(self, message_id: str, code: str, reason: str) -> None:
        failure = MessageFailed(message_id, code, reason)
        self._failed[message_id] = failure
        while len(self._failed) > MAX_FAILED:
            self._failed.popitem(last=False)
        future = self._acks.pop(message_id, None)
        if future is not None and not future.done():
            future.set_exception(failure)

    async def _resend_from(self, message_id: str, seq: int, *, batch: bool = True) -> None:
        frames = self._unacked.get(message_id, [])[seq - 1 :]
        async with self._lock:
            if self._ws is None or not frames:
                return
            with contextlib.suppress(ConnectionClosed):
                if batch:
                    await _send_batches(self._ws, frames, self._resend_bytes)
                else:
                    for frame in frames:
                        await self._ws.send(frame)


def _confirmed(pong: Awaitable[float]) -> bool:
    """Whether a ping's pong came (its waiter holds the round trip, not an error)."""
    return (
        isinstance(pong, asyncio.Future)
        and pong.done()
        and not pong.cancelled()
        and pong.exception() is None
    )


def _frame_limit(ws: ClientConnection) -> int | None:
    """The relay's frame limit, as its handshake's response gave it (None if it did not)."""
    response = ws.response
    value = response.headers.get(MAX_FRAME_HEADER) if response is not None else None
    if value is None or not value.isdigit():
        return None
    return int(value)


PLAIN_FIELDS = frozenset({"id", "seq", "delta", "final", "channel"})
"""The fields of a plain message's events (no chunk, meta or abort)."""


def _batches(frames: list[str], limit: int = RESEND_BYTES) -> Iterator[list[str]]:
    """``frames`` in order, in runs of at most :data:`RESEND_BATCH` events whose array
    frame (``[`` the events joined by commas ``]``) is at most ``limit`` bytes (a longer
    event alone)."""
    batch: list[str] = []
    size = 1  # the array's "[" and "]", with the commas counted one per event less
    for frame in frames:
        length = len(frame.encode()) + 1
        if batch and (len(batch) >= RESEND_BATCH or size + length > limit):
            yield batch
            batch, size = [], 1
        batch.append(frame)
        size += length
    if batch:
        yield batch


async def _send_batches(ws: ClientConnection, frames: list[str], limit: int) -> None:
    """Send ``frames`` in :func:`_batches`: an array frame each, or a lone event as itself
    (an event of the relay's very limit would pass it by the array's two brackets)."""
    for chunk in _batches(frames, limit):
        await ws.send(chunk[0] if len(chunk) == 1 else "[" + ",".join(chunk) + "]")


def _whole(message_id: str, frames: list[str], limit: int = RESEND_BYTES) -> str | None:
    """A plain message's events, the last its final, as one whole event; None for any other
    message (structured, with meta, aborted or not yet completed), one already whole, or one
    whose whole event would reach ``limit`` bytes."""
    if len(frames) < 2:
        return None
    events = [json.loads(frame) for frame in frames]
    channel = events[0].get("channel", MISSING)
    for event in events:
        if not PLAIN_FIELDS.issuperset(event) or event.get("channel", MISSING) != channel:
            return None
    if not events[-1].get("final") or any(event.get("final") for event in events[:-1]):
        return None
    fields: dict[str, Any] = {"id": message_id, "seq": 1, "final": True}
    fields["delta"] = "".join(event.get("delta", "") for event in events)
    if channel is not MISSING:
        fields["channel"] = channel
    whole = ProducerEvent(**fields).model_dump_json(exclude_defaults=True)
    return whole if len(whole.encode()) < limit else None
