"""Play a model gateway: stream replies token by token into a relay channel, and stop on cancel.

A plain reply is text, sent as deltas. A structured one is what a model with tools streams:
a step, its reasoning, a tool call whose input streams as JSON text and whose output follows,
then its text. The gateway sends the step, the reasoning and the tool call as AI SDK chunks
(``RelayProducer.send_chunk``) and the text as plain deltas, which extend the message's
implicit text part: the completed message's ``text`` is that text, and its ``parts`` are all
four.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import dataclass
from typing import Any

from token_relay.client import RelayProducer, RelaySubscriber
from token_relay.core.protocol import MessageFrame

__all__ = [
    "REPLIES",
    "DemoGateway",
    "Reply",
    "ToolCall",
    "compose_answer",
    "compose_reply",
    "structured_chunks",
    "tokenize",
]


@dataclass(frozen=True)
class ToolCall:
    """A tool call of a structured reply: its input streams as JSON text, its output follows."""

    tool_call_id: str
    name: str
    input: dict[str, Any]
    output: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """A canned model reply: text, and for a structured one reasoning and a tool call first."""

    message_id: str
    text: str
    reasoning: str = ""
    tool: ToolCall | None = None

    @property
    def structured(self) -> bool:
        """Whether it has parts beyond its text."""
        return bool(self.reasoning) or self.tool is not None


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
    Reply(
        "reply-4",
        "It is 21 °C and sunny in Paris: no umbrella today.",
        reasoning="The user asks about the weather in Paris. I should look it up, not guess.",
        tool=ToolCall("call-1", "weather", {"city": "Paris"}, {"celsius": 21, "sky": "sunny"}),
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


def compose_reply(message_id: str, prompt: str) -> Reply:
    """The reply to a prompt: one that asks about the weather gets reasoning and a call of
    the ``weather`` tool before its text; any other a plain, longish answer."""
    if "weather" not in prompt.lower():
        return Reply(message_id, compose_answer(prompt))
    city = "Paris"
    return Reply(
        message_id,
        f"It is 21 °C and sunny in {city}, says the weather tool. " + compose_answer(prompt),
        reasoning=f"The user asks about the weather. I will call the weather tool for {city}.",
        tool=ToolCall(f"call-{message_id}", "weather", {"city": city}, {"celsius": 21}),
    )


def structured_chunks(reply: Reply) -> list[dict[str, Any]]:
    """The AI SDK chunks of a structured reply before its text: a step, its reasoning in
    tokens, and its tool call (the input's JSON text in tokens, the input, the output)."""
    chunks: list[dict[str, Any]] = [{"type": "start-step"}]
    if reply.reasoning:
        chunks.append({"type": "reasoning-start", "id": "reasoning-1"})
        chunks += [
            {"type": "reasoning-delta", "id": "reasoning-1", "delta": token}
            for token in tokenize(reply.reasoning)
        ]
        chunks.append({"type": "reasoning-end", "id": "reasoning-1"})
    if reply.tool is not None:
        call = {"toolCallId": reply.tool.tool_call_id}
        named = {**call, "toolName": reply.tool.name}
        chunks.append({"type": "tool-input-start", **named})
        chunks += [
            {"type": "tool-input-delta", **call, "inputTextDelta": token}
            for token in tokenize(json.dumps(reply.tool.input))
        ]
        chunks.append({"type": "tool-input-available", **named, "input": reply.tool.input})
        chunks.append({"type": "tool-output-available", **call, "output": reply.tool.output})
    return chunks


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
        if reply.structured:
            for chunk in structured_chunks(reply):
                if reply.message_id in self.cancelled:
                    await self.producer.finish(reply.message_id, channel=channel)
                    return False
                await self.producer.send_chunk(reply.message_id, chunk, channel=channel)
                await asyncio.sleep(self.rng.uniform(*self.pace))
        else:
            # Gateways often open with an empty delta: it creates the message, adds nothing.
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
            reply = compose_reply(f"re-{frame.id}", frame.text)
            task = asyncio.create_task(self.stream(reply, channel))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
