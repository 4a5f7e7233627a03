"""The one socket writer: every frame the relay sends, to producers and subscribers, goes here.

Theory of operation
-------------------
A frame is serialized once per kind of receiver (a
:class:`~token_relay.edge.broadcast.Broadcast`), and each ready peer takes it in its own
form (:meth:`~token_relay.edge.peer.Peer.take`) without waiting. A socket whose unsent bytes pass
``subscriber_high_water_bytes`` is not written to directly any more: its frames
go to a :class:`~token_relay.core.merge.Backlog`, where its pending deltas merge
losslessly, and one task per backlog drains it at the socket's pace. When the
backlog is empty the socket is written to directly again.

A producer's replies (acks, errors) go the same way, through :meth:`Writer.reply`,
which then waits until the socket can take more: that is each producer's
backpressure, and its frames stay in one order with the cancels sent to it.

A socket whose unsent bytes plus backlog pass ``max_subscriber_buffer_bytes``
is closed with 1013 (try again later): it can resume by offset, and nothing
it was owed is lost from history. Completed messages are never dropped while
it stays connected.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from websockets import CloseCode

from ..core.events import Outgoing
from ..core.merge import Backlog
from ..core.settings import Settings
from .broadcast import Broadcast
from .metrics import Metrics
from .peer import Peer

__all__ = ["SLOW_CONSUMER_REASON", "Writer"]

log = logging.getLogger("token_relay")

SLOW_CONSUMER_REASON = "slow consumer: outgoing buffer over limit; resume by offset"


class Writer:
    """Frame delivery for one relay process."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        forget: Callable[[Peer], None],
    ) -> None:
        self.high_water = settings.subscriber_high_water_bytes
        self.hard_limit = settings.max_subscriber_buffer_bytes
        self.metrics = metrics
        self._forget = forget
        self.backlogs: dict[Peer, Backlog] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def send(self, receivers: Iterable[Peer], payload: Outgoing) -> None:
        """Send one serialized frame to every receiver, each at its own pace.

        One pass over the receivers: each ready socket is written to as it comes, so the
        first receiver is served without waiting for a look at the rest.
        """
        over: list[Peer] = []
        high_water = self.high_water
        backlogs = self.backlogs
        broadcast = Broadcast(payload)
        written = 0
        for receiver in receivers:
            backlog = backlogs.get(receiver) if backlogs else None
            if backlog is None:
                if receiver.transport.get_write_buffer_size() <= high_water:
                    receiver.take(broadcast)
                    written += 1
                    continue
                backlog = self._start_backlog(receiver)
            if backlog.push(payload):
                self.metrics.deltas_coalesced.inc()
            if backlog.bytes + _unsent(receiver) > self.hard_limit:
                over.append(receiver)
        if written:
            self.metrics.frames_out.value += written  # Tally.inc(), a call less per frame
        # Closing edits the set being iterated above (the hub's), so it comes after.
        for receiver in over:
            self.close(receiver, CloseCode.TRY_AGAIN_LATER, SLOW_CONSUMER_REASON)
            self.metrics.slow_closes.inc()

    def send_to(self, receiver: Peer, payload: Outgoing) -> None:
        """:meth:`send` to one receiver (a producer's reply): the same, in fewer steps."""
        if (not self.backlogs or receiver not in self.backlogs) and (
            receiver.transport.get_write_buffer_size() <= self.high_water
        ):
            receiver.take(Broadcast(payload))
            self.metrics.frames_out.value += 1
        else:
            self.send((receiver,), payload)

    def offer(self, connection: Peer, payload: Outgoing) -> bool:
        """Send a frame the peer can do without (a cancel to a producer), only if its socket
        is under the high-water mark; False if it was dropped. Never closes the peer."""
        if connection in self.backlogs or _unsent(connection) > self.high_water:
            return False
        self.send((connection,), payload)
        return True

    def send_each(self, receiver: Peer, payloads: Iterable[Outgoing]) -> None:
        """Send several frames to one receiver, in order."""
        for payload in payloads:
            self.send((receiver,), payload)

    async def reply(self, connection: Peer, payload: Outgoing) -> None:
        """Send a frame to a producer, then wait until its socket can take more."""
        self.send((connection,), payload)
        await connection.drain()

    def close(self, connection: Peer, code: CloseCode, reason: str) -> None:
        """Forget a connection's subscriptions and close it, without waiting."""
        if code == CloseCode.TRY_AGAIN_LATER:
            log.warning("closing slow peer %s: %s", connection.id, reason)
        self._forget(connection)
        backlog = self.backlogs.pop(connection, None)
        if backlog is not None:
            backlog.clear()  # what can no longer be sent; history keeps the messages
        self._spawn(connection.close(code, reason))

    async def stop(self) -> None:
        """Cancel the drain and close tasks."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _start_backlog(self, connection: Peer) -> Backlog:
        backlog = self.backlogs[connection] = Backlog()
        self._spawn(self._drain(connection, backlog))
        return backlog

    async def _drain(self, connection: Peer, backlog: Backlog) -> None:
        try:
            while backlog and connection.open:
                # send() waits until the socket has room: the backlog drains at its pace.
                await connection.send(backlog.pop_payload())
                self.metrics.frames_out.inc()
        finally:
            if self.backlogs.get(connection) is backlog:
                del self.backlogs[connection]

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _unsent(connection: Peer) -> int:
    return connection.transport.get_write_buffer_size()
