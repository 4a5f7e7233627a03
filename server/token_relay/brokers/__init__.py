"""The broker contract: what a relay process needs from the engine that joins processes.

Theory of operation
-------------------
A relay process keeps its connections, its producers' assemblers and its local
subscriptions to itself. Everything that must be shared between processes goes
through a broker:

* **Events out.** A producer's message opening, each non-empty delta, and its
  terminal frame (``message`` or ``aborted``). The broker gives terminal frames
  the channel's next offset and keeps them in the channel's history.
* **Events in.** The broker hands every event of a channel this process listens
  to back to :class:`BrokerListener` (``on_frame``, and ``on_delta`` for deltas,
  which travel as their fields, never as JSON to parse), in one order per channel, each
  with a per-channel sequence number ``seq``. This includes the process's own
  events: local and remote subscribers see the same order.
* **Catch-up.** A subscriber joining a channel gets a consistent cut: the
  channel's offset, epoch and ``seq``, the history it missed, and the text of
  each message in progress. Events with ``seq`` up to the cut's are already in
  it; the router (:mod:`token_relay.core.router`) drops those, whenever they arrive.
* **Cancel.** A cancel for a channel and id reaches the producers that own it,
  whichever process they are on.
* **Chat requests.** A producer that takes a chat's requests on a channel (a WebSocket
  producer connected with ``?channel=``) is registered with the broker while it is
  connected; a request (the ``send`` of the AI SDK's ``WebSocketChatTransport``) goes to
  the newest one registered, whichever process it is on, and the process that serves the
  request learns whether it was handed over (``no_producer``, ``producer_busy``).
* **Webhooks.** With ``--webhook``, each terminal frame of a channel the webhooks take is
  put in the broker's :class:`WebhookStore` in the same step that gives it its offset, and
  one process at a time takes the outbox's entries to deliver them
  (:mod:`token_relay.edge.webhooks`).

Brokers are chosen by URL scheme from :data:`BROKERS`; optional dependencies
(Redis) are imported only when their scheme is asked for.

Every method that talks to a remote engine raises :class:`BrokerUnavailable`
when it can't, and ``healthy`` says whether it currently can.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..core.errors import ConfigError, ErrorCode
from ..core.events import CatchUp, Delta, FrameKind, LiveMessage, Payload
from ..core.sessions import SessionState
from ..core.settings import Settings
from ..core.webhooks import DeadLetter, WebhookEntry

__all__ = [
    "BROKERS",
    "Broker",
    "BrokerListener",
    "CatchUp",
    "FrameKind",
    "LiveMessage",
    "WebhookStore",
    "note_not_queued",
    "open_broker",
]


class BrokerListener(Protocol):
    """What a broker calls back into: the relay process's local side."""

    def on_frame(self, channel: str, kind: FrameKind, seq: int, payload: Payload) -> None:
        """Deliver a terminal or snapshot frame to this process's subscribers of ``channel``."""

    def on_delta(self, channel: str, seq: int, delta: Delta) -> None:
        """Deliver a delta to this process's deltas subscribers of ``channel``."""

    def on_cancel(self, owner: str, payload: Payload) -> None:
        """Deliver a ``cancel`` frame to the local producer connection ``owner``."""

    def wants_deltas(self, channel: str) -> bool:
        """Whether any local subscriber of ``channel`` asked for deltas."""

    def partial(self, owner: str, message_id: str) -> str | None:
        """The text so far of a plain message owned by a local producer (for in-process
        brokers)."""

    def live_parts(self, owner: str, message_id: str) -> tuple[str, list[dict[str, Any]]] | None:
        """The text so far and compacted catch-up chunks of a structured message owned by
        a local producer (for in-process brokers)."""

    def owned_messages(self) -> list[tuple[str, str, str]]:
        """``(channel, owner, id)`` of every message in progress on this process's producers."""

    def on_session_moved(self, owner: str) -> None:
        """Another process took over the local session ``owner``: let go of it, abort nothing."""

    def on_claim_refused(self, channel: str, owner: str, message_id: str) -> None:
        """Another owner held the id in the channel: the local owner's message is void."""

    def on_restored(self) -> None:
        """The broker came back after an outage: events may have been missed meanwhile."""

    def on_request(self, owner: str, channel: str, payload: Payload) -> ErrorCode | None:
        """Hand a chat request on ``channel`` to the local producer ``owner``: None once it
        is on its way, else why not (:attr:`ErrorCode.NO_PRODUCER`: not connected here
        now; :attr:`ErrorCode.PRODUCER_BUSY`: not reading)."""


