"""The Redis broker (``redis://HOST:PORT/DB``): many relay processes, one set of channels.

Theory of operation
-------------------
Per channel ``C``, Redis holds:

* ``tr:epoch:C`` the epoch, ``tr:offset:C`` the last offset and ``tr:seq:C``
  the last event number, all refreshed on use and kept for ``KEY_TTL``, from the
  channel's first terminal frame on (before it, a subscribe only reserves the
  epoch, in ``tr:reserved``, one hash for every channel, bounded by
  ``MAX_RESERVED_EPOCHS`` and ``RESERVED_EPOCH_TTL``: junk channel names create no
  key of their own);
* ``tr:history:C`` a Stream of terminal frames with ids ``<offset>-0``, capped
  at ``--history-size`` and expiring ``--history-ttl`` after the last one;
* ``tr:live:C`` the set of messages in progress (``owner|id``), and for each
  the text so far in ``tr:text:owner|id`` (``APPEND``ed per delta, expiring
  after twice ``--idle-timeout`` without an update, so a crashed process's
  texts vanish).

Snapshots of messages in progress on other processes read those texts. Keeping
the text in Redis costs one ``APPEND`` per delta, inside the same script that
publishes the delta, so it adds no round trip; asking the owning process
instead would need a request, a reply and a timeout on every join, and would
fail exactly when the owner is slow.

Each change is one Lua script, so it is atomic: a terminal frame gets its
offset, joins the history and is published in one step, and a catch-up reads
offset, epoch, ``seq``, history and texts as one consistent cut.

Pub/sub topics: ``tr:m:C`` (terminal frames), ``tr:d:C`` (deltas and
snapshots) and ``tr:i:INSTANCE`` (cancels for that process's producers). A
process subscribes to a channel's topics only while it has a local subscriber
there (``tr:d:C`` only for a deltas subscriber), so traffic reaches only the
processes that need it. A published event is ``KIND|SEQ|FRAME``: the frame is
serialized once, by the process that publishes it, and each receiving process
splits off the header and hands the frame bytes on without decoding them. A
delta travels as its fields (``d|SEQ|ID_BYTES|ID TEXT``) rather than as JSON, so
the receiving process can merge deltas (flush window, slow subscribers) without
parsing; it serializes each delta frame once for all its sockets.

Writes are queued and sent by one writer task in pipelines, so a producer's
events reach Redis in order without a round trip each. A message's deltas join its
queued write (one script per message per pipeline, not per delta), and a message whose
final comes while its open is still the last write queued goes whole, in one script
(``WHOLE``): it is never listed as in progress, since nobody could have seen it there.
The queue holds at most ``MAX_QUEUE`` writes; past that, deltas are not queued and their
message is marked for a resync. If Redis is down, terminal writes raise
:class:`~token_relay.core.errors.BrokerUnavailable` (the producer gets
``broker_unavailable`` and no ack, so it retries), deltas mark their message
for a resync, and the reader reconnects with backoff. Once it is back, every
message in progress here is rewritten to Redis (its full text, and a
``snapshot`` frame to deltas subscribers), and the listener is told so that
subscribers resume by offset: what was published meanwhile may have been missed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import MISSING
from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.typing import EncodableT

from ..core.errors import BrokerUnavailable, id_in_use
from ..core.events import CatchUp, Delta, FrameKind, LiveMessage
from ..core.history import judge_replay, new_epoch, rewound_entries
from ..core.protocol import Aborted, AbortReason, Snapshot, encode, encode_unpositioned
from ..core.sessions import SessionState
from ..core.settings import Settings
from . import BrokerListener, WebhookStore, note_not_queued
from .filters import webhook_filter
from .redis_scripts import SCRIPTS
from .redis_webhooks import OUTBOX, OUTBOX_BYTES, RedisWebhooks

hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as hiredis_pack
except ImportError:  # pragma: no cover - redis-py without the [redis] extra's hiredis
    hiredis_pack = None

__all__ = ["RedisBroker"]

log = logging.getLogger("token_relay.redis")

KEY_TTL = 7 * 24 * 3600
CLAIMED = 2
"""TERMINAL's ``strict`` for a message that opened: refused if its claim was refused."""
"""Seconds an idle channel's epoch and offset are kept."""
RESERVED_EPOCH_TTL = 600
"""Seconds the epoch a subscribe reserved for a channel nobody published to is kept."""
MAX_HELD_PER_CHANNEL = 10_000
"""Ids held after their message ended (``--id-hold``) per channel in ``tr:held:C``, at most:
past it the channel's holds start again (the ones before end early)."""
MAX_RESERVED_EPOCHS = 10_000
"""Epochs reserved for channels nobody published to, at most: past it the least recently
subscribed one is dropped (a subscriber that resumes it gets ``recovered: false``)."""
MAX_QUEUE = 100_000
"""Writes waiting for Redis, at most."""
MAX_BATCH = 1000
"""Writes sent in one pipeline, at most."""
MAX_CONNECTIONS = 64
"""Connections to Redis per process; a command waits for a free one (up to 5 s)."""
COMMAND_TIMEOUT = 5.0
"""Seconds a command, or the writer's whole pipeline, may take before Redis counts as hung."""
MAX_JOINS = 32
"""Catch-up reads in flight per process; more joins wait their turn, none is refused."""
MAX_OUTBOX = 10_000
MAX_OUTBOX_BYTES = 64 * 1024 * 1024
"""The outbox's bound in characters of frames (each at least a byte), beside its count."""
"""Terminal frames kept while Redis is down, published in order when it is back."""
PROBE_EVERY = 1.0
"""Seconds between health probes (PING) while Redis answers."""
PROBE_WHEN_DOWN = 0.2
"""Seconds between health probes while it does not."""
PUBSUB_QUIET = 3.0
"""Seconds of pub/sub silence after which the connection is pinged."""
INSTANCES = "tr:instances"
"""The set of every process that holds, or held, a lease."""
PUBSUB_DEAD = 5.0
"""Seconds a pub/sub ping may go unanswered before the connection is replaced."""
_DOWN = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _key(kind: str, name: str) -> str:
    return f"tr:{kind}:{name}"


