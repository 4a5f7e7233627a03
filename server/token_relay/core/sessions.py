"""Producer sessions: attach, park, resume and evict.

Theory of operation
-------------------
A producer works through a :class:`ProducerSession`: its message streams
(:class:`~token_relay.core.streams.MessageStreams`), its rate bucket, its grant,
what the broker could not publish yet, and the connection it is attached to.
The session outlives its connection when the connection *vanishes* (no close
frame): it is **parked** for ``grace`` seconds, and a producer that reconnects
with the session's token in time is **attached** to it again and continues, so
subscribers see no ``aborted``. A session is bound to the grant that opened it:
a token with another identity gets a new session.

A session ends when its producer closes cleanly, when its grace runs out, when
more than ``max_parked`` sessions are parked (the oldest parked one ends), or at
shutdown. The table says which sessions ended; the edge aborts their unfinished
messages (:meth:`ProducerSession.end`) and owns the timers.

Named producers. A named HTTP producer's session (its token comes from its name)
waits between its requests, parked, but it is never ended to make room: the
parking bounds count only the others. Instead, a request that would open one
more named session than ``max_named_per_address`` for its address, or than
``max_parked`` in all, is refused (``too_many_producers``), and nothing ends.
Several requests of one named producer may be attached at once, up to
:data:`MAX_REQUESTS_PER_NAME` (then ``producer_busy``): each applies its own
events to the one session, and the session parks once the last one ends.

Pure: the caller passes ``now``, and a connection is any hashable handle.
"""

from __future__ import annotations

import itertools
import secrets
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .errors import ErrorCode, FrameRejected, PartRejected
from .events import Payload
from .grants import Grant
from .parts import MessageParts
from .ratelimit import TokenBucket
from .streams import MessageStreams, Unfinished

__all__ = [
    "MAX_PARKED_CANCELS",
    "MAX_REQUESTS_PER_NAME",
    "ProducerSession",
    "SessionState",
    "SessionTable",
    "replay",
]

C = TypeVar("C", bound=Hashable)

MAX_PARKED_CANCELS = 100
"""Cancels kept for a parked session, delivered when it resumes; the oldest fall out."""

MAX_REQUESTS_PER_NAME = 256
"""Requests of one named producer attached at once; one more is refused (``producer_busy``)."""