class WebhookStore(Protocol):
    """The webhook outbox: bounded by ``--webhook-max-pending`` (and its bytes), with the
    dead letters beside it (``--webhook-max-dead`` and ``--webhook-max-dead-bytes``)."""

    not_queued: int
    """Messages refused because the outbox was full (counted since start)."""

    @property
    def active(self) -> bool:
        """Whether this process delivers the outbox now (with Redis, one process at a time)."""

    @property
    def depth(self) -> int:
        """Messages in the outbox, as last seen."""

    @property
    def dead_count(self) -> int:
        """Dead letters kept, as last seen."""

    @property
    def dead_bytes(self) -> int:
        """Bytes of the dead letters kept (as JSON), as last seen."""

    async def take(self, limit: int, wait: float) -> list[WebhookEntry]:
        """Up to ``limit`` entries to deliver, in outbox order (first what a process that
        stopped delivering left unsettled); waits up to ``wait`` seconds for one. With
        ``limit`` 0 it only keeps (or tries for) the right to deliver."""

    async def settle(self, entry: WebhookEntry) -> None:
        """Every URL is done with the entry: remove it from the outbox."""

    async def bury(self, letter: DeadLetter) -> int:
        """Keep a dead letter; past ``--webhook-max-dead`` or ``--webhook-max-dead-bytes``
        the oldest are dropped (this one, if it alone is over the bytes). Returns how many
        were dropped."""

    async def dead(self) -> list[DeadLetter]:
        """The dead letters, newest first."""

    async def revive(self) -> int:
        """Put every dead letter back in the outbox (for its one URL); returns how many."""

    async def release(self) -> None:
        """Stop delivering (the process is stopping): another process may take over now."""


_not_queued_log = logging.getLogger("token_relay.webhooks")


def note_not_queued(store: WebhookStore, channel: str, message_id: str) -> None:
    """Count and log a message the full outbox did not take (the first ten, then one line
    in a thousand)."""
    store.not_queued += 1
    count = store.not_queued
    if count <= 10 or count % 1000 == 0:
        _not_queued_log.warning(
            "webhook outbox full: message %r on %r not queued (%d so far)",
            message_id,
            channel,
            count,
            extra={"event": "webhook_not_queued", "channel": channel, "id": message_id},
        )


class Publication(Protocol):
    """A terminal frame being published: an ``asyncio.Future[str]``, or :class:`Published`."""

    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def exception(self) -> BaseException | None: ...
    def result(self) -> str: ...
    def __await__(self) -> Generator[Any, None, str]: ...


class Published:
    """A publication that ended within the call (a broker in this process): no future,
    no event loop, for the price of one small object. Its :attr:`frame` and :attr:`error`
    are read as they are, where the relay handles one of these (no calls)."""

    __slots__ = ("error", "frame")

    def __init__(self, frame: str = "", error: BaseException | None = None) -> None:
        self.frame, self.error = frame, error

    def done(self) -> bool:
        return True

    def cancelled(self) -> bool:
        return False

    def exception(self) -> BaseException | None:
        return self.error

    def result(self) -> str:
        """The full frame, once published (or the publication's error, raised)."""
        if self.error is not None:
            raise self.error
        return self.frame

    def __await__(self) -> Generator[Any, None, str]:
        if self.error is not None:
            raise self.error
        return self.frame
        yield  # a generator, never suspended


