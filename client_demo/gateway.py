"""Play a model gateway: stream canned replies token by token into a relay channel."""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import dataclass

from websockets.asyncio.client import ClientConnection

__all__ = ["REPLIES", "Reply", "stream_replies", "tokenize"]


@dataclass(frozen=True)
class Reply:
    """A canned model reply."""

    message_id: str
    text: str


REPLIES = (
    Reply(
        "reply-1",
        "A relay sits between a model gateway and the browser. It turns a stream of small "
        "deltas into the exact text the model wrote, and hands it to every chat window.",
    ),
    Reply(
        "reply-2",
        "Tokens arrive out of step: part of a word, a space, an emoji 🚀, or nothing at all. "
        "Only the concatenation matters, so empty deltas still count.",
    ),
    Reply(
        "reply-3",
        "Finalizing twice is harmless: the relay acknowledges both finals but broadcasts the "
        "completed message only once.",
    ),
)

_TOKEN = re.compile(r"\s*\S{1,4}|\s+")


def tokenize(text: str) -> list[str]:
    """Split text into token-sized pieces (a few characters each) that join back exactly."""
    return _TOKEN.findall(text)


async def stream_replies(
    producer: ClientConnection,
    replies: tuple[Reply, ...] = REPLIES,
    *,
    pace: tuple[float, float] = (0.01, 0.05),
    seed: int | None = None,
) -> None:
    """Stream every reply at once, interleaved, with a random pause between tokens."""
    rng = random.Random(seed)

    async def stream(reply: Reply) -> None:
        # Gateways often open with an empty delta; it creates the message and adds nothing.
        await producer.send(json.dumps({"id": reply.message_id, "delta": ""}))
        for token in tokenize(reply.text):
            await producer.send(json.dumps({"id": reply.message_id, "delta": token}))
            await asyncio.sleep(rng.uniform(*pace))
        # A retried final is harmless: it is acknowledged again but never re-broadcast.
        for _ in range(2):
            await producer.send(json.dumps({"id": reply.message_id, "final": True}))

    await asyncio.gather(*(stream(reply) for reply in replies))
