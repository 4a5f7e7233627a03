# app.py: the chat endpoint useChat posts to, in FastAPI. It starts the model, whose reply
# goes to the relay as it is generated, and answers with the relay's stream of it. A Stop of
# the reply (POST /ai-sdk/CHAT/stop?id=REPLY on the relay, from any page) stops the model.
import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncGenerator
from typing import Any

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


async def generate(chat_id: str, reply_id: str, messages: list[Any]) -> None:
    async with RelayProducer(RELAY.replace("http", "ws", 1), channel=chat_id) as producer:
        stop = producer.stop_requested(reply_id)  # set when a Stop of this reply comes
        async with contextlib.aclosing(model(messages)) as tokens:  # closing it stops the model
            async for token in tokens:
                if stop.is_set():
                    await producer.abort(reply_id)  # the reply ends "cancelled"
                    return
                await producer.send(reply_id, token)
        await producer.finish(reply_id)


async def model(messages: list[Any]) -> AsyncGenerator[str, None]:
    """Stands in for your model client: it echoes the last message, word by word."""
    text = "".join(part.get("text", "") for part in messages[-1]["parts"])
    try:
        for word in f"You said: {text}".split(" "):
            yield word + " "
            await asyncio.sleep(0.05)  # a model's pace
    except GeneratorExit:  # closed before its end: a real client closes its request here
        print(f"model: stopped ({len(messages)} messages)", flush=True)
        raise
