# ws_gateway.py: the gateway of a chat whose page uses the AI SDK's WebSocketChatTransport on
# ws://RELAY/ai-sdk/ws. The relay hands it each message sent; it streams the reply back
# through the relay (the "model" here: reasoning, then an echo, word by word). Stop on any
# page reaches it as a cancel, and the reply ends there.
import asyncio
import os
from typing import Any

from token_relay.client import RelayProducer
from token_relay.core.protocol import ChatRequest

RELAY = os.environ.get("RELAY_URL", "ws://127.0.0.1:8765")
CHAT = os.environ.get("CHAT_ID", "chat-42")


def last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if message["role"] == "user":
            return "".join(p["text"] for p in message["parts"] if p["type"] == "text")
    return ""


async def answer(relay: RelayProducer, request: ChatRequest) -> None:
    reply, channel = request.id, request.channel
    try:
        await relay.send_chunk(reply, {"type": "reasoning-start", "id": "r"}, channel=channel)
        thought: dict[str, Any] = {"type": "reasoning-delta", "id": "r", "delta": "An echo."}
        await relay.send_chunk(reply, thought, channel=channel)
        await relay.send_chunk(reply, {"type": "reasoning-end", "id": "r"}, channel=channel)
        for word in f"You said: {last_user_text(request.messages)}".split(" "):
            await relay.send(reply, word + " ", channel=channel)
            await asyncio.sleep(0.05)  # a model's pace
    finally:  # done, or stopped: the reply ends either way
        await relay.finish(reply, channel=channel)


async def main() -> None:
    async with RelayProducer(RELAY, channel=CHAT) as relay:
        running: dict[str, asyncio.Task[None]] = {}

        async def stops() -> None:
            async for cancel in relay.cancellations():
                if cancel.id in running:
                    running[cancel.id].cancel()

        watching = asyncio.create_task(stops())
        async for request in relay.requests():
            task = running[request.id] = asyncio.create_task(answer(relay, request))
            task.add_done_callback(lambda done: running.pop(done.get_name(), None))
            task.set_name(request.id)
        watching.cancel()


asyncio.run(main())
