"""Play a model gateway: stream replies token by token into a relay channel, and stop on cancel."""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass

from token_relay.client import RelayProducer, RelaySubscriber
from token_relay.core.protocol import MessageFrame

__all__ = ["REPLIES", "DemoGateway", "Reply", "compose_answer", "tokenize"]


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
        "Sequence numbers make resending safe: after a dropped connection the gateway sends "
        "again what was not acknowledged, and the relay keeps each token exactly once.",
    ),
)

_TOKEN = re.compile(r"\s*\S{1,4}|\s+")


def tokenize(text: str) -> list[str]:
    """Split text into token-sized pieces (a few characters each) that join back exactly."""
    return _TOKEN.findall(text)


def compose_answer(prompt: str) -> str:
    """A canned, longish answer to a prompt, so there is time to watch it or stop it."""
    return (
        f"You asked: “{prompt.strip()[:200]}”. I am the demo gateway, so I can't think, but "
        "I can stream. Each of these words left me as a separate delta frame; the relay "
        "appended them in order and forwarded each one to your browser as it arrived. If "
        "your connection drops now, the page reconnects, tells the relay how many characters "
        "it already shows, and gets only the rest. When I finish, the relay sends the "
        "completed text once, and the page swaps in that exact text. Press Stop to cancel "
        "me: the relay routes your cancel to this gateway, which stops generating and "
        "finalizes what it has."
    )


class DemoGateway:
    """A fake model gateway, streaming through :class:`token_relay.client.RelayProducer`."""

    def __init__(
        self,
        producer: RelayProducer,
        *,
        pace: tuple[float, float] = (0.01, 0.05),
        seed: int | None = None,
    ) -> None:
        self.producer = producer
        self.pace = pace
        self.rng = random.Random(seed)
        self.cancelled: set[str] = set()

    async def watch_cancels(self) -> None:
        """Note every cancel a subscriber sends (a user pressed Stop)."""
        async for cancel in self.producer.cancellations():
            self.cancelled.add(cancel.id)

    async def stream(self, reply: Reply, channel: str | None = None) -> bool:
        """Stream one reply; returns False if it was cancelled part way."""
        finished = True
        # Gateways often open with an empty delta; it creates the message and adds nothing.
        await self.producer.send(reply.message_id, "", channel=channel)
        for token in tokenize(reply.text):
            if reply.message_id in self.cancelled:
                finished = False
                break
            await self.producer.send(reply.message_id, token, channel=channel)
            await asyncio.sleep(self.rng.uniform(*self.pace))
        await self.producer.finish(reply.message_id, channel=channel)
        return finished

    async def stream_all(self, replies: tuple[Reply, ...] = REPLIES) -> None:
        """Stream every reply at once, interleaved on this one connection."""
        await asyncio.gather(*(self.stream(reply) for reply in replies))

    async def answer_prompts(self, prompts: RelaySubscriber, channel: str) -> None:
        """Answer each prompt message arriving on ``prompts`` with a reply on ``channel``."""
        tasks: set[asyncio.Task[bool]] = set()
        async for frame in prompts:
            if not isinstance(frame, MessageFrame):
                continue
            reply = Reply(f"re-{frame.id}", compose_answer(frame.text))
            task = asyncio.create_task(self.stream(reply, channel))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