class Broker(Protocol):
    """The engine that joins relay processes. See the module docstring."""

    instance: str
    """This process's name among all processes on the broker."""

    @property
    def healthy(self) -> bool:
        """Whether the broker is reachable right now."""

    def memory_bytes(self) -> int:
        """Characters of frames this process holds for the broker (history, outbox)."""

    async def start(self, listener: BrokerListener) -> None:
        """Connect, and start delivering events to ``listener``."""

    async def close(self) -> None:
        """Disconnect and stop delivering."""

    async def listen(self, channel: str, messages: bool, deltas: bool) -> None:
        """Receive (or stop receiving) a channel's terminal frames and its deltas."""

    shares_sessions: bool
    """Whether producer sessions live in the broker, so a producer resumes on any process."""

    webhooks: WebhookStore | None
    """The webhook outbox, when ``--webhook`` is given."""

    def open(self, channel: str, owner: str, message_id: str, seq: int = 0) -> bool:
        """A message opened: claim its id in the channel for ``owner``.

        False if another owner holds the id there right now. A broker that can only
        settle the claim later answers True and reports a refusal through
        :meth:`BrokerListener.on_claim_refused`; until then, and after, it publishes
        nothing of the message if the claim failed. Ordered after earlier calls for
        the same owner.
        """

    def delta(
        self,
        channel: str,
        owner: str,
        message_id: str,
        delta: str,
        seq: int = 0,
        claimed: bool = True,
    ) -> None:
        """A non-empty delta (``seq`` the event's, 0 if unnumbered). Ordered after earlier
        calls for the same owner; never waits. Dropped if another owner holds the id, or
        (``claimed``: the message opened before, with :meth:`open`) if its claim was
        refused, even once the holder is done
        (:meth:`~token_relay.core.inflight.InflightIndex.may_publish`)."""

    def deltas(
        self, channel: str, owner: str, message_id: str, deltas: Sequence[str], count: int
    ) -> None:
        """A run of a claimed message's unnumbered deltas, ``count`` of them not empty, as
        :meth:`delta` takes each in turn (an empty one is skipped: :meth:`delta` is never
        given one)."""

    def part(
        self,
        channel: str,
        owner: str,
        message_id: str,
        entry: Mapping[str, Any] | str,
        seq: int = 0,
        convert: str = "",
        live: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """A structured message applied ``entry`` (a chunk, or a top-level delta): kept,
        in order, where another process taking its session over (or aborting it) can
        rebuild its parts (a broker that shares sessions), and ``live``, the chunks it
        amounts to, published to the channel's deltas subscribers as a ``chunks`` frame
        (unless another owner holds the id, as for :meth:`delta`). ``convert`` is ``1`` or
        ``0`` for the event that made it structured (whether its text so far became its
        implicit text part), "" after. Never waits."""

    def progress(self, channel: str, owner: str, message_id: str, seq: int) -> None:
        """An event with a ``seq`` but no text was applied. Never waits."""

    def meta(self, channel: str, owner: str, message_id: str, meta: str) -> None:
        """A message in progress has this merged metadata (JSON), or none any more ('').
        Kept where another process taking the session over can read it. Never waits."""

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
    ) -> Publication:
        """Give a terminal frame its offset, record and publish it: ordered now after
        earlier calls for the same owner; the publication (awaited: the full frame) ends
        once that is done, at once or a round trip later.

        ``body`` is the frame serialized without ``offset`` and ``epoch``; ``producer`` is
        the producer's identity (JSON) its webhook carries, "" without auth. It ends with
        ``id_in_use`` (:class:`~token_relay.core.errors.FrameRejected`) if another owner
        holds the id in the channel, or (``claimed``: the message opened before) if its
        claim was refused, even once the holder is done. A producer goes on applying its
        next events while its final is being published: the round trip is not paid once
        per message.
        """

    def whole(
        self,
        channel: str,
        owner: str,
        message_id: str,
        text: str,
        body: str,
        producer: str = "",
    ) -> Publication | None:
        """A one-shot message: a final that opened its message, of an owner with no
        session. Published as :meth:`delta` (``text``, if not empty) and then
        :meth:`terminal` (neither ``claimed``) would publish it, in one step where the
        broker can, and nothing of it is kept per owner (nobody can take its session
        over). None if the broker can't take it now (nothing was done: the caller takes
        the general path)."""

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
        """Like :meth:`terminal`, for a frame nobody will send again (an abort): publish it
        now if the broker can, else keep it (bounded) and publish it, in order, once it can."""

    async def catch_up(
        self, channel: str, since: tuple[int, str] | None, live: bool, rewind: int = 0
    ) -> CatchUp:
        """A consistent cut of ``channel`` for a joining subscriber."""

    async def save_session(self, token: str, owner: str, grant: str) -> None:
        """Record a new producer session (a broker that shares sessions)."""

    async def take_session(self, token: str, grant: str, owner: str) -> SessionState | None:
        """Move the session ``token`` (opened with ``grant``) to ``owner`` on this process,
        or None if there is none to take."""

    async def end_session(self, token: str, owner: str) -> None:
        """Forget a session that ended on this process."""

    async def leave(self) -> None:
        """This process is stopping: hand its sessions over to the others."""

    async def cancel(self, channel: str, message_id: str, frame: str) -> int:
        """Send a ``cancel`` frame to every owner of the message; returns how many there are."""

    async def take_requests(self, channel: str, owner: str, taking: bool) -> None:
        """Register (``taking``) or unregister the local producer ``owner`` as one that
        takes the chat requests of ``channel``. A registration is kept by this process too,
        and made again after an outage of the broker."""

    async def hand_request(self, channel: str, payload: str) -> ErrorCode | None:
        """Hand a chat request to the newest producer registered for ``channel``, on any
        process: None once it is on its way, else :attr:`ErrorCode.NO_PRODUCER` (none
        takes it) or :attr:`ErrorCode.PRODUCER_BUSY` (the newest is not reading)."""

    async def ready(self) -> bool:
        """Check the broker end to end (for readiness probes)."""

    async def flush(self) -> None:
        """Return once every event published so far has reached this process's listener."""

    async def flush_writes(self) -> None:
        """Return once every write queued so far has reached the store other processes read
        (or has failed): what this process applied, another can now take over."""


BrokerFactory = Callable[[str, Settings, str], Broker]


def _memory(url: str, settings: Settings, instance: str) -> Broker:
    from .memory import MemoryBroker

    return MemoryBroker(settings, instance)


def _redis(url: str, settings: Settings, instance: str) -> Broker:
    try:
        module = importlib.import_module("token_relay.brokers.redis")
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ConfigError(
            f"--broker {url} needs the Redis client: pip install 'token-relay[redis]' ({exc})"
        ) from None
    broker: Broker = module.RedisBroker(url, settings, instance)
    return broker


BROKERS: dict[str, BrokerFactory] = {"memory": _memory, "redis": _redis}
"""Broker factories by URL scheme."""


def open_broker(settings: Settings, instance: str) -> Broker:
    """The broker named by ``settings.broker``, not yet started."""
    scheme = urlsplit(settings.broker).scheme
    factory = BROKERS.get(scheme)
    if factory is None:
        known = ", ".join(f"{name}://" for name in BROKERS)
        raise ConfigError(f"unknown broker {settings.broker!r}; use one of {known}")
    return factory(settings.broker, settings, instance)