class _Runs:
    """The delta writes still queued since the last other write, by message.

    A message's next delta joins its run's write instead of queueing one of its own: one
    script per message per run, not one per delta. A message's open starts a run too, so
    its first deltas go with its claim, in one script. Nothing joins across another kind of
    write, so each message's text and order are unchanged; subscribers get fewer, longer
    delta frames, as with ``--delta-flush-ms``. A joined write's event ``seq`` is its
    run's last. The texts are kept as parts and joined once, when the writer takes them.
    """

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: dict[tuple[str, str, str], _Write] = {}

    def join(self, target: tuple[str, str, str], delta: str, seq: int) -> bool:
        """Add ``delta`` to the queued run of ``target``; False if there is none."""
        write = self._open.get(target)
        if write is None:
            return False
        write.args[0].append(delta)
        if seq:
            write.args[5] = seq
        return True

    def opened(self, target: tuple[str, str, str], write: _Write) -> None:
        """``write``, a delta or an open just queued, starts its message's run."""
        write.args[0] = [write.args[0]]
        self._open[target] = write

    def completes(self, target: tuple[str, str, str], last: _Write | None) -> _Write | None:
        """The message's queued open, if it is the last write queued: its terminal frame
        may join it (see ``WHOLE``); the run ends either way."""
        write = self._open.pop(target, None)
        return write if write is not None and write is last and write.script == "open" else None

    def close(self) -> None:
        """Another kind of write was queued, or the writer took the queue: runs end."""
        self._open.clear()


def _taken(write: _Write) -> _Write:
    """A write as the writer takes it: a run's parts joined into its text."""
    if write.script in ("delta", "open") and isinstance(write.args[0], list):
        write.args[0] = "".join(write.args[0])
    elif write.script == "whole":
        write.args[-1] = "".join(write.args[-1])
    return write


_PACKED_BY_HIREDIS = frozenset((str, bytes, int))
"""The argument types hiredis packs as redis-py would (redis-py refuses a bool)."""


def _packed(args: tuple[EncodableT, ...]) -> list[bytes] | None:
    """A command packed by hiredis' C packer: the bytes redis-py's own packer makes from
    strings, bytes and integers (UTF-8, strict), in a fraction of its time; None for any
    other command (a name that is not one plain word, which redis-py splits at its
    spaces; another type of argument) or without hiredis."""
    first = args[0]
    if (
        hiredis_pack is None
        or not (type(first) is str and first.isascii() and first.isalnum())
        or not _PACKED_BY_HIREDIS.issuperset(map(type, args))
    ):
        return None
    return [hiredis_pack(args)]


def _packed_together(commands: list[tuple[EncodableT, ...]]) -> list[bytes] | None:
    """The writer's scripts packed by :func:`_packed` into one buffer, the bytes redis-py's
    packer makes; None if any one of them is not (redis-py's packer decides then)."""
    packed = [_packed(command) for command in commands]
    if None in packed:
        return None
    return [b"".join(parts[0] for parts in packed if parts is not None)]


class _HiredisPacking(AbstractConnection):
    """Mixed in before a redis-py connection class: its commands packed by :func:`_packed`."""

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        return _packed(args) or super().pack_command(*args)


class _Connection(_HiredisPacking, Connection):
    pass


class _SSLConnection(_HiredisPacking, SSLConnection):
    pass


class _UnixConnection(_HiredisPacking, UnixDomainSocketConnection):
    pass


PACKING: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: _Connection,
    SSLConnection: _SSLConnection,
    UnixDomainSocketConnection: _UnixConnection,
}
"""redis-py's connection classes, each with its commands packed by hiredis."""


def _identity(grant: str, settings: Settings) -> str:
    """A session's producer identity for its webhooks, from the grant key it was saved
    with (``[role, channels]``); "" without auth."""
    if settings.open_access or not grant:
        return ""
    try:
        role, channels = json.loads(grant)
    except ValueError:
        return ""
    return json.dumps({"role": role, "channels": channels})


_Deferred = tuple[str, str, str, str, int, bool, str]
"""A terminal frame waiting in the outbox: channel, owner, id, body, seq, aborted, and the
producer identity its webhook carries."""


@dataclass(slots=True)
class _Write:
    script: str
    keys: list[str]
    args: list[Any]
    done: asyncio.Future[Any] | None = None
    message: tuple[str, str, str] | None = field(default=None)
    """(channel, owner, id) of a delta, so a failed one marks its message for a resync."""
    deferred: _Deferred | None = None
    """A terminal frame from the outbox: put back if it fails."""
    claim: tuple[str, str, str] | None = None
    """(channel, owner, id) of an open, so a refused claim is reported."""
    webhook: tuple[str, str] | None = None
    """(channel, id) of a terminal frame its webhook takes, so a full outbox is reported."""
    terminal: tuple[str, str, str] | None = None
    """(channel, owner, id) of a terminal frame someone waits for: its future ends with the
    frame's text, or ``id_in_use``."""


