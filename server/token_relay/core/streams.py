"""The message streams of one producer session: each message's lifecycle and channel.

Theory of operation
-------------------
:class:`MessageStreams` takes validated events and says what they did. It adds
the relay's rules on top of the seed assembler (:mod:`token_relay.core.assembler`).

Lifecycle. Each message id is in one :class:`Phase`, kept as data in
:data:`TRANSITIONS`::

    (unknown) --event, not final--> STREAMING --final--> COMPLETED
    (unknown) --event, final------> COMPLETED
    STREAMING --close / expire / too large / the producer's abort--> ABORTED
    STREAMING, COMPLETED --another producer holds the id--> REFUSED
    COMPLETED --repeated final--> COMPLETED (acked again, never re-broadcast)
    COMPLETED, ABORTED, REFUSED --evicted from the LRU--> (unknown)

* Channel: an event's ``channel`` overrides the session's default; an event
  with neither is rejected (``channel_required``). A message's channel is fixed
  by its first event; a later event whose channel differs is rejected
  (``channel_mismatch``) and changes nothing.
* Sequence numbers: an event may carry ``seq``. A message's first event has
  seq 1 and each next one the next integer. An event at or below the last
  applied seq is a duplicate and changes nothing (a duplicate final is acked
  again); one past the next is rejected (``seq_gap``, with the seq expected),
  so the producer can send again from there. Without seq, the seed rules hold.
* Ending: a message ends by completing (``final``) or by being aborted: its
  producer went away (:meth:`MessageStreams.close`), it had no event for too
  long (:meth:`MessageStreams.expire`), a delta took it past the size limit, or its
  producer said so (:meth:`MessageStreams.abort`: the AI SDK producer route's ``abort``
  and ``error`` chunks, and a Stop it obeys; :meth:`MessageStreams.cancel`: a producer
  event's ``abort``).
  An aborted id is remembered; events for it are rejected (``message_aborted``),
  so a late delta can't start a bogus new message.
* Refusal: an id another producer holds on the channel is refused by the broker
  (:mod:`token_relay.core.inflight` has the rule); the edge then calls
  :meth:`MessageStreams.refuse`. Nothing of the message was published, and every
  later event for the id is refused too (``id_in_use``), its final included, so a
  refused message never completes once the holder is done.
* Parts: an event with a ``chunk`` (an AI SDK ``UIMessageChunk``) makes its message
  *structured*: it gets a :class:`~token_relay.core.parts.MessageParts` (made by the
  ``part_limits``), and the text
  it had from top-level deltas (if it had any delta, an empty one included) becomes its
  implicit text part; the chunk applies to it, and so does every later top-level delta
  (``parts.delta``). A final finalizes the parts; the message's text is then its text
  parts' texts joined, and :class:`Applied` and :class:`Unfinished` carry its parts.
  Live, a structured message is its chunks, not text deltas (:attr:`Applied.delta` stays
  None, and so does :meth:`MessageStreams.partial`): :attr:`Applied.chunks` is what an
  event amounts to for deltas subscribers, who held its text so far as its implicit text
  part (chunk id ``"text"``), opened by its first delta frame. So a producer's chunk goes
  as given; a top-level delta as a ``text-delta`` of that part, after its ``text-start``
  if the delta opens it; and the event that makes a message structured first sends what
  those subscribers lack of the part: its start, if only empty deltas made it, and a
  high surrogate held for its pair. A final event has none: the completed message
  follows. :meth:`MessageStreams.live_parts` is a joiner's compacted catch-up. An event with
  both ``delta`` and ``chunk`` is refused (``invalid_event``); a chunk the parts refuse
  gets the :class:`~token_relay.core.errors.PartRejected`'s own code (``invalid_chunk``,
  ``unknown_part``, ``part_ended``, ``part_exists``, ``too_many_parts``,
  ``part_too_large``). Either way nothing changes, its ``seq`` included. A plain
  message never builds a ``MessageParts``.
* Limits: at most ``max_streaming`` unfinished messages; a non-final event that
  would open one more is rejected (``too_many_messages``) and changes nothing.
  At most ``max_completed`` completed ids, and as many aborted and refused ids, are
  remembered, least recently used first out. A forgotten id is unknown again:
  an event for it starts a new message. At most ``max_chars`` characters per
  message, counted as :meth:`~token_relay.core.parts.MessageParts.chars` for a
  structured one (a delta that would pass it aborts the message before it applies; a
  chunk of another kind, once it applied; a new message's first event is refused).
  At most ``max_meta_bytes`` bytes of JSON of ``meta``: an event's own, and its message's
  merged meta once the event's merges in (see :meth:`MessageStreams.merged_meta_bytes`).
  An event past either is refused (``invalid_event``) and changes nothing: not its
  delta, chunk, ``seq``, final or abort, nor the message's meta.

Refusals follow the rule of :mod:`token_relay.core.errors`: one that changes
nothing is raised (:class:`~token_relay.core.errors.FrameRejected`); a delta
that aborts its message for its size changed state, so it is returned, as an
:class:`Overflow`.

Pure: the caller passes the time, and the edge turns the answers into frames.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

import msgspec
from pydantic import MISSING

from .assembler import TokenAssembler
from .codec import Event
from .errors import ConfigError, ErrorCode, FrameRejected, PartRejected, id_in_use
from .parts import IMPLICIT, MessageParts, PartLimits
from .surrogates import REPLACEMENT, has_surrogate, mend

PARTS = PartLimits()
"""The bounds of a structured message's parts, unless a session names others."""

