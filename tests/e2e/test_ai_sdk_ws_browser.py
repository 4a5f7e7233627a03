"""``useChat`` (``@ai-sdk/react`` 4, ``ai`` 7) with the AI SDK's ``WebSocketChatTransport`` on
``/ai-sdk/ws``, in real headless Chromium: a page built from tests/js/ws-chat-app (bundled by
esbuild, served by the relay's ``--web-root``) sends a message that a Python gateway answers
with a structured reply, and holds exactly the relay's parts; a reload mid-reply resumes it
exactly, with no message twice; Stop reaches the gateway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Page
from token_relay.client import RelayProducer
from token_relay.core.protocol import Cancel, ChatRequest
from websockets.asyncio.client import connect

from ..conftest import RunningRelay, recv_json, start_relay
from ..harness import eventually
from .test_ai_sdk_ws import STRUCTURED_HEAD, STRUCTURED_TAIL, _ended, _gateway, _until_stopped

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module")
async def running(chat_page: Path) -> AsyncIterator[RunningRelay]:
    relay, server = await start_relay(web_root=str(chat_page))
    async with server:
        yield relay


async def _open(page: Page, running: RunningRelay, chat: str) -> None:
    http = running.url.replace("ws://", "http://")
    await page.goto(f"{http}/index.html?chat={chat}")
    await page.wait_for_selector('#status[data-status="ready"]')


async def _messages(page: Page) -> Any:
    return await page.evaluate("JSON.parse(JSON.stringify(window.chat.messages))")


async def test_use_chat_sends_and_holds_exactly_the_relays_parts(
    running: RunningRelay, page: Page
) -> None:
    async def structured(producer: RelayProducer, request: ChatRequest) -> None:
        for chunk in [*STRUCTURED_HEAD, *STRUCTURED_TAIL]:
            await producer.send_chunk(request.id, chunk, channel=request.channel)
        await producer.finish(request.id, channel=request.channel)

    async with (
        _gateway(running, structured, "browser-1") as requests,
        connect(f"{running.url}/subscribe?channel=browser-1") as sub,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        await _open(page, running, "browser-1")
        await page.click("#send")
        relayed = await _ended(sub)
        await page.wait_for_function("window.chat?.status === 'ready'")
    question, answer = await _messages(page)
    assert question["role"] == "user" and requests[0].messages[-1]["id"] == question["id"]
    assert answer["id"] == relayed["id"]
    assert answer["parts"] == relayed["parts"]


async def test_a_reload_mid_reply_resumes_it_exactly(running: RunningRelay, page: Page) -> None:
    go_on = asyncio.Event()

    async def halfway(producer: RelayProducer, request: ChatRequest) -> None:
        for chunk in STRUCTURED_HEAD:
            await producer.send_chunk(request.id, chunk, channel=request.channel)
        await go_on.wait()
        for chunk in STRUCTURED_TAIL:
            await producer.send_chunk(request.id, chunk, channel=request.channel)
        await producer.finish(request.id, channel=request.channel)

    relay = running.relay
    async with (
        _gateway(running, halfway, "browser-2"),
        connect(f"{running.url}/subscribe?channel=browser-2") as sub,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        await _open(page, running, "browser-2")
        await page.click("#send")
        await page.wait_for_function(
            "window.chat?.messages.at(-1)?.parts.some((p) => p.type === 'tool-weather')"
        )
        await page.reload()
        # The reloaded page resumed: its socket joined the channel (with the subscriber's).
        await eventually(lambda: len(relay.hub.subscribers("browser-2")) == 2, timeout=30)
        go_on.set()
        relayed = await _ended(sub)
        await page.wait_for_function(
            "window.chat?.status === 'ready' && window.chat.messages.length === 1"
            " && window.chat.messages[0].parts.some((p) => p.type === 'text' && p.state === 'done')"
        )
    (answer,) = await _messages(page)  # the reply once, never twice; the question is not kept
    assert answer["id"] == relayed["id"]
    assert answer["parts"] == relayed["parts"]


async def test_stop_reaches_the_gateway(running: RunningRelay, page: Page) -> None:
    cancelled: list[Cancel] = []
    stopped = asyncio.Event()

    endless = _until_stopped(cancelled, stopped, 0.01)

    async with (
        _gateway(running, endless, "browser-3") as requests,
        connect(f"{running.url}/subscribe?channel=browser-3") as sub,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        await _open(page, running, "browser-3")
        await page.click("#send")
        await page.wait_for_function("window.chat?.messages.at(-1)?.role === 'assistant'")
        await page.click("#stop")
        await asyncio.wait_for(stopped.wait(), 30)
        relayed = await _ended(sub)
    (cancel,) = cancelled
    assert (cancel.channel, cancel.id) == ("browser-3", requests[0].id)
    assert relayed["text"].count("word") < 2000
