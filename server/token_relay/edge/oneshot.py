"""A one-shot ``POST /produce``: a JSON body that is one whole message, answered at once.

Most serverless gateways post a reply whole: ``{"id", "delta", "final": true}``, one
request each, with no name. Through the general path (:mod:`token_relay.edge.producers`)
such a request opens a producer session (a token, its streams, its rate limit), feeds the
body to it from a task of its own, applies the event, publishes the message, acks it, and
ends the session. None of that state outlives the request, so none of it is needed: this
module applies such a body directly, on the event loop's next pass after the one that read
it (the reads of a pass first, then their answers, as for tasks), with no task and with the
relay's rules and answers unchanged.

It takes only what it can answer exactly as the general path would (a property test plays
both on the same requests and requires the same answers, frames, history and counters);
anything else, or any doubt, returns ``None`` and the request takes the general path with
its body whole:

* an unnamed ``POST /produce?channel=C`` whose body is JSON (not NDJSON), framed by
  ``Content-Length``, on a relay whose broker lives in this process (its publication is
  over when the call returns; a shared broker's sessions and retries need the general path);
* one event, a final, with no ``channel``, ``seq``, ``meta``, ``chunk`` nor ``abort``, whose
  ``delta`` (if any) is ASCII and within ``--max-message-chars``;
* a relay that is neither stopping nor past ``--max-memory-bytes``.

The seed's rules for it: an unseen id finalized with a delta assembles to that delta, and
without one to ``""``. A fresh session's rate limit always admits one event (its burst is at
least one), so there is nothing to refuse there either. What can still be refused is the id
itself, held by another producer's message in progress (``id_in_use``), which the broker
decides as it does for every final.
"""

from __future__ import annotations

import asyncio

from msgspec import DecodeError
from pydantic import MISSING

from ..core.codec import Event, FastEvent, acks_frame, decode_fast, message_body
from ..core.errors import FrameRejected
from ..core.grants import Grant
from ..core.protocol import error_frame
from .httpproducer import answer_of
from .producers import ProducerEndpoint

__all__ = ["apply_once"]


def apply_once(
    endpoint: ProducerEndpoint, channel: str, grant: Grant, body: bytes
) -> tuple[bytes, frozenset[str]] | None:
    """Apply ``body`` (a JSON body of ``POST /produce?channel=channel``) as one whole
    message: ``(the answer's body, the codes of its errors)``. None if the body is not such a
    message, or the relay can't answer it here: nothing was applied, nothing counted."""
    if endpoint.stopping or endpoint.broker.shares_sessions:
        return None
    try:
        event: Event | list[FastEvent] = decode_fast(body)
    except DecodeError:
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
    loop_time = asyncio.get_running_loop().time
    now = loop_time()
    if endpoint.overloaded(now):
        return None  # refused (and counted) by the general path
    metrics, broker, message_id = endpoint.metrics, endpoint.broker, event.id
    metrics.frames_in_producer.value += 1
    owner = endpoint.sessions.new_owner()
    # A final that opens a message: its text is its delta, or "" with none (the seed's rules).
    text = "" if delta is None else delta
    if delta:
        # A one-shot message never claimed its id: the broker checks nobody else holds it.
        broker.delta(channel, owner, message_id, delta, 0, False)
        metrics.first_delta.observe(0.0)
    producer = endpoint.producer_identity(grant)
    published = broker.terminal(
        channel,
        owner,
        message_id,
        message_body(channel, message_id, text),
        0,
        producer=producer,
        claimed=False,
    )
    # A broker in this process publishes within the call: its publication is done (were it
    # not, asking for its exception would raise, a bug answered 500, never a wrong answer).
    error = published.exception()
    metrics.frames_out.inc()  # the ack, or the error: the frame a producer would be sent
    if isinstance(error, FrameRejected):  # the id is another producer's message in progress
        metrics.errors.labels(error.code.value).inc()
        return answer_of([], [error_frame(error).encode()]), frozenset((error.code.value,))
    if error is not None:
        raise error
    metrics.completed.inc()
    metrics.final_to_delivery.observe(loop_time() - now)
    ack = acks_frame([(channel, message_id, False)], batch=False)
    return answer_of([ack.encode()], []), frozenset()