__all__ = [
    "TRANSITIONS",
    "Applied",
    "MessageStreams",
    "Overflow",
    "Phase",
    "Unfinished",
]


class Phase(Enum):
    """Where a message is in its lifecycle; an id in none of them is unknown."""

    STREAMING = "streaming"
    COMPLETED = "completed"
    ABORTED = "aborted"
    REFUSED = "refused"


TRANSITIONS: dict[tuple[Phase | None, str], Phase | None] = {
    (None, "event"): Phase.STREAMING,
    (None, "final"): Phase.COMPLETED,
    (Phase.STREAMING, "event"): Phase.STREAMING,
    (Phase.STREAMING, "final"): Phase.COMPLETED,
    (Phase.STREAMING, "abort"): Phase.ABORTED,
    (Phase.STREAMING, "refuse"): Phase.REFUSED,
    (Phase.COMPLETED, "refuse"): Phase.REFUSED,
    (Phase.COMPLETED, "event"): Phase.COMPLETED,
    (Phase.COMPLETED, "final"): Phase.COMPLETED,
    (Phase.COMPLETED, "evict"): None,
    (Phase.ABORTED, "evict"): None,
    (Phase.REFUSED, "evict"): None,
}
"""The lifecycle as data: ``(phase, what happened) -> next phase``. A pair that is
missing is refused: an event for an ABORTED id is ``message_aborted``, one for a
REFUSED id ``id_in_use``."""


class Applied(msgspec.Struct, frozen=True, gc=False):
    """What one accepted event did.

    A msgspec struct: one is built per event, and it builds in a fifth of a named
    tuple's time (a frozen dataclass costs more still).
    """

    channel: str
    message_id: str
    text: str | None
    """The completed text if the event was final (repeated finals included), else None."""
    first_completion: bool = False
    """True only for the event that finalized the message: broadcast it then, once."""
    delta: str | None = None
    """The delta appended to an unfinished message by this event, if any."""
    opened: bool = False
    """True if this event created the message."""
    delta_wait: float | None = None
    """For a non-empty delta: seconds since the message's previous one, or since it opened."""
    first_delta: bool = False
    """True if ``delta_wait`` counts from the message's opening (its first non-empty delta)."""
    duplicate: bool = False
    """True if the event's ``seq`` was already applied: nothing was done (a final is re-acked)."""
    meta: dict[str, Any] | None = None
    """On completion: the message's metadata, merged from its events' ``meta``."""
    parts: list[dict[str, Any]] | None = None
    """On completion of a structured message: its parts (repeated finals included)."""
    chunks: tuple[dict[str, Any], ...] | None = None
    """For a structured message in progress: the chunks this event amounts to, for its
    deltas subscribers (see the module's doc); None if it changed nothing they see."""


@dataclass(frozen=True, slots=True)
class Unfinished:
    """A message that ended without a final, and the text (and parts) it had."""

    channel: str
    message_id: str
    text: str
    meta: dict[str, Any] | None = None
    parts: list[dict[str, Any]] | None = None
    """A structured message's parts, as they were: an abort completes none of them."""


class Overflow(NamedTuple):
    """A delta took its message past ``max_chars``: the message was aborted.

    A value, not an exception, because state changed: the edge answers ``rejection``
    to the producer and publishes the abort of ``unfinished``.
    """

    unfinished: Unfinished
    rejection: FrameRejected


def _too_large(limit: int, message_id: str, aborted: bool) -> FrameRejected:
    return FrameRejected(
        ErrorCode.MESSAGE_TOO_LARGE,
        f"a message may have at most {limit} characters; "
        + ("it was aborted" if aborted else "nothing was applied"),
        message_id,
    )


class _Open:
    __slots__ = (
        "channel",
        "chars",
        "held",
        "last_delta",
        "last_event",
        "meta",
        "meta_bytes",
        "opened",
        "parts",
        "seq",
    )

    def __init__(self, channel: str, now: float, seq: int) -> None:
        self.channel = channel
        self.seq = seq
        self.opened = now
        self.last_event = now
        self.last_delta: float | None = None
        self.chars = 0
        self.meta: dict[str, Any] | None = None
        self.meta_bytes = 0
        """Bytes of JSON of ``meta``, as :func:`_json_bytes` counts them (0 while None)."""
        self.held = ""
        """A high surrogate waiting for its low half (see :func:`mend`)."""
        self.parts: MessageParts | None = None
        """A structured message's parts (its text is then theirs, not the assembler's)."""


