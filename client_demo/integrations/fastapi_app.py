# app.py: the chat endpoint useChat posts to, in FastAPI. It starts the model, whose reply
# goes to the relay as it is generated, and answers with the relay's stream of it.
import asyncio
import os
import uuid
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from token_relay.client import RelayProducer

RELAY = os.environ.get("RELAY_URL", "http://127.0.0.1:8765")
app = FastAPI()
replies: set[asyncio.Task[None]] = set()


@app.post("/api/chat")
async def chat(request: Request) -> StreamingResponse:
    body = await request.json()
    chat_id, reply_id = body["id"], str(uuid.uuid4())
    reply = asyncio.create_task(generate(chat_id, reply_id, body["messages"]))
    replies.add(reply)
    reply.add_done_callback(replies.discard)
    client = httpx.AsyncClient(timeout=None)
    url = f"{RELAY}/ai-sdk/{chat_id}/stream"
    ask = client.build_request("GET", url, params={"wait": 10, "id": reply_id})
    relay = await client.send(ask, stream=True)
    headers = {k: v for k, v in relay.headers.items() if k.startswith(("content-type", "x-"))}
    return StreamingResponse(
        relay.aiter_raw(), relay.status_code, headers, background=BackgroundTask(client.aclose)
    )


async def generate(chat_id: str, reply_id: str, messages: list[object]) -> None:
    async with RelayProducer(RELAY.replace("http", "ws", 1), channel=chat_id) as producer:
        async for token in model(messages):
            await producer.send(reply_id, token)
        await producer.finish(reply_id)


async def model(messages: list[object]) -> AsyncIterator[str]:
    """Stands in for your model client."""
    for token in ["Hello", " from", " the", " relay", f" ({len(messages)} messages)"]:
        yield token
