"""The chat-app tutorial's OpenAI gateway (client_demo/integrations/openai_gateway.py), run
as it is, with the real ``openai`` SDK reading the local provider, answering a page on
``useChat`` with the AI SDK's ``WebSocketChatTransport`` in headless Chromium: send shows the
provider's exact reply, with the relay's parts and metadata; a reload mid-reply resumes it
exactly; Stop closes the provider's stream and ends the reply cancelled; a reload restores
the chat's replies from the relay's history."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Page
from websockets.asyncio.client import connect

from ..conftest import RunningRelay, recv_json, start_relay
from ..harness import eventually
from ..harness.providers import GATED, HELD, REFUSAL, REFUSED, TEXT_REPLY, TEXT_USAGE, Provider
from .test_ai_sdk_ws import _ended, _node, takes_requests

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "client_demo" / "integrations" / "openai_gateway.py"
CHAT_APP = ROOT / "docs" / "tutorials" / "chat-app.md"
QUESTION = "What is the weather in Paris?"  # what the page sends


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    served = Provider()
    try:
        yield served
    finally:
        served.close()


@pytest_asyncio.fixture(loop_scope="module")
async def running(chat_page: Path) -> AsyncIterator[RunningRelay]:
    relay, server = await start_relay(web_root=str(chat_page))
    async with server:
        yield relay


async def _messages(page: Page) -> Any:
    return await page.evaluate("JSON.parse(JSON.stringify(window.chat.messages))")


async def _replying(page: Page, text: str) -> str:
    """Wait until the page's last message is a reply holding ``text``; its id."""
    await page.wait_for_function(
        "(text) => { const m = window.chat?.messages.at(-1); return m?.role === 'assistant'"
        " && m.parts.some((p) => p.type === 'text' && p.text === text); }",
        arg=text,
    )
    reply: str = await page.evaluate("window.chat.messages.at(-1).id")
    return reply


async def _settled(page: Page, count: int) -> None:
    """Wait until the page is ready again, holding ``count`` messages."""
    await page.wait_for_function(
        "(count) => window.chat?.status === 'ready' && window.chat.messages.length === count",
        arg=count,
    )


async def test_the_openai_gateway_recipe_sends_resumes_stops_and_restores_a_chat(
    running: RunningRelay, provider: Provider, page: Page
) -> None:
    assert '--8<-- "client_demo/integrations/openai_gateway.py"' in CHAT_APP.read_text()
    chat, whole = "openai-chat", "".join(TEXT_REPLY)
    held = "".join(TEXT_REPLY[: HELD - 1])  # the gated reply's text before it is held
    environment = {
        **os.environ,
        "RELAY_URL": running.url,
        "CHAT_ID": chat,
        "OPENAI_BASE_URL": provider.base_url,
        "OPENAI_API_KEY": "sk-local",
        "OPENAI_MODEL": GATED,
    }
    gateway = await asyncio.create_subprocess_exec(sys.executable, str(RECIPE), env=environment)
    try:
        async with connect(f"{running.url}/subscribe?channel={chat}") as sub:
            assert (await recv_json(sub))["type"] == "subscribed"
            await eventually(lambda: takes_requests(running, chat), 30)
            http = running.url.replace("ws://", "http://")
            await page.goto(f"{http}/index.html?chat={chat}")
            await page.wait_for_selector('#status[data-status="ready"]')

            # Send: the page shows the provider's reply exactly, as the relay stored it.
            provider.go_on.set()
            await page.click("#send")
            first = await _ended(sub)
            await _settled(page, 2)
            question, answer = await _messages(page)
            assert (question["role"], question["parts"][0]["text"]) == ("user", QUESTION)
            assert provider.requests[-1].body["messages"] == [{"role": "user", "content": QUESTION}]
            assert first["type"] == "message"
            assert (answer["id"], answer["parts"]) == (first["id"], first["parts"])
            assert [p["text"] for p in answer["parts"] if p["type"] == "text"] == [whole]
            assert answer["metadata"] == first["meta"]
            assert first["meta"]["finishReason"] == "stop"
            assert first["meta"]["usage"] == TEXT_USAGE

            # Reload mid-reply: the page resumes the reply and ends with it exactly.
            provider.go_on.clear()
            await page.click("#send")
            second_id = await _replying(page, held)
            # The model got the chat so far: the first reply's text is the assistant's.
            assert provider.requests[-1].body["messages"] == [
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": whole},
                {"role": "user", "content": QUESTION},
            ]
            await page.reload()
            # History restored the first reply; resume brought the second back, in progress.
            assert await _replying(page, held) == second_id
            provider.go_on.set()
            second = await _ended(sub)
            await _settled(page, 2)
            restored, resumed = await _messages(page)
            assert (restored["id"], restored["parts"]) == (first["id"], first["parts"])
            assert (second["type"], second["id"]) == ("message", second_id)
            assert (resumed["id"], resumed["parts"]) == (second_id, second["parts"])
            assert [p["text"] for p in resumed["parts"] if p["type"] == "text"] == [whole]
            assert resumed["metadata"] == second["meta"]

            # Stop mid-reply: the provider's stream is closed early, the reply ends cancelled.
            provider.go_on.clear()
            await page.click("#send")
            third_id = await _replying(page, held)
            await page.click("#stop")
            upstream = provider.requests[-1]
            assert await asyncio.to_thread(upstream.closed_early.wait, 30)
            third = await _ended(sub)
            assert (third["type"], third["id"], third["reason"]) == (
                "aborted",
                third_id,
                "cancelled",
            )
            assert not upstream.finished
            await _settled(page, 4)
            stopped = (await _messages(page))[-1]
            assert [p["text"] for p in stopped["parts"] if p["type"] == "text"] == [held]

            # Reload after: the chat's replies come back from the relay's history, exactly.
            await page.reload()
            await page.wait_for_selector('#status[data-status="ready"]')
            replies = await _messages(page)
            assert [m["id"] for m in replies] == [first["id"], second_id, third_id]
            assert [m["parts"] for m in replies] == [
                first["parts"],
                second["parts"],
                third["parts"],
            ]
            assert [m.get("metadata") for m in replies[:2]] == [first["meta"], second["meta"]]
    finally:
        gateway.kill()
        await gateway.wait()


async def test_a_request_the_model_refuses_ends_as_its_error(
    running: RunningRelay, provider: Provider, js_clients: Path
) -> None:
    chat = "refused-chat"
    environment = {
        **os.environ,
        "RELAY_URL": running.url,
        "CHAT_ID": chat,
        "OPENAI_BASE_URL": provider.base_url,
        "OPENAI_API_KEY": "sk-local",
        "OPENAI_MODEL": REFUSED,
        "OPENAI_MAX_RETRIES": "0",
    }
    gateway = await asyncio.create_subprocess_exec(sys.executable, str(RECIPE), env=environment)
    try:
        async with connect(f"{running.url}/subscribe?channel={chat}") as sub:
            assert (await recv_json(sub))["type"] == "subscribed"
            await eventually(lambda: takes_requests(running, chat), 30)
            held = await _node(js_clients, "send", running.url + "/ai-sdk/ws", chat)
            ended = await _ended(sub)
    finally:
        gateway.kill()
        await gateway.wait()
    assert (ended["type"], ended["reason"]) == ("aborted", "error")
    assert REFUSAL in ended["meta"]["errorText"]
    # The chat gets the reply's start, then its error (whose errorText is the meta's).
    assert held["ok"] and held["id"] == ended["id"], held
    assert held["chunks"] == ["start", "error"]