class RedisBroker:
    """A broker shared by relay processes through one Redis server."""

    def __init__(self, url: str, settings: Settings, instance: str) -> None:
        self.url = url
        self.instance = instance
        self.settings = settings
        self._redis: Redis | None = None
        self._listener: BrokerListener | None = None
        self._queue: asyncio.Queue[_Write] = asyncio.Queue(MAX_QUEUE)
        self._runs = _Runs()
        """The queued delta writes the next deltas of their messages join."""
        self._last: _Write | None = None
        """The write queued last, while it waits in the queue."""
        self._shas: dict[str, str] = {}
        self._topics: set[str] = set()
        self._pubsub: Any = None
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        self._dirty: set[tuple[str, str, str]] = set()
        self._flushes: dict[str, asyncio.Future[None]] = {}
        self._up = False
        """The last probe (or connect) reached Redis."""
        self._had_answer = False
        self._listening = False
        """The pub/sub connection is subscribed and reading."""
        self._probe_now = asyncio.Event()
        self._joins = asyncio.Semaphore(MAX_JOINS)
        self._outbox: collections.deque[_Deferred] = collections.deque()
        self._outbox_bytes = 0
        self._pool: BlockingConnectionPool | None = None
        self._writes: BlockingConnectionPool | None = None
        """The writer's own pool of one connection, which it holds (:attr:`_writer`)."""
        self._writer: AbstractConnection | None = None
        """The writer's connection: its pipelines are timed as a whole (see
        :meth:`_execute`), not reply by reply."""
        self._outages = 0
        """Times Redis was seen gone; the writer reconnects after each (see :meth:`_execute`)."""
        self._writes_since = 0
        """The outages the writer's connection has been renewed after."""
        self._closing = False
        self._leaving = False
        self._lease = settings.lease_seconds
        self._tasks: list[asyncio.Task[None]] = []
        self._inbox = _key("i", instance)
        self._text_ttl = max(1, int(settings.idle_timeout * 2))
        self.webhooks: WebhookStore | None = (
            RedisWebhooks(settings, instance, self._client, self._run)
            if settings.webhooks
            else None
        )
        self._wants_webhook = webhook_filter(settings)

    # ------------------------------------------------------------------ lifecycle

    @property
    def healthy(self) -> bool:
        """A fact about Redis, probed: it answers PING and the pub/sub connection is up.

        A failed command does not clear it; it only makes the next probe come at once.
        """
        return self._up and self._listening

    async def start(self, listener: BrokerListener) -> None:
        """Connect (if Redis is up) and start the reader, writer and probe tasks."""
        self._listener = listener
        self._pool = self._connect(MAX_CONNECTIONS, COMMAND_TIMEOUT)
        self._redis = Redis(connection_pool=self._pool)
        # The writer runs one pipeline at a time (a retry after NOSCRIPT included).
        self._writes = self._connect(1, None)
        connected = asyncio.get_running_loop().create_future()
        self._tasks = [
            asyncio.create_task(self._read_forever(connected)),
            asyncio.create_task(self._write_forever()),
            asyncio.create_task(self._probe_forever()),
            asyncio.create_task(self._lease_forever()),
        ]
        # Serve at once either way: if Redis is down, readiness says so and the
        # reader keeps retrying in the background.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(connected), 3)

    async def close(self) -> None:
        """Stop the tasks and disconnect."""
        self._closing = True
        # A cancel that lands while a library's own timeout fires can be swallowed by it:
        # cancel again until every task has ended (each loop also checks _closing).
        for _ in range(50):
            pending = [task for task in self._tasks if not task.done()]
            if not pending:
                break
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=0.1)
        self._tasks = []
        for closing in (
            self._pubsub.aclose() if self._pubsub is not None else None,
            self._redis.aclose() if self._redis is not None else None,
            self._pool.disconnect() if self._pool is not None else None,
            self._writes.disconnect() if self._writes is not None else None,
        ):
            if closing is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(closing, 2)
        self._up = self._listening = False

    async def flush(self) -> None:
        """Wait until a marker published now comes back: pub/sub keeps order on one connection."""
        token = secrets.token_hex(8)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flushes[token] = waiter
        try:
            await self._client().publish(self._inbox, f"f|{token}|")
            await asyncio.wait_for(waiter, 5)
        except (*_DOWN, TimeoutError) as exc:
            raise BrokerUnavailable(str(exc)) from None
        finally:
            self._flushes.pop(token, None)

    async def ready(self) -> bool:
        """Ping Redis."""
        try:
            assert self._redis is not None
            await self._redis.ping()
        except _DOWN:
            return False
        return True

    # ------------------------------------------------------------------ events out

    def open(self, channel: str, owner: str, message_id: str, seq: int = 0) -> bool:
        """Claim the id and register the message as in progress, with empty text.

        Always True here: the claim is settled in Redis, in order with the message's
        deltas (which are dropped there if the claim failed), and a refused claim is
        reported to :meth:`BrokerListener.on_claim_refused`.
        """
        member, target = f"{owner}|{message_id}", (channel, owner, message_id)
        write = _Write(
            "open",
            [
                _key("seq", channel),
                _key("live", channel),
                _key("text", member),
                _key("d", channel),
                _key("own", channel),
            ],
            ["", message_id, self._text_ttl, KEY_TTL, owner, seq, channel, member],
            message=target,
            claim=target,
        )
        if self._enqueue(write, target):
            self._runs.opened(target, write)  # its first deltas join it: one script
        return True

    def delta(
        self,
        channel: str,
        owner: str,
        message_id: str,
        delta: str,
        seq: int = 0,
        claimed: bool = True,
    ) -> None:
        """Append to the message's text in Redis and publish the delta frame."""
        target = (channel, owner, message_id)
        if target in self._dirty:
            self._resync(*target)
            return
        if self._runs.join(target, delta, seq):
            return
        member = f"{owner}|{message_id}"
        write = _Write(
            "delta",
            [
                _key("seq", channel),
                _key("live", channel),
                _key("text", member),
                _key("d", channel),
                _key("own", channel),
            ],
            [delta, message_id, self._text_ttl, KEY_TTL, owner, seq, channel, int(claimed)],
            message=target,
        )
        if self._enqueue(write, target):
            self._runs.opened(target, write)

    def progress(self, channel: str, owner: str, message_id: str, seq: int) -> None:
        """Note the seq of an event that carried no text, so a resume elsewhere knows it."""
        self._enqueue(
            _Write("progress", [], [owner, message_id, seq, channel]), (channel, owner, message_id)
        )

    def meta(self, channel: str, owner: str, message_id: str, meta: str) -> None:
        """Keep a message's merged metadata for a process that takes its session over."""
        self._enqueue(
            _Write("meta", [_key("meta", owner)], [message_id, meta, KEY_TTL]),
            (channel, owner, message_id),
        )

    def _terminal_write(
        self,
        channel: str,
        owner: str,
        message_id: str,
        body: str,
        done: asyncio.Future[Any] | None,
        seq: int = 0,
        aborted: bool = False,
        strict: int = 0,
        producer: str = "",
    ) -> _Write:
        """The TERMINAL write. ``strict``: 0, the id may be free or the owner's; 1 (a
        reaper's abort), the owner must hold it; :data:`CLAIMED` (a message that opened),
        its claim must not have been refused."""
        member = f"{owner}|{message_id}"
        webhook = self._wants_webhook(channel)  # False without --webhook
        return _Write(
            "terminal",
            [
                _key("epoch", channel),
                _key("offset", channel),
                _key("seq", channel),
                _key("history", channel),
                _key("live", channel),
                _key("text", member),
                _key("m", channel),
                _key("own", channel),
                OUTBOX,
                OUTBOX_BYTES,
            ],
            [
                body,
                new_epoch(),
                self.settings.history_size,
                int(time.time() * 1000),
                member,
                max(1, int(self.settings.history_ttl)),
                KEY_TTL,
                message_id,
                owner,
                seq,
                "a" if aborted else "m",
                self.settings.max_completed_per_producer,
                strict,
                channel,
                int(webhook),
                producer,
                self.settings.webhook_max_pending,
                self.settings.webhook_max_pending_bytes,
                0 if aborted else int(self.settings.id_hold * 1000),  # completed ids only
                MAX_HELD_PER_CHANNEL,
            ],
            done,
            webhook=(channel, message_id) if webhook else None,
        )

    def terminal(
        self,
        channel: str,
        owner: str,
        message_id: str,
        body: str,
        seq: int = 0,
        aborted: bool = False,
        producer: str = "",
        claimed: bool = False,
    ) -> asyncio.Future[str]:
        """Queue the terminal write now, in order; the future ends once Redis ran it: the
        frame given its offset, added to history and published, atomically (and its
        webhook queued)."""
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if not self.healthy or self._queue.full():
            done.set_exception(BrokerUnavailable("Redis is unreachable"))
            return done
        target = (channel, owner, message_id)
        opening = self._runs.completes(target, self._last)
        # Joined to its open (WHOLE), the claim is checked in the same script.
        strict = CLAIMED if claimed and opening is None else 0
        write = self._terminal_write(
            channel, owner, message_id, body, done, seq, aborted, strict, producer
        )
        write.terminal = target
        if opening is None:
            self._put(write)
            return done
        # Nothing of the message reached Redis yet, and nothing was queued after its open:
        # the open, its deltas and the terminal frame go as one script, in the open's place.
        opening.script, opening.done, opening.terminal = "whole", done, target
        opening.keys = [*write.keys, _key("d", channel)]
        opening.args = [*write.args, opening.args[0]]
        opening.webhook = write.webhook
        self._runs.close()
        return done

    def defer(
        self,
        channel: str,
        owner: str,
        message_id: str,
        body: str,
        seq: int = 0,
        aborted: bool = False,
        producer: str = "",
    ) -> None:
        """Publish a terminal frame as soon as Redis takes it: now, or once it is back.

        Frames wait in an outbox of at most :data:`MAX_OUTBOX` frames and
        :data:`MAX_OUTBOX_BYTES`, published in the order they came; past either the
        oldest is dropped, and logged.
        """
        self._outbox.append((channel, owner, message_id, body, seq, aborted, producer))
        self._outbox_bytes += len(body)
        while len(self._outbox) > MAX_OUTBOX or self._outbox_bytes > MAX_OUTBOX_BYTES:
            lost = self._outbox.popleft()
            self._outbox_bytes -= len(lost[3])
            log.error("outbox full: dropped the terminal frame of %r on %r", lost[2], lost[0])
        if self.healthy:
            self._drain_outbox()

    def _drain_outbox(self) -> None:
        while self._outbox and not self._queue.full():
            deferred = self._outbox.popleft()
            channel, owner, message_id, body, seq, aborted, producer = deferred
            self._outbox_bytes -= len(body)
            write = self._terminal_write(
                channel, owner, message_id, body, None, seq, aborted, producer=producer
            )
            write.deferred = deferred
            self._put(write)

    # ------------------------------------------------------------------ sessions

    shares_sessions = True
    """Producer sessions live in Redis: a producer resumes on any process."""

    async def save_session(self, token: str, owner: str, grant: str) -> None:
        """Record a new session, so that any process can take it over."""
        try:
            pipe = self._client().pipeline(transaction=True)
            pipe.hset(_key("session", token), mapping={
                "owner": owner, "instance": self.instance, "grant": grant,
            })  # fmt: skip
            pipe.expire(_key("session", token), KEY_TTL)
            pipe.sadd(_key("sessions", self.instance), token)
            await pipe.execute()
        except (*_DOWN, redis_errors.RedisError) as exc:
            self._suspect()
            raise BrokerUnavailable(str(exc)) from None

    async def take_session(self, token: str, grant: str, owner: str) -> SessionState | None:
        """Move a session to ``owner`` on this process; None if there is none to take.

        The process that had it is told, so it lets go of it without aborting anything.
        """
        await self.flush_writes()
        try:
            reply = await self._run(
                "take",
                [_key("session", token)],
                [owner, self.instance, grant, self._text_ttl, KEY_TTL, token],
            )
        except (*_DOWN, redis_errors.RedisError) as exc:
            self._suspect()
            raise BrokerUnavailable(str(exc)) from None
        if not reply:
            return None
        old_owner, old_instance, flat, ended_flat = (
            _text(reply[0]),
            _text(reply[1]),
            reply[2],
            reply[3],
        )
        streaming = []
        for index in range(0, len(flat), 3):
            message_id = _text(flat[index])
            seq, _, channel = _text(flat[index + 1]).partition("|")
            streaming.append((message_id, channel, int(seq), _text(flat[index + 2])))
        ended = []
        for index in range(0, len(ended_flat), 2):
            outcome, seq, channel = _text(ended_flat[index + 1]).split("|", 2)
            ended.append((_text(ended_flat[index]), channel, int(seq), outcome == "a"))
        meta: dict[str, dict[str, Any]] = {}
        with contextlib.suppress(*_DOWN, redis_errors.RedisError, ValueError):
            kept = await self._client().hgetall(_key("meta", old_owner))
            meta = {_text(k): json.loads(_text(v)) for k, v in kept.items()}
            if kept:
                await self._client().rename(_key("meta", old_owner), _key("meta", owner))
        if old_instance and old_instance != self.instance:
            with contextlib.suppress(*_DOWN, redis_errors.RedisError):
                await self._client().publish(_key("i", old_instance), f"x|{old_owner}|")
        return SessionState(old_owner, old_instance, streaming, ended, meta)

    async def end_session(self, token: str, owner: str) -> None:
        """Forget a session that ended here (its aborts are already published)."""
        with contextlib.suppress(*_DOWN, redis_errors.RedisError):
            await self._client().delete(
                _key("session", token),
                _key("msg", owner),
                _key("done", owner),
                _key("dl", owner),
                _key("meta", owner),
            )
            await self._client().srem(_key("sessions", self.instance), token)

    async def leave(self) -> None:
        """Hand this process's sessions over: the others abort what no producer resumes
        within ``--session-grace`` (reason ``shutdown``)."""
        await self.flush_writes()
        with contextlib.suppress(*_DOWN, redis_errors.RedisError):
            pipe = self._client().pipeline(transaction=True)
            pipe.set(_key("leaving", self.instance), 1, ex=KEY_TTL)
            pipe.delete(_key("lease", self.instance))
            await pipe.execute()
        self._leaving = True

    async def flush_writes(self) -> None:
        """Wait until every write queued so far has been executed (or has failed)."""
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not self.healthy or self._queue.full():
            return
        self._put(_Write("progress", [], ["", "", 0, ""], done))
        with contextlib.suppress(BrokerUnavailable, TimeoutError):
            await asyncio.wait_for(done, 5)

    # ------------------------------------------------------------------ leases

    async def _lease_forever(self) -> None:
        """Hold this process's lease; reap the sessions of processes whose lease lapsed."""
        lapsed: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        while not self._closing:
            try:
                redis = self._client()
                if not self._leaving:
                    pipe = redis.pipeline(transaction=False)
                    pipe.set(_key("lease", self.instance), 1, px=int(self._lease * 1000))
                    pipe.sadd(INSTANCES, self.instance)
                    await pipe.execute()
                now = loop.time()
                for raw in await redis.smembers(INSTANCES):
                    other = _text(raw)
                    if other == self.instance or await redis.exists(_key("lease", other)):
                        lapsed.pop(other, None)
                        continue
                    since = lapsed.setdefault(other, now)
                    if now - since >= self.settings.session_grace and not self._leaving:
                        if await redis.set(_key("reap", other), self.instance, nx=True, ex=60):
                            await self._reap(other)
                        lapsed.pop(other, None)
            except asyncio.CancelledError:
                raise
            except (*_DOWN, redis_errors.RedisError, BrokerUnavailable) as exc:
                self._suspect()
                log.info("lease round failed (%s)", exc)
            await asyncio.sleep(self._lease / 3)

    async def _reap(self, instance: str) -> None:
        """Abort, once, what a gone process's sessions left unfinished, then forget them."""
        redis = self._client()
        leaving = bool(await redis.exists(_key("leaving", instance)))
        reason = AbortReason.SHUTDOWN if leaving else AbortReason.RELAY_LOST
        aborted = 0
        for raw_token in await redis.smembers(_key("sessions", instance)):
            token = _text(raw_token)
            session = await redis.hgetall(_key("session", token))
            values = {_text(k): _text(v) for k, v in session.items()}
            owner = values.get("owner")
            if owner is None or values.get("instance") != instance:
                continue  # resumed elsewhere meanwhile
            producer = _identity(values.get("grant", ""), self.settings)
            messages = await redis.hgetall(_key("msg", owner))
            kept = await redis.hgetall(_key("meta", owner))
            metas = {_text(k): _text(v) for k, v in kept.items()}
            for raw_id, raw_value in messages.items():
                message_id = _text(raw_id)
                seq, _, channel = _text(raw_value).partition("|")
                text = await redis.get(_key("text", f"{owner}|{message_id}"))
                body = encode_unpositioned(
                    Aborted(
                        channel=channel,
                        id=message_id,
                        text=_text(text) if text is not None else "",
                        reason=reason,
                        meta=json.loads(metas[message_id]) if message_id in metas else MISSING,
                        offset=0,
                        epoch="",
                    )
                )
                done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                self._put(
                    self._terminal_write(
                        channel,
                        owner,
                        message_id,
                        body,
                        done,
                        int(seq),
                        True,
                        strict=1,
                        producer=producer,
                    )
                )
                with contextlib.suppress(BrokerUnavailable):
                    if not isinstance(await done, int):
                        aborted += 1
            await redis.delete(
                _key("session", token),
                _key("msg", owner),
                _key("done", owner),
                _key("dl", owner),
                _key("meta", owner),
            )
        await redis.delete(_key("sessions", instance), _key("leaving", instance))
        await redis.srem(INSTANCES, instance)
        log.warning(
            "relay %s is gone (%s): aborted %d messages its producers did not resume",
            instance,
            "left" if leaving else "lease lapsed",
            aborted,
        )

    @property
    def outbox(self) -> int:
        """Terminal frames waiting for Redis."""
        return len(self._outbox)

    def memory_bytes(self) -> int:
        """Characters this process holds for the broker: the outbox's frames."""
        return self._outbox_bytes

    async def cancel(self, channel: str, message_id: str, frame: str) -> int:
        """Publish the cancel to each process owning the message; count those that got it."""
        redis = self._client()
        try:
            members = await redis.smembers(_key("live", channel))
            pairs = [_text(member).split("|", 1) for member in members]
            owners = [owner for owner, open_id in pairs if open_id == message_id]
            delivered = 0
            for owner in owners:
                instance = owner.rsplit(".", 1)[0]
                delivered += bool(await redis.publish(_key("i", instance), f"c|{owner}|{frame}"))
        except _DOWN as exc:
            self._suspect()
            raise BrokerUnavailable(str(exc)) from None
        return delivered

    # ------------------------------------------------------------------ events in

    async def listen(self, channel: str, messages: bool, deltas: bool) -> None:
        """Subscribe to exactly the topics this process needs for ``channel``."""
        wanted = {
            topic
            for topic, on in ((_key("m", channel), messages), (_key("d", channel), deltas))
            if on
        }
        current = {
            topic for topic in (_key("m", channel), _key("d", channel)) if topic in self._topics
        }
        added, removed = wanted - current, current - wanted
        self._topics |= added
        self._topics -= removed
        pubsub = self._pubsub
        if pubsub is None or not self._listening:
            if added:
                raise BrokerUnavailable("Redis is unreachable")
            return
        try:
            if removed:
                await pubsub.unsubscribe(*removed)
            if added:
                loop = asyncio.get_running_loop()
                waits = [self._confirmed.setdefault(topic, loop.create_future()) for topic in added]
                await pubsub.subscribe(*added)
                await asyncio.wait_for(asyncio.gather(*waits), 5)
        except (TimeoutError, *_DOWN) as exc:
            raise BrokerUnavailable(str(exc)) from None

    async def catch_up(
        self, channel: str, since: tuple[int, str] | None, live: bool, rewind: int = 0
    ) -> CatchUp:
        """Read the channel's cut in one script."""
        try:
            async with self._joins:
                reply = await self._run_catch_up(channel, since, live, rewind)
        except _DOWN as exc:
            self._suspect()
            raise BrokerUnavailable(str(exc)) from None
        return self._cut(since, reply, rewind)

    async def _run_catch_up(
        self, channel: str, since: tuple[int, str] | None, live: bool, rewind: int = 0
    ) -> Any:
        return await self._run(
            "catch_up",
            [
                _key("epoch", channel),
                _key("offset", channel),
                _key("seq", channel),
                _key("history", channel),
                _key("live", channel),
                _key("own", channel),
            ],
            [
                -1 if since is None else since[0],
                new_epoch(),
                int(live),
                KEY_TTL,
                _key("text", ""),
                RESERVED_EPOCH_TTL,
                rewind if since is None else 0,
                channel,
                time.time_ns() // 1000,
                MAX_RESERVED_EPOCHS,
            ],
        )

    def _cut(self, since: tuple[int, str] | None, reply: Any, rewind: int = 0) -> CatchUp:
        epoch_raw, offset, seq, entries, flat_live = reply
        epoch = epoch_raw.decode()
        recovered: bool | None = None
        frames: list[str] = []
        ages: list[float] = []
        if since is not None or rewind:
            now = time.time()
            oldest_ms = (now - self.settings.history_ttl) * 1000
            tail = []
            for entry_id, fields in entries:
                values = dict(zip(fields[::2], fields[1::2], strict=True))
                recorded_ms = float(values[b"t"])
                if recorded_ms < oldest_ms:
                    continue
                offset_of = int(entry_id.split(b"-")[0])
                tail.append((offset_of, recorded_ms / 1000, values[b"f"].decode()))
            if since is not None:
                replay = judge_replay(since[0], since[1], int(offset), epoch, tail)
                recovered, frames = replay.recovered, replay.frames
            else:
                run = rewound_entries(sorted(tail), int(offset), rewind)
                frames = [frame for _, _, frame in run]
                ages = [now - recorded for _, recorded, _ in run]
        messages = []
        for member, text in zip(flat_live[::2], flat_live[1::2], strict=True):
            owner, message_id = member.decode().split("|", 1)
            messages.append(LiveMessage(owner, message_id, text.decode()))
        return CatchUp(int(offset), epoch, recovered, frames, int(seq), messages, ages)

    # ------------------------------------------------------------------ tasks

    async def _read_forever(self, connected: asyncio.Future[None]) -> None:
        backoff = 0.1
        had_outage = False
        while not self._closing:
            try:
                await self._connect_pubsub()
                await self._load_scripts()
                self._up = self._listening = True
                backoff = 0.1
                if not connected.done():
                    connected.set_result(None)
                if had_outage:
                    log.warning("Redis is back: resynchronizing")
                    self._drain_outbox()
                    self._resync_all()
                    if self._listener is not None:
                        self._listener.on_restored()
                    had_outage = False
                await self._dispatch()
            except asyncio.CancelledError:
                raise
            except (*_DOWN, redis_errors.RedisError, BrokerUnavailable) as exc:
                if self._listening or not had_outage:
                    log.warning("Redis unreachable (%s); retrying with backoff", exc)
                self._listening = False
                self._outages += 1
                self._suspect()
                had_outage = True
                for waiter in self._confirmed.values():
                    if not waiter.done():
                        waiter.set_exception(BrokerUnavailable(str(exc)))
                self._confirmed.clear()
                await asyncio.sleep(backoff * (0.5 + secrets.randbelow(1000) / 1000))
                backoff = min(backoff * 2, 2.0)

    async def _connect_pubsub(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
        self._pubsub = self._client().pubsub()
        await self._pubsub.subscribe(self._inbox, *self._topics)

    async def _dispatch(self) -> None:
        """Read pub/sub until it fails. Silence is timed by one timer moved at most twice a
        second, not by a timer per message: a connection quiet for about
        :data:`PUBSUB_QUIET` is pinged, and one still quiet :data:`PUBSUB_DEAD` after that
        may be dead without a reset, so it is replaced."""
        pubsub = self._pubsub
        loop = asyncio.get_running_loop()
        inbox = self._inbox.encode()
        pinged = False
        while not self._closing:
            quiet = asyncio.timeout(PUBSUB_DEAD if pinged else PUBSUB_QUIET)
            try:
                async with quiet:
                    moved = loop.time()
                    while not self._closing:
                        message = await pubsub.get_message(timeout=None)
                        pinged = False
                        now = loop.time()
                        if now - moved > 0.5:
                            moved = now
                            quiet.reschedule(now + PUBSUB_QUIET)
                        if message is not None:
                            self._take(message, inbox)
            except TimeoutError:
                if not quiet.expired():
                    raise
                if pinged:
                    raise BrokerUnavailable("the pub/sub connection stopped answering") from None
                await pubsub.ping()
                pinged = True

    def _take(self, message: dict[str, Any], inbox: bytes) -> None:
        """One pub/sub message: a subscription confirmed, a note to this process, or a
        channel's frame for the listener."""
        listener = self._listener
        kind = message["type"]
        if kind == "pong":
            return
        topic: bytes = message["channel"]
        if kind == "subscribe":
            waiter = self._confirmed.pop(topic.decode(), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        if kind != "message" or listener is None:
            return
        data: bytes = message["data"]
        if topic == inbox:
            what, name, payload = data.split(b"|", 2)
            if what == b"f":
                waiter = self._flushes.get(name.decode())
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            elif what == b"x":
                listener.on_session_moved(name.decode())
            else:
                listener.on_cancel(name.decode(), payload)
            return
        frame_kind, seq, payload = data.split(b"|", 2)
        channel = topic[5:].decode()
        if frame_kind == b"d":
            # KIND|SEQ|ID_BYTES|ID TEXT: the delta's fields, never JSON to parse.
            size, rest = payload.split(b"|", 1)
            cut = int(size)
            delta = Delta(channel, rest[:cut].decode(), rest[cut:].decode())
            listener.on_delta(channel, int(seq), delta)
        else:
            listener.on_frame(channel, FrameKind(frame_kind.decode()), int(seq), payload)

    async def _write_forever(self) -> None:
        queue = self._queue
        while not self._closing:
            batch = [await queue.get()]
            while len(batch) < MAX_BATCH and not queue.empty():
                batch.append(queue.get_nowait())
            self._runs.close()  # taken: no delta joins these any more
            self._last = None
            batch = [_taken(write) for write in batch]
            try:
                results = await self._execute(batch)
            except asyncio.CancelledError:
                raise
            except (*_DOWN, redis_errors.RedisError) as exc:
                self._suspect()
                results = [BrokerUnavailable(str(exc))] * len(batch)
            for write, result in reversed(list(zip(batch, results, strict=True))):
                if isinstance(result, Exception) and write.deferred is not None:
                    self._outbox.appendleft(write.deferred)  # in order, for the next try
                    self._outbox_bytes += len(write.deferred[3])
            for n, (write, result) in enumerate(zip(batch, results, strict=True)):
                if write.script in ("terminal", "whole") and isinstance(result, list):
                    frame, queued = result
                    if write.webhook is not None and not queued and self.webhooks is not None:
                        note_not_queued(self.webhooks, *write.webhook)
                    results[n] = result = frame
                failed = isinstance(result, Exception)
                if failed and write.message is not None:
                    self._dirty.add(write.message)
                if write.claim is not None and result == 0 and self._listener is not None:
                    self._listener.on_claim_refused(*write.claim)
                if write.done is not None and not write.done.done():
                    if failed:
                        write.done.set_exception(BrokerUnavailable(str(result)))
                    elif write.terminal is not None:
                        self._settle(write.done, write.terminal, result)
                    else:
                        write.done.set_result(result)

    def _settle(
        self, done: asyncio.Future[Any], target: tuple[str, str, str], frame: bytes | int
    ) -> None:
        """A terminal write ran: its frame, or 0 when another owner held the id."""
        self._dirty.discard(target)
        if isinstance(frame, int):
            done.set_exception(id_in_use(target[0], target[2]))
        else:
            done.set_result(frame.decode())

    async def _execute(self, batch: list[_Write]) -> list[Any]:
        """Run the writes as one pipeline, under one deadline: a reply's own timeout (a
        timer per reply) would cost more than the script that sent it.

        The commands go out as one packed write on the writer's connection and the replies
        are read in order, each error reply in its place: what redis-py's pipeline does,
        without its Python per command and per pipeline (its command stack, response
        callbacks, retries and observability hooks), which cost more than the relay's own
        work per message. Nothing is retried here: a write that fails is answered
        ``broker_unavailable`` (a final) or resynced (deltas), as the writer's loop says.
        """
        if self._writes is None:
            raise BrokerUnavailable("the broker is not started")
        if self._writes_since != self._outages:
            # Its connection may lead to a Redis that is gone (a restarted one does not
            # know it): a write on it would fail once Redis is back. It reconnects on use.
            self._writes_since = self._outages
            await self._writes.disconnect()
        connection = self._writer
        if connection is None:
            async with asyncio.timeout(COMMAND_TIMEOUT):
                connection = self._writer = await self._writes.get_connection()  # type: ignore[no-untyped-call]
        shas = self._shas
        commands = [
            ("EVALSHA", shas[write.script], len(write.keys), *write.keys, *write.args)
            for write in batch
        ]
        results: list[Any] = []
        async with asyncio.timeout(COMMAND_TIMEOUT):
            # On the deadline redis-py drops the connection it was reading (the replies
            # left on it would answer the next pipeline) and the writes count as failed.
            packed = _packed_together(commands) or connection.pack_commands(commands)
            await connection.send_packed_command(packed, check_health=False)
            for _ in commands:
                try:
                    results.append(await connection.read_response())
                except redis_errors.ResponseError as exc:
                    results.append(exc)
        if any(isinstance(r, redis_errors.NoScriptError) for r in results):
            await self._load_scripts()
            retry = [
                w
                for w, r in zip(batch, results, strict=True)
                if isinstance(r, redis_errors.NoScriptError)
            ]
            again = iter(await self._execute(retry))
            results = [
                next(again) if isinstance(r, redis_errors.NoScriptError) else r for r in results
            ]
        return results

    # ------------------------------------------------------------------ helpers

    def _connect(self, connections: int, timeout: float | None) -> BlockingConnectionPool:
        """A pool of connections to Redis, packing commands with hiredis; ``timeout`` is
        each reply's (None: the caller times the whole exchange)."""
        pool = BlockingConnectionPool.from_url(
            self.url,
            max_connections=connections,
            timeout=5,
            socket_timeout=timeout,
            socket_connect_timeout=2,
            retry_on_error=[],
        )
        pool.connection_class = PACKING.get(pool.connection_class, pool.connection_class)
        return pool

    def _client(self) -> Redis:
        if self._redis is None:
            raise BrokerUnavailable("the broker is not started")
        return self._redis

    async def _load_scripts(self) -> None:
        redis = self._client()
        for name, source in SCRIPTS.items():
            self._shas[name] = await redis.script_load(source)

    async def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        redis = self._client()
        if script not in self._shas:
            raise BrokerUnavailable("Redis is unreachable")
        try:
            return await redis.evalsha(self._shas[script], len(keys), *keys, *args)
        except redis_errors.NoScriptError:
            await self._load_scripts()
            return await redis.evalsha(self._shas[script], len(keys), *keys, *args)

    def _suspect(self) -> None:
        """A command failed: probe Redis now rather than at the next round."""
        self._probe_now.set()

    async def _probe_forever(self) -> None:
        """Keep :attr:`healthy` a fact: PING Redis every second, five times that when down."""
        while not self._closing:
            try:
                async with asyncio.timeout(2):
                    await self._client().ping()
                up = True
            except (*_DOWN, TimeoutError, redis_errors.RedisError):
                up = False
            if not up and self._up:
                self._outages += 1
            if up != self._up and (up is False or self._had_answer):
                log.warning("Redis %s", "answers again" if up else "does not answer")
            self._had_answer = self._had_answer or up
            self._up = up
            self._probe_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._probe_now.wait(), PROBE_EVERY if up else PROBE_WHEN_DOWN
                )

    def _enqueue(self, write: _Write, target: tuple[str, str, str]) -> bool:
        if not self.healthy or self._queue.full():
            self._dirty.add(target)
            return False
        self._put(write)
        return True

    def _put(self, write: _Write) -> None:
        """Queue a write; any but a delta ends every run of deltas (see :class:`_Runs`)."""
        if write.script != "delta":
            self._runs.close()
        self._queue.put_nowait(write)
        self._last = write

    def _resync(self, channel: str, owner: str, message_id: str) -> None:
        """Rewrite a message's whole text to Redis and send it as a snapshot."""
        if self._listener is None:
            return
        text = self._listener.partial(owner, message_id)
        if text is None:
            self._dirty.discard((channel, owner, message_id))
            return
        if not self.healthy or self._queue.full():
            return
        member = f"{owner}|{message_id}"
        snapshot = encode(Snapshot(channel=channel, id=message_id, text=text))
        self._dirty.discard((channel, owner, message_id))
        self._put(
            _Write(
                "resync",
                [
                    _key("seq", channel),
                    _key("live", channel),
                    _key("text", member),
                    _key("d", channel),
                    _key("own", channel),
                ],
                [member, text, snapshot, self._text_ttl, KEY_TTL, message_id, owner],
                message=(channel, owner, message_id),
            )
        )

    def _resync_all(self) -> None:
        """After an outage, rewrite every message in progress here (Redis may have lost them)."""
        if self._listener is not None:
            self._dirty.update(self._listener.owned_messages())
        for target in list(self._dirty):
            self._resync(*target)
