# openai_gateway.py: the gateway of a chat whose page uses the AI SDK's WebSocketChatTransport
# on ws://RELAY/ai-sdk/ws, answered by an OpenAI model. The relay hands it each message sent;
# it asks the model with the chat so far, and forwards the model's stream as the reply (text,
# reasoning and tool calls as parts; usage and the finish reason as its metadata). Stop on any
# page closes the model's stream, so the model stops, and the reply ends cancelled. A request
# the model refuses ends as an error the page shows.
import asyncio
import os

from openai import AsyncOpenAI
from token_relay.client import RelayProducer, openai_messages
from token_relay.core.protocol import ChatRequest

RELAY = os.environ.get("RELAY_URL", "ws://127.0.0.1:8765")
CHAT = os.environ.get("CHAT_ID", "chat-42")
MODEL = os.environ.get("OPENAI_MODEL", "gpt-4.1-mini")
client = AsyncOpenAI()  # OPENAI_API_KEY (and OPENAI_BASE_URL) from the environment


async def answer(relay: RelayProducer, request: ChatRequest) -> None:
    try:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=openai_messages(request.messages),
            stream=True,
            stream_options={"include_usage": True},
        )
    except Exception as error:  # the model refused it: the page shows why
        await relay.fail(request.id, str(error), channel=request.channel)
        return
    await relay.forward(stream, id=request.id, channel=request.channel)


async def main() -> None:
    async with RelayProducer(RELAY, channel=CHAT) as relay:
        replies: set[asyncio.Task[None]] = set()
        async for request in relay.requests():  # a task each: several chats at once
            reply = asyncio.create_task(answer(relay, request))
            replies.add(reply)
            reply.add_done_callback(replies.discard)


asyncio.run(main())
