"""A one-shot ``POST /produce``: a JSON body that is one whole message, answered at once.

Most serverless gateways post a reply whole: ``{"id", "delta", "final": true}``, one
request each, with no name. Through the general path (:mod:`token_relay.edge.producers`)
such a request opens a producer session (a token, its streams, its rate limit), feeds the
body to it from a task of its own, applies the event, publishes the message, acks it, and
ends the session. None of that state outlives the request, so none of it is needed: this
module applies such a body directly, on the event loop's next pass after the one that read
it (the reads of a pass first, then their answers, as for tasks), with no task (with
Redis, one that waits for its reply) and with the relay's rules and answers unchanged.

It takes only what it can answer exactly as the general path would (a property test plays
both on the same requests and requires the same answers, frames, history and counters);
anything else, or any doubt, returns ``None`` and the request takes the general path with
its body whole:

* an unnamed ``POST /produce?channel=C`` whose body is JSON (not NDJSON), framed by
  ``Content-Length``, on a broker that takes a write now (Redis's is reachable and its
  queue has room);
* one event, a final, with no ``channel``, ``seq``, ``meta``, ``chunk`` nor ``abort``, whose
  ``delta`` (if any) is ASCII and within ``--max-message-chars``;
* a relay that is neither stopping nor past ``--max-memory-bytes``.

Its message goes to the broker whole (:meth:`~token_relay.brokers.Broker.whole`): a broker
in this process publishes it within the call, and the answer is written on the loop's next
pass; Redis takes it as one script, with the other writes of that pass, and the answer
waits for the script's reply. An owner with no session has nothing to remember: Redis keeps
nothing of a one-shot message per owner (the general path's session keeps its ids for a
process that takes the session over, and drops them when the request ends). If the write
fails on its way (Redis went away), the answer is the general path's, ``broker_unavailable``,
and the message waits in the broker's outbox to be published once Redis is back, as the
general path's session does with a final it could not publish when it ends.

The seed's rules for it: an unseen id finalized with a delta assembles to that delta, and
without one to ``""``. A fresh session's rate limit always admits one event (its burst is at
least one), so there is nothing to refuse there either. What can still be refused is the id
itself, held by another producer's message in progress (``id_in_use``), which the broker
decides as it does for every final.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from msgspec import DecodeError
from pydantic import MISSING

from ..brokers import Publication
from ..core.codec import Event, FastEvent, ack_frame, decode_fast, message_body
from ..core.errors import BrokerUnavailable, FrameRejected, broker_rejected
from ..core.grants import Grant
from ..core.protocol import error_frame
from .httpproducer import answer_of
from .producers import ProducerEndpoint

__all__ = ["Answer", "apply_once"]

Answer = tuple[bytes, frozenset[str]]
"""The answer's body, and the codes of its errors."""


def apply_once(
    endpoint: ProducerEndpoint,
    channel: str,
    grant: Grant,
    body: bytes,
    loop: asyncio.AbstractEventLoop,
) -> Answer | Coroutine[Any, Any, Answer] | None:
    """Apply ``body`` (a JSON body of ``POST /produce?channel=channel``, read on ``loop``)
    as one whole message: its answer, or (a broker that publishes a round trip later) a
    coroutine that waits for it. None if the body is not such a message, or the relay can't
    answer it here: nothing was applied, nothing counted."""
    if endpoint.stopping:
        return None
    try:
        event: Event | list[FastEvent] = decode_fast(body)
    except (DecodeError, RecursionError):
        return None
    if (
        isinstance(event, list)
        or not event.final
        or event.abort is not MISSING
        or event.channel is not MISSING
        or event.seq is not MISSING
        or event.meta is not MISSING
        or event.chunk is not MISSING
    ):
        return None
    delta: str | None = None if event.delta is MISSING else event.delta
    if delta is not None and (
        not delta.isascii() or len(delta) > endpoint.settings.max_message_chars
    ):
        return None  # mended, or refused, by the general path
    now = loop.time()
    if endpoint.overloaded(now):
        return None  # refused (and counted) by the general path
    message_id = event.id
    owner = endpoint.sessions.new_owner()
    # A final that opens a message: its text is its delta, or "" with none (the seed's rules).
    text = "" if delta is None else delta
    producer = endpoint.producer_identity(grant)
    frame = message_body(channel, message_id, text)
    published = endpoint.broker.whole(channel, owner, message_id, text, frame, producer)
    if published is None:
        return None  # the broker takes no write now: the general path answers
    metrics = endpoint.metrics
    metrics.frames_in_producer.value += 1
    if delta:
        metrics.first_delta.observe(0.0)
    message = _Published(
        endpoint, channel, owner, message_id, frame, producer, published, loop, now
    )
    return message.answer() if published.done() else message.later()


class _Published:
    """A one-shot message handed to its broker: its answer, once its publication is over."""

    __slots__ = (
        "channel",
        "endpoint",
        "frame",
        "loop",
        "message_id",
        "owner",
        "producer",
        "publication",
        "received",
    )

    def __init__(
        self,
        endpoint: ProducerEndpoint,
        channel: str,
        owner: str,
        message_id: str,
        frame: str,
        producer: str,
        publication: Publication,
        loop: asyncio.AbstractEventLoop,
        received: float,
    ) -> None:
        self.endpoint, self.channel, self.owner = endpoint, channel, owner
        self.message_id, self.frame, self.producer = message_id, frame, producer
        self.publication, self.loop, self.received = publication, loop, received

    async def later(self) -> Answer:
        """The answer, once the broker has published the message (or failed to)."""
        with contextlib.suppress(Exception):
            await asyncio.shield(self.publication)
        return self.answer()

    def answer(self) -> Answer:
        """The answer to a message whose publication is over: its ack, or the error the
        general path would answer."""
        endpoint, publication, message_id = self.endpoint, self.publication, self.message_id
        metrics = endpoint.metrics
        error = (
            BrokerUnavailable("the broker closed")
            if publication.cancelled()
            else publication.exception()
        )
        metrics.frames_out.inc()  # the ack, or the error: the frame a producer would be sent
        if isinstance(error, BrokerUnavailable):
            # Not published: refused, and kept to be published once the broker can, as the
            # general path's session does with a final it could not publish when it ends.
            endpoint.broker.defer(
                self.channel, self.owner, message_id, self.frame, producer=self.producer
            )
            error = broker_rejected(message_id)
        if isinstance(error, FrameRejected):  # the id is another producer's message in progress
            metrics.errors.labels(error.code.value).inc()
            return answer_of([], [error_frame(error).encode()]), frozenset((error.code.value,))
        if error is not None:
            raise error
        metrics.completed.inc()
        metrics.final_to_delivery.observe(self.loop.time() - self.received)
        return answer_of([ack_frame(self.channel, message_id, False)], []), frozenset()
