"""The writes the broker queues for Redis, one script each, with their arguments by name;
and the runs of deltas that join a queued write instead of queueing their own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from redis.typing import EncodableT

from ...core.codec import encode_chunks
from ...core.history import new_epoch
from ...core.protocol import Snapshot, encode
from ...core.settings import Settings
from .keys import KEY_TTL, key
from .outbox import Deferred
from .partlog import MAX_LOG_BYTES
from .webhooks import OUTBOX, OUTBOX_BYTES

__all__ = [
    "CLAIMED",
    "MAX_HELD_PER_CHANNEL",
    "MAX_QUEUE_CHARS",
    "OPENED_HERE",
    "DeltaArgs",
    "Held",
    "MetaArgs",
    "OpenArgs",
    "PartArgs",
    "ProgressArgs",
    "ResyncArgs",
    "Runs",
    "Target",
    "TerminalArgs",
    "Write",
    "delta_write",
    "make_whole",
    "meta_write",
    "open_write",
    "part_write",
    "progress_write",
    "resync_write",
    "taken",
    "terminal_write",
    "whole_write",
]

CLAIMED = 2
"""TERMINAL's ``strict`` for a message that opened: refused if its claim was refused."""
OPENED_HERE = 3
"""WHOLE's ``strict`` for a message that opened with events of its own (its open, and the
deltas that joined it, go in the same script as its final): its claim is checked there, and
unlike a whole message's (``strict`` 0), the same frame another owner published within the
hold is refused, not answered as published (see ``TERMINAL``)."""
MAX_HELD_PER_CHANNEL = 10_000
"""Ids held after their message ended (``--id-hold``) per channel in ``tr:held:C``, at most:
past it the channel's holds start again (the ones before end early)."""

MAX_QUEUE_CHARS = 64 * 1024 * 1024
"""Characters of text the writes queued for Redis and in flight carry, at most (beside
the count, ``MAX_QUEUE``): past it a write is not queued, as past the count."""

Target = tuple[str, str, str]
"""A message: (channel, owner, id). A plain tuple: one is made per event."""


class OpenArgs(NamedTuple):
    """ARGV of OPEN: DELTA's, then the message's member of the in-progress set."""

    text: str
    message_id: str
    text_ttl: int
    key_ttl: int
    owner: str
    seq: int
    channel: str
    member: str


class DeltaArgs(NamedTuple):
    """ARGV of DELTA."""

    text: str
    message_id: str
    text_ttl: int
    key_ttl: int
    owner: str
    seq: int
    channel: str
    claimed: int
    """1 if the message opened before: its deltas are dropped if its claim was refused."""


class PartArgs(NamedTuple):
    """ARGV of PART: DELTA's (``text``, the entries), then ``convert`` and the log's bound."""

    text: bytes
    message_id: str
    text_ttl: int
    key_ttl: int
    owner: str
    seq: int
    channel: str
    claimed: int
    convert: str
    """``1`` or ``0``: the message becomes structured here (its implicit text part is its
    text so far, or there is none); "" once it is."""
    max_bytes: int
    frame: str
    """The ``chunks`` frame to publish ("" for none)."""


class ProgressArgs(NamedTuple):
    """ARGV of PROGRESS."""

    owner: str
    message_id: str
    seq: int
    channel: str


class MetaArgs(NamedTuple):
    """ARGV of META."""

    message_id: str
    meta: str
    key_ttl: int


class ResyncArgs(NamedTuple):
    """ARGV of RESYNC."""

    member: str
    text: str | bytes
    snapshot: str
    text_ttl: int
    key_ttl: int
    message_id: str
    owner: str