@dataclass(frozen=True, slots=True)
class SessionState:
    """A session as a shared broker keeps it, for a process that takes it over."""

    old_owner: str
    old_instance: str
    streaming: list[tuple[str, str, int, str]]
    """``(id, channel, last seq, text so far)`` of each message in progress."""
    ended: list[tuple[str, str, int, bool]]
    """``(id, channel, final seq, aborted)`` of each message that ended, latest kept."""
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The merged metadata of messages in progress, by id."""
    logs: dict[str, tuple[bool, list[Any]] | None] = field(default_factory=dict)
    """The structured messages in progress, by id: whether their text so far became their
    implicit text part, and each chunk (a mapping) and top-level delta (a string) they
    applied since, in order; None if that log was cut (it can't rebuild their parts)."""


@dataclass(slots=True, eq=False)
class ProducerSession(Generic[C]):
    """One producer's session: its streams and what the relay keeps beside them."""

    owner: str
    """Its name among all sessions on the broker: ``INSTANCE.N``."""
    token: str
    """The unguessable token that resumes it."""
    streams: MessageStreams
    grant: Grant
    bucket: TokenBucket
    connection: C | None
    unpublished: dict[str, None] = field(default_factory=dict)
    """Completed here but not yet published (the broker was down): a repeated final retries."""
    cancels: deque[Payload] = field(default_factory=lambda: deque(maxlen=MAX_PARKED_CANCELS))
    """Cancels that arrived while the session was parked."""
    parked_until: float | None = None
    """While parked: when its grace runs out."""
    address: str = ""
    """The client address it was last connected from, for the per-address parking limit."""
    parked_chars: int = 0
    """While parked: the characters of text its unfinished messages hold."""
    cancelled: dict[tuple[str, str], None] = field(default_factory=dict)
    """``(channel, id)`` of messages in progress already cancelled: a cancel goes once."""
    named: bool = False
    """A named HTTP producer's: never ended to make room for parked sessions."""
    joined: list[C] = field(default_factory=list)
    """A named producer's other requests attached at once, besides ``connection``."""

    def serves(self, connection: C) -> bool:
        """Whether ``connection`` is attached to this session (its events apply)."""
        return connection is self.connection or connection in self.joined

    def connections(self) -> list[C]:
        """Every connection attached to this session."""
        first = [] if self.connection is None else [self.connection]
        return first + self.joined

    def end(self) -> list[Unfinished]:
        """Abort every unfinished message and free the streams' state."""
        return self.streams.close()


class SessionTable(Generic[C]):
    """Every producer session of one relay process."""

    def __init__(
        self,
        instance: str,
        *,
        grace: float,
        max_parked: int,
        max_streaming: int,
        max_completed: int,
        max_chars: int,
        rate: float,
        max_parked_chars: int = 1 << 30,
        max_parked_per_address: int = 1 << 30,
        max_meta_bytes: int = 4096,
        max_named_per_address: int = 1 << 30,
    ) -> None:
        self.instance = instance
        self.max_named_per_address = max_named_per_address
        self._named_at: dict[str, int] = {}
        """Named sessions (in use or parked) per address that opened them."""
        self.named_count = 0
        self._parked_named = 0
        self.max_parked_chars = max_parked_chars
        self.max_parked_per_address = max_parked_per_address
        self.parked_chars = 0
        """Characters of text held by every parked session together."""
        self._parked_at: dict[str, int] = {}
        self.grace = grace
        self.max_parked = max_parked
        self._limits = (max_streaming, max_completed, max_chars, max_meta_bytes)
        self.rate = rate
        self.by_owner: dict[str, ProducerSession[C]] = {}
        self.by_token: dict[str, ProducerSession[C]] = {}
        self.parked: dict[str, ProducerSession[C]] = {}
        """Parked sessions by token, oldest first."""
        self._numbers = itertools.count(1)

    def attach(
        self,
        connection: C,
        grant: Grant,
        resume: str | None,
        now: float,
        *,
        named: bool = False,
        address: str = "",
    ) -> tuple[ProducerSession[C], bool, C | None]:
        """The session for a new connection: ``(session, resumed, displaced connection)``.

        A token of a live session for the same grant resumes it (parked or not); the
        connection it was attached to, if still open, is displaced and must be closed,
        unless ``named``: a named producer's request joins the requests in use.
        Anything else opens a new session: under ``resume`` itself if ``named`` (a named
        HTTP producer, whose token its name gives), else under a fresh token.

        Raises :class:`FrameRejected` (nothing changed) for a named request past
        :data:`MAX_REQUESTS_PER_NAME` (``producer_busy``), or one that would open a named
        session past the limits (``too_many_producers``).
        """
        session = self.by_token.get(resume) if resume else None
        if session is not None and session.grant == grant:
            if named and session.named and session.connection is not None:
                if len(session.joined) + 1 >= MAX_REQUESTS_PER_NAME:
                    raise FrameRejected(
                        ErrorCode.PRODUCER_BUSY,
                        f"this producer has {MAX_REQUESTS_PER_NAME} requests in progress; "
                        "nothing of this one was applied: send it again once one ends",
                    )
                session.joined.append(connection)
                return session, True, None
            self._unpark(session)
            session.parked_until = None
            displaced, session.connection = session.connection, connection
            return session, True, displaced
        token = resume if named and resume and resume not in self.by_token else None
        if token is not None:
            self._admit_named(address)
        session = self._add(
            connection,
            grant,
            token or secrets.token_urlsafe(24),
            self.new_owner(),
            self._streams(),
            now,
        )
        if token is not None:
            self._count_named(session, address)
        return session, False, None

    def _admit_named(self, address: str) -> None:
        """Refuse a new named session past the per-address or the overall limit."""
        if self._named_at.get(address, 0) >= self.max_named_per_address:
            raise FrameRejected(
                ErrorCode.TOO_MANY_PRODUCERS,
                f"this address has {self.max_named_per_address} named producers "
                "(--max-named-producers-per-ip); nothing of this request was applied: "
                "reuse a name, or send it again once one has ended",
            )
        if self.named_count >= self.max_parked:
            raise FrameRejected(
                ErrorCode.TOO_MANY_PRODUCERS,
                f"the relay has {self.max_parked} named producers (--max-parked-sessions); "
                "nothing of this request was applied: send it again later",
            )

    def _count_named(self, session: ProducerSession[C], address: str) -> None:
        session.named = True
        session.address = address
        self._named_at[address] = self._named_at.get(address, 0) + 1
        self.named_count += 1

    def new_owner(self) -> str:
        """A fresh owner name on this process."""
        return f"{self.instance}.{next(self._numbers)}"

    def adopt(
        self,
        connection: C,
        grant: Grant,
        token: str,
        owner: str,
        state: SessionState,
        now: float,
        *,
        named: bool = False,
        address: str = "",
    ) -> ProducerSession[C]:
        """A session taken over from another process, its messages restored from ``state``.

        A named one is counted against the limits of named sessions, never refused: it
        has already left the other process. A structured message gets its parts back by
        replaying its log (its implicit text part first, if it had one): exactly the parts
        it had there. One whose log was cut (or doesn't replay) is restored as aborted: the
        caller publishes its abort.
        """
        streams = self._streams()
        for message_id, channel, final_seq, aborted in reversed(state.ended):
            streams.restore_ended(message_id, channel, final_seq, aborted=aborted)
        for message_id, channel, seq, text in state.streaming:
            meta = state.meta.get(message_id)
            if message_id not in state.logs:
                streams.restore(message_id, channel, seq, text, now, meta)
                continue
            parts = _replayed(streams, text, state.logs[message_id])
            if parts is None:
                streams.restore_ended(message_id, channel, seq, aborted=True)
                continue
            streams.restore(message_id, channel, seq, text, now, meta, parts)
        session = self._add(connection, grant, token, owner, streams, now)
        if named:
            self._count_named(session, address)
        return session

    def _streams(self) -> MessageStreams:
        max_streaming, max_completed, max_chars, max_meta = self._limits
        return MessageStreams(
            None,
            max_streaming=max_streaming,
            max_completed=max_completed,
            max_chars=max_chars,
            max_meta_bytes=max_meta,
        )

    def _add(
        self,
        connection: C,
        grant: Grant,
        token: str,
        owner: str,
        streams: MessageStreams,
        now: float,
    ) -> ProducerSession[C]:
        session = ProducerSession(
            owner=owner,
            token=token,
            streams=streams,
            grant=grant,
            bucket=TokenBucket(self.rate, self.rate, now),
            connection=connection,
        )
        self.by_owner[owner] = session
        self.by_token[token] = session
        return session

    def forget(self, owner: str) -> ProducerSession[C] | None:
        """Drop a session another process took over, without ending it: nothing aborts."""
        session = self.by_owner.pop(owner, None)
        if session is not None:
            self.by_token.pop(session.token, None)
            self._unpark(session)
            session.parked_until = None
            self._uncount_named(session)
        return session

    def detach(
        self,
        session: ProducerSession[C],
        connection: C,
        *,
        vanished: bool,
        now: float,
        grace: float | None = None,
    ) -> list[ProducerSession[C]]:
        """A connection ended: park its session (for ``grace``, by default the table's) or
        end it. Returns the sessions that ended.

        Nothing happens if another connection has resumed the session meanwhile, or (a
        named producer) while another of its requests is still attached.
        """
        if connection in session.joined:
            session.joined.remove(connection)
            return []
        if session.connection != connection:
            return []
        if session.joined:
            session.connection = session.joined.pop(0)
            return []
        session.connection = None
        grace = self.grace if grace is None else grace
        if not vanished or grace <= 0:
            return self._end(session)
        session.parked_until = now + grace
        self.parked[session.token] = session
        if session.named:
            self._parked_named += 1
            return []  # never ended to make room (see the theory of operation)
        session.parked_chars = session.streams.held_chars()
        self.parked_chars += session.parked_chars
        self._parked_at[session.address] = self._parked_at.get(session.address, 0) + 1
        ended: list[ProducerSession[C]] = []
        # Past any bound, the oldest parked sessions end first (their messages abort).
        while self._parked_at.get(session.address, 0) > self.max_parked_per_address:
            oldest = next(
                s for s in self.parked.values() if s.address == session.address and not s.named
            )
            ended.extend(self._end(oldest))
        while len(self.parked) - self._parked_named > self.max_parked or (
            self.parked_chars > self.max_parked_chars
        ):
            oldest = next(s for s in self.parked.values() if not s.named)
            ended.extend(self._end(oldest))
        return ended

    def _unpark(self, session: ProducerSession[C]) -> None:
        if self.parked.pop(session.token, None) is None:
            return
        if session.named:
            self._parked_named -= 1
            return
        self.parked_chars -= session.parked_chars
        session.parked_chars = 0
        left = self._parked_at.get(session.address, 1) - 1
        if left > 0:
            self._parked_at[session.address] = left
        else:
            self._parked_at.pop(session.address, None)

    def expire(self, now: float) -> list[ProducerSession[C]]:
        """End the parked sessions whose grace has run out by ``now``."""
        due = [
            session
            for session in self.parked.values()
            if session.parked_until is not None and session.parked_until <= now
        ]
        ended: list[ProducerSession[C]] = []
        for session in due:
            ended.extend(self._end(session))
        return ended

    def end_all(self) -> list[ProducerSession[C]]:
        """End every session (shutdown)."""
        ended: list[ProducerSession[C]] = []
        for session in list(self.by_owner.values()):
            session.connection = None
            session.joined.clear()
            ended.extend(self._end(session))
        return ended

    def next_expiry(self) -> float | None:
        """When the oldest parked session's grace runs out, if any is parked."""
        for session in self.parked.values():
            return session.parked_until
        return None

    def _end(self, session: ProducerSession[C]) -> list[ProducerSession[C]]:
        if session.connection is not None or self.by_token.get(session.token) is not session:
            return []
        self._unpark(session)
        del self.by_token[session.token]
        self.by_owner.pop(session.owner, None)
        session.parked_until = None
        self._uncount_named(session)
        return [session]

    def _uncount_named(self, session: ProducerSession[C]) -> None:
        if not session.named:
            return
        session.named = False
        self.named_count -= 1
        left = self._named_at.get(session.address, 1) - 1
        if left > 0:
            self._named_at[session.address] = left
        else:
            self._named_at.pop(session.address, None)

    def text_chars(self) -> int:
        """Characters of text every session holds, parked ones included."""
        return sum(session.streams.text_chars for session in self.by_owner.values())

    def __len__(self) -> int:
        return len(self.by_owner)


def _replayed(
    streams: MessageStreams, text: str, log: tuple[bool, list[Any]] | None
) -> MessageParts | None:
    if log is None:
        return None
    return replay(MessageParts(streams.part_limits), text, log)


def replay(parts: MessageParts, text: str, log: tuple[bool, list[Any]]) -> MessageParts | None:
    """A structured message's ``parts`` (new) rebuilt from its log kept by a shared broker:
    its implicit text part (``text``, if it had one), then each chunk and top-level delta
    it applied; None if one is refused (the log isn't what was applied)."""
    implicit, entries = log
    try:
        if implicit:
            parts.delta(text)
        for entry in entries:
            if isinstance(entry, str):
                parts.delta(entry)
            else:
                parts.apply(entry)
    except PartRejected:
        return None
    return parts