class MessageStreams:
    """The messages of one producer session, each in its :class:`Phase`."""

    __slots__ = (
        "_aborted",
        "_completed",
        "_completed_parts",
        "_final_seq",
        "_refused",
        "_streaming",
        "assembler",
        "completed_chars",
        "default_channel",
        "max_chars",
        "max_completed",
        "max_meta_bytes",
        "max_streaming",
        "part_limits",
    )

    def __init__(
        self,
        default_channel: str | None = None,
        *,
        max_streaming: int = 1000,
        max_completed: int = 1000,
        max_chars: int = 1 << 20,
        max_meta_bytes: int = 4096,
        part_limits: PartLimits | None = None,
    ) -> None:
        if max_streaming < 1 or max_completed < 1 or max_chars < 1:
            raise ConfigError("max_streaming, max_completed and max_chars must be at least 1")
        self.max_chars = max_chars
        self.max_meta_bytes = max_meta_bytes
        self.default_channel = default_channel
        self.max_streaming = max_streaming
        self.max_completed = max_completed
        self.part_limits = part_limits or PARTS
        """The bounds of a structured message's parts."""
        self.assembler = TokenAssembler()
        self._streaming: dict[str, _Open] = {}
        self._completed: dict[str, str] = {}
        self._completed_parts: dict[str, MessageParts] = {}
        """The parts of the completed structured messages in ``_completed``."""
        self._final_seq: dict[str, int] = {}
        self._aborted: dict[str, str] = {}
        self._refused: dict[str, str] = {}
        self.completed_chars = 0
        """Characters of the completed texts kept for idempotent finals."""

    def receive(self, event: Event, now: float = 0.0) -> Applied | Overflow:
        """Apply one event; raise :class:`FrameRejected` leaving all state unchanged."""
        message_id = event.id
        channel = self.default_channel if event.channel is MISSING else event.channel
        if channel is None:
            raise FrameRejected(
                ErrorCode.CHANNEL_REQUIRED,
                "'channel' is required: name it in the event or in the URL (?channel=)",
                message_id,
            )
        seq = None if event.seq is MISSING else event.seq
        meta: dict[str, Any] | None = None
        meta_bytes = 0
        if event.meta is not MISSING:
            meta = event.meta
            meta_bytes = self._checked(meta, message_id)
        state = self._streaming.get(message_id)
        if state is not None:
            if channel != state.channel:
                _check_channel(message_id, state.channel, channel)
            if seq is not None:
                if seq <= state.seq:
                    return Applied(channel, message_id, None, duplicate=True)
                if seq != state.seq + 1:
                    raise _seq_gap(message_id, state.seq + 1, seq)
            if meta:
                meta_bytes = self._merged(state, meta, meta_bytes, message_id)
            structured = state.parts
            if structured is not None or event.chunk is not MISSING:
                if (
                    structured is not None
                    and event.chunk is not MISSING
                    and event.delta is MISSING
                    and not event.final
                    and not meta
                ):
                    # Most of a structured reply: a plain delta for an open part, which
                    # changes nothing here but the message's size and clock.
                    chars = structured.extend(event.chunk, self.max_chars)
                    if chars >= 0:
                        if seq is not None:
                            state.seq = seq
                        state.last_event = now
                        state.chars = chars
                        return Applied(channel, message_id, None, chunks=(event.chunk,))
                return self._structured(event, channel, seq, meta, meta_bytes, now, state)
            if seq is not None:
                state.seq = seq
            state.last_event = now
            if meta:
                state.meta = {**state.meta, **meta} if state.meta else meta
                state.meta_bytes = meta_bytes
            # The hot path of a relay: a plain message's delta. ``wait`` is the time since
            # its previous non-empty delta, or since it opened (``first``).
            given = event.delta
            delta: str | None = None
            if given is MISSING:
                if event.final and state.held:
                    delta, state.held = REPLACEMENT, ""
            elif state.held or not given.isascii():
                delta, state.held = mend(state.held, given, event.final)
            else:
                delta = given
            wait: float | None = None
            first = False
            if delta:
                chars = state.chars = state.chars + len(delta)
                if chars > self.max_chars:
                    rejection = _too_large(self.max_chars, message_id, aborted=True)
                    return Overflow(self._abort(message_id), rejection)
                previous = state.last_delta
                if previous is None:
                    wait, first = now - state.opened, True
                else:
                    wait = now - previous
                state.last_delta = now
            text = self.assembler.feed(message_id, delta, event.final)
            if text is None:
                return Applied(channel, message_id, None, False, delta, False, wait, first)
            del self._streaming[message_id]
            self.completed_chars += len(text)
            self._remember(self._completed, message_id, channel)
            if state.seq:
                self._final_seq[message_id] = state.seq
            return Applied(
                channel, message_id, text, True, delta, False, wait, first, meta=state.meta
            )

        completed_in = self._completed.get(message_id)
        if completed_in is not None:
            _check_channel(message_id, completed_in, channel)
            duplicate = seq is not None and seq <= self._final_seq.get(message_id, 0)
            if not event.final:
                return Applied(channel, message_id, None, duplicate=duplicate)
            # A repeated final refreshes the id's place in the LRU.
            del self._completed[message_id]
            self._completed[message_id] = channel
            done = self._completed_parts.get(message_id) if self._completed_parts else None
            if done is not None:
                parts = done.parts()
                return Applied(channel, message_id, done.text(), duplicate=duplicate, parts=parts)
            text = self.assembler.get(message_id)
            return Applied(channel, message_id, text, duplicate=duplicate)

        refused_in = self._refused.get(message_id)
        if refused_in is not None:
            raise id_in_use(refused_in, message_id)

        aborted_in = self._aborted.get(message_id)
        if aborted_in is not None:
            raise FrameRejected(
                ErrorCode.MESSAGE_ABORTED,
                f"message '{message_id}' was aborted; send new text under a new id",
                message_id,
            )

        # A one-shot event (new id, final) never stays open, so it passes at the limit.
        if not event.final and len(self._streaming) >= self.max_streaming:
            raise FrameRejected(
                ErrorCode.TOO_MANY_MESSAGES,
                f"a producer connection may have at most {self.max_streaming} "
                "unfinished messages; finish one first",
                message_id,
            )
        if seq is not None and seq != 1:
            raise _seq_gap(message_id, 1, seq)
        if event.chunk is not MISSING:
            return self._structured(event, channel, seq, meta, meta_bytes, now, None)
        delta = None if event.delta is MISSING else event.delta
        held = ""
        if delta is not None and not delta.isascii():
            delta, held = mend("", delta, event.final)
        if delta is not None and len(delta) > self.max_chars:
            raise _too_large(self.max_chars, message_id, aborted=False)
        text = self.assembler.feed(message_id, delta, event.final)
        wait = 0.0 if delta else None
        if text is None:
            state = self._streaming[message_id] = _Open(channel, now, seq or 0)
            state.held = held
            if meta:
                state.meta, state.meta_bytes = meta, meta_bytes
            if delta:
                state.chars = len(delta)
                state.last_delta = now
            return Applied(channel, message_id, None, False, delta, True, wait, bool(delta))
        self.completed_chars += len(text)
        self._remember(self._completed, message_id, channel)
        if seq:
            self._final_seq[message_id] = seq
        return Applied(channel, message_id, text, True, delta, True, wait, bool(delta), meta=meta)

    def plain_delta(
        self, message_id: str, delta: str, now: float = 0.0
    ) -> tuple[str, float | None, bool] | None:
        """The hot path of :meth:`receive`: an event of only ``id`` and ``delta`` (no
        ``channel``, ``seq``, ``meta``, ``chunk``, ``abort``, or ``final``), for a plain
        message in progress on the default channel, applied as :meth:`receive` applies it.

        Returns ``(channel, delta_wait, first_delta)`` of the :class:`Applied` that
        :meth:`receive` would return (its ``delta`` is the one given, its other fields
        their defaults); None, changing nothing, when the event needs :meth:`receive`: an
        unknown, ended or structured message, another channel, a surrogate half to mend
        (see :func:`~token_relay.core.surrogates.mend`), or a size past ``max_chars``.
        """
        state = self._streaming.get(message_id)
        if (
            state is None
            or state.parts is not None
            or state.held
            or state.channel != self.default_channel
            or (not delta.isascii() and has_surrogate(delta))
        ):
            return None
        if not delta:
            state.last_event = now
            if not self.assembler.append(message_id, delta):
                self.assembler.feed(message_id, delta, False)
            return state.channel, None, False
        chars = state.chars + len(delta)
        if chars > self.max_chars:
            return None
        state.chars, state.last_event = chars, now
        previous, state.last_delta = state.last_delta, now
        if not self.assembler.append(message_id, delta):
            self.assembler.feed(message_id, delta, False)
        if previous is None:
            return state.channel, now - state.opened, True
        return state.channel, now - previous, False

    def plain_open(self, message_id: str, delta: str, now: float = 0.0) -> str | None:
        """The hot path of :meth:`receive` for an event of only ``id`` and ``delta`` (as
        :meth:`plain_delta` takes) that opens a new plain message on the default channel:
        the state after it is the one :meth:`receive` leaves, and the :class:`Applied` it
        returns has ``opened``, this ``delta``, ``first_delta`` if the delta is not empty
        and then ``delta_wait`` 0.0, and its other fields their defaults.

        Returns the message's channel; None, changing nothing, when the event needs
        :meth:`receive`: a known id (in progress, completed, aborted or refused), no
        default channel, the most unfinished messages already, a surrogate half to mend,
        or a delta past ``max_chars``."""
        channel = self.default_channel
        if (
            channel is None
            or message_id in self._streaming
            or message_id in self._completed
            or message_id in self._refused
            or message_id in self._aborted
            or len(self._streaming) >= self.max_streaming
            or len(delta) > self.max_chars
            or (not delta.isascii() and has_surrogate(delta))
        ):
            return None
        self.assembler.feed(message_id, delta, False)
        state = self._streaming[message_id] = _Open(channel, now, 0)
        if delta:
            state.chars = len(delta)
            state.last_delta = now
        return channel

    def plain_deltas(
        self, message_id: str, deltas: Sequence[str], now: float = 0.0
    ) -> tuple[str, float | None, bool, int] | None:
        """:meth:`plain_delta` for a run of a message's deltas, all at one ``now`` (as one
        batch's events are): the same state as applying each in turn, or None, changing
        nothing, if any of them needs :meth:`receive` (a surrogate half, or the run would
        pass ``max_chars``; the caller then applies them one at a time).

        Returns ``(channel, delta_wait, first_delta, count)``: ``count`` of the deltas are
        not empty; the first of them has the wait and flag :meth:`plain_delta` would give
        it, and every later one waited 0.0 (the same ``now``) and is not a first.
        ``delta_wait`` is None if every delta is empty.
        """
        state = self._plain(message_id)
        if state is None:
            return None
        # One string of the run: a surrogate half in it is one in a delta of it (a lone
        # half stays lone when strings are joined), and its length theirs together.
        joined = "".join(deltas)
        if not joined.isascii() and has_surrogate(joined):
            return None
        chars = state.chars + len(joined)
        if chars > self.max_chars:
            return None
        count = len(deltas) - deltas.count("")
        state.last_event = now
        assembler = self.assembler
        if not assembler.extend(message_id, deltas):
            for delta in deltas:
                assembler.feed(message_id, delta, False)
        if not count:
            return state.channel, None, False, 0
        previous = state.last_delta
        state.chars, state.last_delta = chars, now
        if previous is None:
            return state.channel, now - state.opened, True, count
        return state.channel, now - previous, False, count

    def plain_final(self, message_id: str) -> Applied | None:
        """The hot path of :meth:`receive` for an event of only ``id`` and ``final`` (no
        ``delta``, ``channel``, ``seq``, ``meta``, ``chunk`` nor ``abort``) that completes a
        plain message in progress on the default channel: the :class:`Applied` that
        :meth:`receive` returns, with the same state after it. None, changing nothing, when
        the event needs :meth:`receive` (an unknown, ended or structured message, another
        channel, a surrogate half held back)."""
        state = self._plain(message_id)
        if state is None:
            return None
        text = self.assembler.feed(message_id, None, True)
        assert text is not None
        del self._streaming[message_id]
        self.completed_chars += len(text)
        self._remember(self._completed, message_id, state.channel)
        if state.seq:
            self._final_seq[message_id] = state.seq
        return Applied(state.channel, message_id, text, True, meta=state.meta)

    def room(self, message_id: str) -> int | None:
        """How many characters more the deltas of ``message_id`` may bring through
        :meth:`plain_deltas`: a plain message in progress on the default channel, with no
        surrogate half held back (see :meth:`_plain`). None if its deltas need
        :meth:`receive`."""
        state = self._plain(message_id)
        return None if state is None else self.max_chars - state.chars

    def _plain(self, message_id: str) -> _Open | None:
        """A plain message in progress on the default channel, with no surrogate half held
        back: what the short ways take (see :meth:`plain_deltas`, :meth:`plain_final`;
        :meth:`plain_delta`, taken once per delta, checks the same inline, a call less)."""
        state = self._streaming.get(message_id)
        if (
            state is None
            or state.parts is not None
            or state.held
            or state.channel != self.default_channel
        ):
            return None
        return state

    def phase(self, message_id: str) -> Phase | None:
        """Where a message is in its lifecycle; None if the id is unknown (or forgotten)."""
        if message_id in self._streaming:
            return Phase.STREAMING
        if message_id in self._completed:
            return Phase.COMPLETED
        if message_id in self._aborted:
            return Phase.ABORTED
        if message_id in self._refused:
            return Phase.REFUSED
        return None

    def next_seq(self, message_id: str) -> int | None:
        """The seq an unfinished message expects next, if its events are numbered."""
        state = self._streaming.get(message_id)
        if state is None:
            return None if message_id in self._completed else 1
        return state.seq + 1 if state.seq else None

    def partial(self, message_id: str) -> str | None:
        """The text so far of an unfinished plain message, or None (for a structured one
        too: see :meth:`live_parts`)."""
        state = self._streaming.get(message_id)
        if state is None or state.parts is not None:
            return None
        return self.assembler.get(message_id)

    def live_parts(self, message_id: str) -> tuple[str, list[dict[str, Any]]] | None:
        """The text so far and compacted catch-up chunks of an unfinished structured
        message (see :meth:`~token_relay.core.parts.MessageParts.catch_up`), or None."""
        state = self._streaming.get(message_id)
        if state is None or state.parts is None:
            return None
        return state.parts.text(), state.parts.catch_up()

    def streaming(self) -> list[tuple[str, str]]:
        """``(id, channel)`` of every unfinished message, oldest first."""
        return [(message_id, state.channel) for message_id, state in self._streaming.items()]

    @property
    def text_chars(self) -> int:
        """Characters of text held, unfinished and completed (kept for idempotent finals)."""
        return self.held_chars() + self.completed_chars

    def meta_of(self, message_id: str) -> dict[str, Any] | None:
        """The merged metadata of a message in progress, if it has any."""
        state = self._streaming.get(message_id)
        return None if state is None else state.meta

    def merged_meta_bytes(self, message_id: str) -> int | None:
        """Bytes of JSON of the merged metadata of a message in progress (0 if it has
        none), or None if it is not in progress.

        Counted as an event's ``meta`` is: the UTF-8 bytes of
        ``json.dumps(merged, separators=(",", ":"), ensure_ascii=False)``; never more than
        ``max_meta_bytes`` for meta merged here. Kept as a running count, exact, not
        estimated: a compact JSON object's length is 1 plus, for each of its pairs
        ``"key":value``, the pair's length plus 1 (a comma, or the closing brace), whatever
        their order. So merging an event's ``meta`` E into M gives
        ``bytes(M) + bytes(E) - bytes(R)``, R the pairs of M that E replaces (a dict of
        them; ``bytes(R)`` is taken as 1 if there is none). So the whole merged meta is
        never encoded again: a pair is encoded by its event's own check, and at most once
        more, when an event replaces it.
        """
        state = self._streaming.get(message_id)
        return None if state is None else state.meta_bytes

    def held_chars(self) -> int:
        """Characters of text the unfinished messages hold."""
        return sum(state.chars for state in self._streaming.values())

    def restore(
        self,
        message_id: str,
        channel: str,
        seq: int,
        text: str,
        now: float,
        meta: dict[str, Any] | None = None,
        parts: MessageParts | None = None,
    ) -> None:
        """Take up a message in progress where another process left it (a session resumed);
        a structured one with its ``parts``, rebuilt there (its ``text`` is theirs)."""
        if parts is not None:
            state = self._streaming[message_id] = _Open(channel, now, seq)
            state.parts, state.chars = parts, parts.chars()
            if meta:
                state.meta, state.meta_bytes = meta, _json_bytes(meta)
            return
        self.assembler.feed(message_id, text, False)
        state = self._streaming[message_id] = _Open(channel, now, seq)
        state.chars = len(text)
        if meta:
            state.meta, state.meta_bytes = meta, _json_bytes(meta)
        if text:
            state.last_delta = now

    def restore_ended(self, message_id: str, channel: str, seq: int, *, aborted: bool) -> None:
        """Remember a message that ended on another process: repeats are acked or refused.

        A completed one's text is not kept here: a repeated final is acked, not published.
        """
        if aborted:
            self._remember(self._aborted, message_id, channel)
            return
        self.assembler.feed(message_id, None, True)
        self._remember(self._completed, message_id, channel)
        if seq:
            self._final_seq[message_id] = seq

    def refuse(self, message_id: str) -> None:
        """Another producer holds the id on the message's channel: drop the message and
        refuse every later event for it (``id_in_use``).

        Not an abort: nothing was published of it. A completed message is refused too
        (its final's publication was refused); an id in no phase, or refused already,
        is left as it is.
        """
        state = self._streaming.pop(message_id, None)
        if state is not None:
            self.assembler.discard(message_id)
            self._remember(self._refused, message_id, state.channel)
            return
        channel = self._completed.pop(message_id, None)
        if channel is not None:
            self._final_seq.pop(message_id, None)
            self._forget_completed(message_id)
            self._remember(self._refused, message_id, channel)

    def completed(self, message_id: str) -> tuple[str, list[dict[str, Any]] | None] | None:
        """The text, and parts if it is structured, of a completed message still
        remembered; None if there is none."""
        if message_id not in self._completed:
            return None
        done = self._completed_parts.get(message_id)
        if done is not None:
            return done.text(), done.parts()
        text = self.assembler.get(message_id)
        return None if text is None else (text, None)

    def completed_channel(self, message_id: str) -> str | None:
        """The channel of a completed message still remembered, or None."""
        return self._completed.get(message_id)

    def channel_of(self, message_id: str) -> str | None:
        """The channel of an unfinished message, or None."""
        state = self._streaming.get(message_id)
        return None if state is None else state.channel

    def abort(self, message_id: str) -> Unfinished | None:
        """Abort an unfinished message at its producer's word (a Stop it obeyed, an error it
        reported); None, changing nothing, if the message is not in progress."""
        if message_id not in self._streaming:
            return None
        return self._abort(message_id)

    def cancel(self, event: Event) -> Unfinished | None:
        """Apply a producer's ``abort`` event: abort its message, its ``meta`` merged first;
        None, changing nothing, if the message is not in progress (already ended, or never
        begun: an abort has nothing to start). Raises, changing nothing, if the event also
        carries ``delta``, ``chunk`` or ``final``, or names another channel."""
        message_id = event.id
        if event.delta is not MISSING or event.chunk is not MISSING or event.final:
            raise FrameRejected(
                ErrorCode.INVALID_EVENT,
                "an 'abort' event carries no 'delta', 'chunk' or 'final'",
                message_id,
            )
        state = self._streaming.get(message_id)
        if state is None:
            return None
        if event.channel is not MISSING and event.channel != state.channel:
            _check_channel(message_id, state.channel, event.channel)
        if event.meta is not MISSING:
            meta = event.meta
            size = self._checked(meta, message_id)
            if meta:
                size = self._merged(state, meta, size, message_id)
                state.meta = {**state.meta, **meta} if state.meta else meta
                state.meta_bytes = size
        return self._abort(message_id)

    def expire(self, deadline: float) -> list[Unfinished]:
        """Abort every unfinished message whose last event came before ``deadline``."""
        stale = [mid for mid, state in self._streaming.items() if state.last_event < deadline]
        return [self._abort(message_id) for message_id in stale]

    def close(self) -> list[Unfinished]:
        """Abort every unfinished message and free all state."""
        unfinished = [self._abort(message_id) for message_id in list(self._streaming)]
        self._completed.clear()
        self._final_seq.clear()
        self._aborted.clear()
        self._refused.clear()
        self._completed_parts.clear()
        self.assembler = TokenAssembler()
        self.completed_chars = 0
        return unfinished

    @property
    def streaming_count(self) -> int:
        """Unfinished messages on this connection."""
        return len(self._streaming)

    @property
    def completed_count(self) -> int:
        """Finalized ids this connection still remembers."""
        return len(self._completed)

    def _abort(self, message_id: str) -> Unfinished:
        state = self._streaming.pop(message_id)
        parts = state.parts
        if parts is not None:
            self._remember(self._aborted, message_id, state.channel)
            return Unfinished(state.channel, message_id, parts.text(), state.meta, parts.parts())
        text = (self.assembler.discard(message_id) or "") + (REPLACEMENT if state.held else "")
        self._remember(self._aborted, message_id, state.channel)
        return Unfinished(state.channel, message_id, text, state.meta)

    def _checked(self, meta: dict[str, Any], message_id: str) -> int:
        """The bytes of JSON of an event's ``meta`` (:func:`_json_bytes`), if they fit
        ``max_meta_bytes``; else refused. So is one holding half a surrogate pair (JSON's
        ``\\ud800`` alone), which is no text: nothing could send it on."""
        try:
            size = _json_bytes(meta)
        except UnicodeEncodeError:
            raise FrameRejected(
                ErrorCode.INVALID_EVENT,
                "'meta' holds half a surrogate pair, which is not text",
                message_id,
            ) from None
        except ValueError:  # NaN, Infinity, or a number past a double (1e400): no JSON
            raise FrameRejected(
                ErrorCode.INVALID_EVENT,
                "'meta' holds NaN, Infinity or a number out of range, which are not JSON",
                message_id,
            ) from None
        if size > self.max_meta_bytes:
            raise FrameRejected(
                ErrorCode.INVALID_EVENT,
                f"'meta' is {size} bytes of JSON, over --max-meta-bytes ({self.max_meta_bytes})",
                message_id,
            )
        return size

    def _merged(self, state: _Open, meta: dict[str, Any], size: int, message_id: str) -> int:
        """The bytes of JSON of ``state``'s merged meta once ``meta`` (not empty, ``size``
        bytes as :meth:`_checked` counted them) merges in, if they fit ``max_meta_bytes``;
        else refused, as an event's own meta is. Counted as
        :meth:`merged_meta_bytes` says; nothing changes here."""
        merged = state.meta
        if not merged:
            return size
        replaced = {key: merged[key] for key in meta if key in merged}
        total = state.meta_bytes + size - (_json_bytes(replaced) if replaced else 1)
        if total > self.max_meta_bytes:
            raise FrameRejected(
                ErrorCode.INVALID_EVENT,
                f"'meta' would make the merged meta of message '{message_id}' {total} bytes "
                f"of JSON, over --max-meta-bytes ({self.max_meta_bytes}); nothing was applied",
                message_id,
            )
        return total

    def _remember(self, memory: dict[str, str], message_id: str, channel: str) -> None:
        """Note an ended id in ``memory`` (completed, aborted or refused), evicting the
        oldest."""
        memory[message_id] = channel
        if len(memory) > self.max_completed:
            oldest = next(iter(memory))
            del memory[oldest]
            self._final_seq.pop(oldest, None)
            # The memories never share an id, so this frees only a completed text.
            if memory is self._completed:
                self._forget_completed(oldest)
            else:
                self.assembler.forget(oldest)

    def _forget_completed(self, message_id: str) -> None:
        """Free a completed message's text (or parts), kept for idempotent finals."""
        done = self._completed_parts.pop(message_id, None) if self._completed_parts else None
        if done is not None:
            self.completed_chars -= done.chars()
            return
        self.completed_chars -= len(self.assembler.get(message_id) or "")
        self.assembler.forget(message_id)

    def _structured(
        self,
        event: Event,
        channel: str,
        seq: int | None,
        meta: dict[str, Any] | None,
        meta_bytes: int,
        now: float,
        state: _Open | None,
    ) -> Applied | Overflow:
        """Apply an event to a structured message, or one its ``chunk`` makes structured
        (``state`` None: a new message). Raises, changing nothing, if the parts refuse it.

        ``meta_bytes``: the bytes of the message's merged meta once ``meta`` merges in,
        checked already (:meth:`_merged`; the event's own for a new message)."""
        message_id = event.id
        if event.chunk is not MISSING and event.delta is not MISSING:
            raise FrameRejected(
                ErrorCode.INVALID_EVENT,
                "an event carries 'delta' or 'chunk', not both; send them as two events",
                message_id,
            )
        parts = None if state is None else state.parts
        live: list[dict[str, Any]] = []
        try:
            if parts is None:
                parts = MessageParts(self.part_limits)
                if state is not None and self.assembler.has_deltas(message_id):
                    # Its text so far (and a high surrogate waiting) is its implicit text part.
                    so_far = self.assembler.get(message_id) or ""
                    parts.delta(so_far + state.held)
                    # Its deltas subscribers hold the text so far as that part, opened by
                    # its first delta frame; what they hold not is sent now.
                    if not so_far:
                        live.append(_IMPLICIT_START)
                    if state.held:
                        live.append(_implicit_delta(state.held))
            growth = 0
            if event.chunk is not MISSING:
                delta = event.chunk.get("delta", event.chunk.get("inputTextDelta"))
                growth = len(delta) if isinstance(delta, str) else 0
            elif event.delta is not MISSING:
                growth = len(event.delta)
            if parts.chars() + growth > self.max_chars:
                if state is None or state.parts is None:
                    raise _too_large(self.max_chars, message_id, aborted=False)
                return self._overflow(message_id, state, seq, now)
            if event.chunk is not MISSING:
                parts.apply(event.chunk)
                live.append(event.chunk)
            elif event.delta is not MISSING:
                if parts.opens_implicit():
                    live.append(_IMPLICIT_START)
                parts.delta(event.delta)
                if event.delta:
                    live.append(_implicit_delta(event.delta))
        except PartRejected as exc:
            raise FrameRejected(ErrorCode(exc.code), exc.message, message_id) from None
        opened = state is None
        if state is None:
            state = _Open(channel, now, seq or 0)
        elif seq is not None:
            state.seq = seq
        if state.parts is None:
            # Structured from now on: the assembler no longer holds its text.
            self.assembler.discard(message_id)
            state.parts, state.held = parts, ""
        state.last_event = now
        if meta:
            state.meta = {**state.meta, **meta} if state.meta else meta
            state.meta_bytes = meta_bytes
        state.chars = parts.chars()
        if state.chars > self.max_chars:
            if opened:
                raise _too_large(self.max_chars, message_id, aborted=False)
            return self._overflow(message_id, state, None, now)
        if not event.final:
            if opened:
                self._streaming[message_id] = state
            return Applied(channel, message_id, None, opened=opened, chunks=tuple(live) or None)
        parts.finalize()
        self._streaming.pop(message_id, None)
        self._completed_parts[message_id] = parts
        self.completed_chars += parts.chars()
        self._remember(self._completed, message_id, channel)
        if state.seq:
            self._final_seq[message_id] = state.seq
        text = parts.text()
        return Applied(
            channel, message_id, text, True, None, opened, meta=state.meta, parts=parts.parts()
        )

    def _overflow(self, message_id: str, state: _Open, seq: int | None, now: float) -> Overflow:
        """A structured message passed ``max_chars``: abort it, as a plain one is."""
        if seq is not None:
            state.seq = seq
        state.last_event = now
        rejection = _too_large(self.max_chars, message_id, aborted=True)
        return Overflow(self._abort(message_id), rejection)


_IMPLICIT_START: dict[str, Any] = {"type": "text-start", "id": IMPLICIT}
"""The chunk that opens the implicit text part, for deltas subscribers (shared: never
changed)."""


def _implicit_delta(delta: str) -> dict[str, Any]:
    """A top-level delta of a structured message, as its deltas subscribers get it."""
    return {"type": "text-delta", "id": IMPLICIT, "delta": delta}


def _json_bytes(meta: dict[str, Any]) -> int:
    """The bytes ``--max-meta-bytes`` counts of a ``meta`` object: its compact JSON, not
    escaping non-ASCII, in UTF-8."""
    return len(
        json.dumps(meta, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    )


def _seq_gap(message_id: str, expected: int, got: int) -> FrameRejected:
    return FrameRejected(
        ErrorCode.SEQ_GAP,
        f"message '{message_id}' expects seq {expected}, not {got}; "
        f"send its events again from seq {expected}",
        message_id,
        expected=expected,
    )


def _check_channel(message_id: str, fixed: str, channel: str) -> None:
    if channel != fixed:
        raise FrameRejected(
            ErrorCode.CHANNEL_MISMATCH,
            f"message '{message_id}' belongs to channel '{fixed}', not '{channel}'",
            message_id,
        )