class TerminalArgs(NamedTuple):
    """ARGV of TERMINAL (WHOLE's too, followed by the text of the deltas that joined it)."""

    body: str
    epoch: str
    history_size: int
    now_ms: int
    member: str
    history_ttl: int
    key_ttl: int
    message_id: str
    owner: str
    seq: int
    outcome: str
    """``a`` aborted, ``m`` completed."""
    max_completed: int
    strict: int
    """0: the id may be free or the owner's; 1 (a reaper's abort): the owner must hold it;
    :data:`CLAIMED`: a message that opened, whose claim must not have been refused."""
    channel: str
    webhook: int
    producer: str
    webhook_max_pending: int
    webhook_max_pending_bytes: int
    hold_ms: int
    max_held: int
    max_channels: int
    """``--max-history-channels``: channels whose history and offsets Redis keeps, beyond
    those with a subscriber or a message in progress (see ``TERMINAL``)."""


@dataclass(slots=True)
class Write:
    """One script queued for the writer, with its keys and its arguments (``args``, one
    of the NamedTuples above, as the script numbers them)."""

    script: str
    keys: list[str]
    args: tuple[EncodableT, ...]
    done: asyncio.Future[Any] | None = None
    message: Target | None = None
    """The message of a delta, so a failed one marks its message for a resync."""
    deferred: Deferred | None = None
    """A terminal frame from the outbox: put back if it fails."""
    claim: Target | None = None
    """The message of an open, so a refused claim is reported."""
    webhook: tuple[str, str] | None = None
    """(channel, id) of a terminal frame its webhook takes, so a full outbox is reported."""
    terminal: Target | None = None
    """The message of a terminal frame someone waits for: its future ends with the frame's
    text, or ``id_in_use``."""
    parts: list[str] | None = None
    """The texts of a run (see :class:`Runs`), joined into its text when the writer takes it."""
    entries: list[bytes] | None = None
    """The log entries of a run of a structured message's, joined as ``parts`` are."""
    live: list[dict[str, Any]] | None = None
    """The chunks of a run of a structured message's, published as one ``chunks`` frame."""
    seq: int = 0
    """The seq of a run's last event."""
    chars: int = 0
    """The characters of text it carries (texts, entries, frames), counted in
    :class:`Held` from its queueing until the writer settled it."""


class Held:
    """What the queued writes and those in flight carry, in characters of text (see
    :attr:`Write.chars`), and its bound."""

    __slots__ = ("chars", "limit")

    def __init__(self, limit: int = MAX_QUEUE_CHARS) -> None:
        self.chars = 0
        self.limit = limit


class Runs:
    """The delta writes still queued since the last other write, by message.

    A message's next delta joins its run's write instead of queueing one of its own: one
    script per message per run, not one per delta. A message's open starts a run too, so
    its first deltas go with its claim, in one script. Nothing joins across another kind of
    write, so each message's text and order are unchanged; subscribers get fewer, longer
    delta frames, as with ``--delta-flush-ms``. A joined write's event ``seq`` is its
    run's last. The texts are kept as parts and joined once, when the writer takes them.
    What joins is counted in ``held``, and nothing joins once that is at its bound: the
    event is then queued as its own write, which is refused as the queue is full.
    """

    __slots__ = ("_open", "held")

    def __init__(self, held: Held | None = None) -> None:
        self._open: dict[Target, Write] = {}
        self.held = Held() if held is None else held

    def join(self, target: Target, delta: str, seq: int) -> bool:
        """Add ``delta`` to the queued run of ``target``; False if there is none (or no
        more text may be held)."""
        write = self._open.get(target)
        if write is None or write.parts is None or write.script == "part":
            return False
        held = self.held
        if held.chars >= held.limit:
            return False
        write.parts.append(delta)
        size = len(delta)
        write.chars += size
        held.chars += size
        if seq:
            write.seq = seq
        return True

    def join_entry(
        self, target: Target, entry: bytes, seq: int, live: Sequence[dict[str, Any]] | None
    ) -> bool:
        """Add a structured message's log ``entry`` (and the ``live`` chunks to publish) to
        its queued run; False if there is none (or the run is of its plain deltas, or no
        more text may be held). The ``live`` chunks count as long as their entry."""
        write = self._open.get(target)
        if write is None or write.script != "part" or write.entries is None:
            return False
        held = self.held
        if held.chars >= held.limit:
            return False
        write.entries.append(entry)
        grown = 2 * len(entry) if live else len(entry)
        write.chars += grown
        held.chars += grown
        if live:
            if write.live is None:
                write.live = list(live)
            else:
                write.live.extend(live)
        if seq:
            write.seq = seq
        return True

    def opened_log(
        self,
        target: Target,
        write: Write,
        entry: bytes,
        seq: int,
        live: Sequence[dict[str, Any]] | None,
    ) -> None:
        """``write``, a part write just queued with ``entry``, starts its message's run."""
        write.entries = [entry]
        if live:
            write.live = list(live)
            write.chars += len(entry)  # the chunks, counted as long as their entry
            self.held.chars += len(entry)
        write.seq = seq
        self._open[target] = write

    def opened(self, target: Target, write: Write, text: str, seq: int) -> None:
        """``write``, a delta or an open just queued with ``text`` and ``seq``, starts its
        message's run."""
        write.parts = [text]
        write.seq = seq
        self._open[target] = write

    def completes(self, target: Target, last: Write | None) -> Write | None:
        """The message's queued open, if it is the last write queued: its terminal frame
        may join it (see ``WHOLE``); the run ends either way."""
        write = self._open.pop(target, None)
        return write if write is not None and write is last and write.script == "open" else None

    def close(self) -> None:
        """Another kind of write was queued, or the writer took the queue: runs end."""
        self._open.clear()


