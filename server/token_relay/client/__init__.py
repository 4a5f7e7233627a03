"""Python clients for token-relay: ``RelayProducer`` for gateways, ``RelaySubscriber`` for apps.

A gateway streams text and never thinks about the network::

    async with RelayProducer("ws://127.0.0.1:8765", channel="chat-42", token=token) as relay:
        async for token in model.stream(prompt):
            await relay.send("reply-7", token)
        await relay.finish("reply-7")

The producer numbers every event (``seq``, per message), keeps the events of
each unfinished message until its final is acknowledged (at most
``max_unacked`` events; ``send`` waits for room beyond that), reconnects with
exponential backoff and jitter when the connection drops, resumes its relay
session, and sends again everything not yet acknowledged. The relay drops what
it already applied, so each reply's text comes out exactly once. A structured
reply (reasoning, tool calls, sources, data) goes as AI SDK chunks with
``send_chunk``, numbered and resent the same way. ``forward`` takes an ``openai`` or
``anthropic`` SDK stream as it is (:mod:`token_relay.client.forward`), and closes it when
a subscriber presses Stop.
``openai_messages`` turns a chat request's ``UIMessage``\\ s into the model's messages
(:mod:`token_relay.client.ui_messages`).

A subscriber iterates over typed frames, reconnecting and resuming by offset
and positions, and never yields the same completed message twice::

    async with RelaySubscriber("ws://127.0.0.1:8765", ["chat-42"]) as feed:
        async for frame in feed:
            ...  # Subscribed, Snapshot, DeltaFrame, MessageFrame, Aborted, ErrorFrame
"""

from __future__ import annotations

from ..core.errors import MessageFailed, RelayProtocolError
from .producer import RelayProducer
from .subscriber import RelaySubscriber
from .ui_messages import openai_messages

__all__ = [
    "MessageFailed",
    "RelayProducer",
    "RelayProtocolError",
    "RelaySubscriber",
    "openai_messages",
]