def taken(write: Write) -> Write:
    """A write as the writer takes it: a run's parts joined into its text."""
    parts = write.parts
    if parts is None:
        entries = write.entries
        if entries is not None:
            write.entries = None
            log = cast("PartArgs", write.args)
            if len(entries) > 1 or write.seq != log.seq:
                log = log._replace(text=b"".join(entries), seq=write.seq)
            live = write.live
            if live:
                write.live = None
                log = log._replace(frame=encode_chunks(log.channel, log.message_id, live))
            write.args = log
        return write
    write.parts = None
    if write.script == "whole":
        write.args = (*write.args, "".join(parts))  # TERMINAL's arguments, then the text
        return write
    args = cast("OpenArgs | DeltaArgs", write.args)
    if len(parts) > 1 or write.seq != args.seq:  # deltas joined it: one rebuild, not one each
        write.args = args._replace(text="".join(parts), seq=write.seq)
    return write


def _text_keys(channel: str, member: str) -> list[str]:
    """KEYS of OPEN, DELTA and RESYNC.

    The publish path spells its keys as f-strings, ``tr:KIND:NAME`` as :func:`.keys.key`
    does: a call per key would cost more than the write's arguments."""
    return [
        f"tr:seq:{channel}",
        f"tr:live:{channel}",
        f"tr:text:{member}",
        f"tr:d:{channel}",
        f"tr:own:{channel}",
    ]


def open_write(target: Target, seq: int, text_ttl: int) -> Write:
    """Claim the id and list the message as in progress."""
    channel, owner, message_id = target
    member = f"{owner}|{message_id}"
    return Write(
        "open",
        _text_keys(channel, member),
        OpenArgs("", message_id, text_ttl, KEY_TTL, owner, seq, channel, member),
        message=target,
        claim=target,
    )


def delta_write(target: Target, delta: str, seq: int, claimed: bool, text_ttl: int) -> Write:
    """Append to the message's text and publish the delta."""
    channel, owner, message_id = target
    return Write(
        "delta",
        _text_keys(channel, f"{owner}|{message_id}"),
        DeltaArgs(delta, message_id, text_ttl, KEY_TTL, owner, seq, channel, int(claimed)),
        message=target,
        chars=len(delta),
    )


def part_write(
    target: Target, entry: bytes, seq: int, claimed: bool, convert: str, text_ttl: int
) -> Write:
    """Add to a structured message's log (see :mod:`.partlog`), and publish its chunks."""
    channel, owner, message_id = target
    return Write(
        "part",
        _text_keys(channel, f"{owner}|{message_id}"),
        PartArgs(
            entry,
            message_id,
            text_ttl,
            KEY_TTL,
            owner,
            seq,
            channel,
            int(claimed),
            convert,
            MAX_LOG_BYTES,
            "",
        ),
        message=target,
        chars=len(entry),
    )


def progress_write(target: Target, seq: int, done: asyncio.Future[Any] | None = None) -> Write:
    """Note the seq of an event that carried no text (with no message: a marker the writer
    answers in order, see ``flush_writes``)."""
    channel, owner, message_id = target
    return Write("progress", [], ProgressArgs(owner, message_id, seq, channel), done)


def meta_write(owner: str, message_id: str, meta: str) -> Write:
    """Keep a message's merged metadata."""
    return Write("meta", [key("meta", owner)], MetaArgs(message_id, meta, KEY_TTL), chars=len(meta))


def resync_write(
    target: Target,
    text: str | bytes,
    text_ttl: int,
    snapshot: str = "",
) -> Write:
    """Rewrite a message's whole text and publish it as a snapshot; a structured message's
    log (``text``, its ``snapshot`` given)."""
    channel, owner, message_id = target
    member = f"{owner}|{message_id}"
    if not snapshot:
        assert isinstance(text, str)
        snapshot = encode(Snapshot(channel=channel, id=message_id, text=text))
    return Write(
        "resync",
        _text_keys(channel, member),
        ResyncArgs(member, text, snapshot, text_ttl, KEY_TTL, message_id, owner),
        message=target,
        chars=len(text) + len(snapshot),
    )


def terminal_write(
    settings: Settings,
    webhook: bool,
    target: Target,
    body: str,
    done: asyncio.Future[Any] | None,
    seq: int = 0,
    aborted: bool = False,
    strict: int = 0,
    producer: str = "",
    session: bool = True,
) -> Write:
    """Give a terminal frame its offset, add it to history and publish it (and queue its
    webhook, if ``webhook``); remembered in its owner's session, unless it has none."""
    channel, owner, message_id = target
    member = f"{owner}|{message_id}"
    return Write(
        "terminal",
        [
            f"tr:epoch:{channel}",
            f"tr:offset:{channel}",
            f"tr:seq:{channel}",
            f"tr:history:{channel}",
            f"tr:live:{channel}",
            f"tr:text:{member}",
            f"tr:m:{channel}",
            f"tr:own:{channel}",
            OUTBOX,
            OUTBOX_BYTES,
        ],
        TerminalArgs(
            body,
            new_epoch(),
            settings.history_size,
            int(time.time() * 1000),
            member,
            max(1, int(settings.history_ttl)),
            KEY_TTL,
            message_id,
            owner,
            seq,
            "a" if aborted else "m",
            settings.max_completed_per_producer if session else 0,
            strict,
            channel,
            int(webhook),
            producer,
            settings.webhook_max_pending,
            settings.webhook_max_pending_bytes,
            0 if aborted else int(settings.id_hold * 1000),  # completed ids only
            MAX_HELD_PER_CHANNEL,
            settings.max_history_channels,
        ),
        done,
        webhook=(channel, message_id) if webhook else None,
        chars=len(body),
    )


def make_whole(opening: Write, terminal: Write, target: Target) -> None:
    """Turn a queued open (and the deltas that joined it) into WHOLE: the open, its deltas
    and the terminal frame of ``target`` as one script, in the open's place."""
    channel, _, _ = target
    opening.script, opening.done, opening.terminal = "whole", terminal.done, target
    opening.keys = [*terminal.keys, f"tr:d:{channel}"]
    opening.args = terminal.args
    opening.webhook = terminal.webhook
    if opening is not terminal:
        opening.chars += terminal.chars


def whole_write(
    settings: Settings,
    webhook: bool,
    target: Target,
    text: str,
    body: str,
    done: asyncio.Future[Any],
    producer: str = "",
) -> Write:
    """WHOLE for a message of an owner with no session (a one-shot message): its claim
    checked, its ``text`` published as one delta (if any) and its terminal frame, in one
    script, with nothing of it kept per owner."""
    write = terminal_write(settings, webhook, target, body, done, producer=producer, session=False)
    write.parts = [text]
    write.chars += len(text)
    make_whole(write, write, target)  # its own open: the terminal write, and its text
    return write
