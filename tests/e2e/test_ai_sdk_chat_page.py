"""The chat app tutorial's recipe, run as printed in real Chromium: its page
(``client_demo/integrations/nextjs_chat_page.tsx``, React and ``useChat`` of ``@ai-sdk/react``
4 on ``ai`` 7) type-checked strictly and built by Vite in StrictMode, and its route
(``client_demo/integrations/nextjs_produce_route.ts``) served by a small Node server as
Next.js calls it, against a relay on another origin. A reply is sent and streams in; a reload
in the middle resumes it to its exact end; Stop stops the reply and the route aborts its
model, on a reply streamed from the start and on one resumed after a reload; and a reload
restores the chat's replies from the relay's history. The same page runs against recipe 2,
the FastAPI gateway (``client_demo/integrations/fastapi_app.py``, served by uvicorn): send,
resume, Stop that closes its model, history."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Page, Response
from websockets.asyncio.client import ClientConnection

from ..conftest import RunningRelay, recv_json, start_relay
from ..harness import eventually, free_port

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[2]
APP_FILES = ROOT / "tests" / "js" / "chat-app"
PAGE = ROOT / "client_demo" / "integrations" / "nextjs_chat_page.tsx"
ROUTE = ROOT / "client_demo" / "integrations" / "nextjs_produce_route.ts"
FASTAPI_APP = ROOT / "client_demo" / "integrations" / "fastapi_app.py"
CHAT_APP = ROOT / "docs" / "tutorials" / "chat-app.md"

WHOLE = "".join(f"word{n} " for n in range(40))
"""The reply the route's model writes, whole."""
ABORTED = "model: aborted"
"""What the route's model logs when the route aborts it."""


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, **(env or {})}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def chat_relay() -> AsyncIterator[RunningRelay]:
    running, relay = await start_relay()
    async with relay:
        yield running


def _http(running: RunningRelay) -> str:
    return running.url.replace("ws://", "http://")


@pytest.fixture(scope="module")
def chat_app(chat_relay: RunningRelay, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The app, built once: the page as ``src/chat.tsx`` beside the test's entry (which renders
    it in StrictMode), type-checked with ``tsc --strict`` and bundled by Vite with the relay's
    URL built in; the route as ``app/api/chat/route.ts``, type-checked strictly and compiled
    for Node. The packages are pinned by the lockfile of tests/js/chat-app (``npm ci``, from
    npm's cache when it holds them)."""
    npm = shutil.which("npm")
    assert npm is not None, "these tests need Node and npm (scripts/test installs nodejs)"
    app = tmp_path_factory.mktemp("chat-app")
    shutil.copytree(APP_FILES, app, dirs_exist_ok=True, ignore=shutil.ignore_patterns("node_*"))
    shutil.copy(PAGE, app / "src" / "chat.tsx")
    (app / "app" / "api" / "chat").mkdir(parents=True)
    shutil.copy(ROUTE, app / "app" / "api" / "chat" / "route.ts")
    _run([npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"], app)
    tsc = str(app / "node_modules" / ".bin" / "tsc")
    _run([tsc, "-p", "tsconfig.json"], app)
    _run([tsc, "-p", "tsconfig.route.json"], app)
    vite = str(app / "node_modules" / ".bin" / "vite")
    _run([vite, "build"], app, {"NEXT_PUBLIC_RELAY_URL": _http(chat_relay)})
    return app


@dataclass
class AppServer:
    """The app's Node server: its URL, and the lines its route logged."""

    url: str
    logs: list[str] = field(default_factory=list)


@pytest_asyncio.fixture(loop_scope="module")
async def app_server(chat_app: Path, chat_relay: RunningRelay) -> AsyncIterator[AppServer]:
    async with _app_server(chat_app, chat_app / "build" / "route.js", chat_relay) as server:
        yield server


@asynccontextmanager
async def _app_server(
    chat_app: Path, route: Path, chat_relay: RunningRelay, **env: str
) -> AsyncIterator[AppServer]:
    """The app's Node server, with ``route`` as its ``/api/chat``."""
    node = await asyncio.create_subprocess_exec(
        "node", "server.mjs", str(route), str(chat_app / "dist"),
        cwd=chat_app, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "RELAY_URL": _http(chat_relay), **env},
    )  # fmt: skip
    assert node.stdout is not None
    try:
        first = await asyncio.wait_for(node.stdout.readline(), 30)
        server = AppServer(f"http://127.0.0.1:{json.loads(first)['port']}")

        async def read_logs() -> None:
            assert node.stdout is not None
            async for line in node.stdout:
                server.logs.append(line.decode().rstrip("\n"))

        reading = asyncio.ensure_future(read_logs())
        yield server
        reading.cancel()
    finally:
        node.kill()
        await node.wait()


async def _shown(page: Page) -> list[Any]:
    """The page's messages: each one's id, role, and its text parts with their states."""
    return await page.evaluate(
        """[...document.querySelectorAll("li")].map((li) => [
            li.dataset.id, li.dataset.role,
            [...li.querySelectorAll("span")].map((s) => [s.textContent, s.dataset.state]),
        ])"""
    )


async def _send(page: Page, text: str) -> str:
    """Send ``text``; wait for the reply to stream in; its id."""
    before = len(await page.query_selector_all('li[data-role="assistant"]'))
    await page.fill("input", text)
    await page.click('button[type="submit"]')
    reply = page.locator('li[data-role="assistant"]').nth(before)
    await reply.locator('span[data-state="streaming"]').wait_for()
    reply_id = await reply.get_attribute("data-id")
    assert reply_id is not None
    return reply_id


async def _ended(watcher: ClientConnection) -> dict[str, Any]:
    """The next ``message`` or ``aborted`` frame of the watched channel."""
    while True:
        frame = await recv_json(watcher, 15)
        if frame["type"] in ("message", "aborted"):
            return frame


async def _reload(page: Page, chat: str) -> Response:
    """Reload the page; the relay's answer to its resume."""
    async with page.expect_response(
        lambda response: response.url.endswith(f"/ai-sdk/{chat}/stream")
    ) as resumed:
        await page.reload()
    return await resumed.value


async def test_the_recipe_sends_resumes_stops_and_restores_a_chat(
    chat_relay: RunningRelay, app_server: AppServer, page: Page
) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    chat = "chat-1"
    async with chat_relay.connect(f"/subscribe?channel={chat}") as watcher:
        assert (await recv_json(watcher))["type"] == "subscribed"
        # A new chat: no history, nothing to resume (204).
        async with page.expect_response(
            lambda response: response.url.endswith(f"/ai-sdk/{chat}/stream")
        ) as resumed:
            await page.goto(f"{app_server.url}/?chat={chat}")
        assert (await resumed.value).status == 204
        await page.wait_for_selector('main[data-status="ready"]')
        assert await _shown(page) == []

        # Send: the reply streams in, under the relay's id.
        first = await _send(page, "Hello")
        assert [m for _, _, m in chat_relay.relay.owned_messages()] == [first]
        # Reload in the middle: the page resumes the reply from the relay, to its exact end.
        resumed = await _reload(page, chat)
        assert resumed.status == 200
        await page.wait_for_selector('main[data-status="streaming"]')
        [[shown_id, role, [(text, state)]]] = await _shown(page)
        assert (shown_id, role, state) == (first, "assistant", "streaming")
        assert WHOLE.startswith(text) and text != WHOLE
        await resumed.finished()
        await page.wait_for_selector('main[data-status="ready"]')
        frame = await _ended(watcher)
        assert (frame["type"], frame["id"], frame["text"]) == ("message", first, WHOLE)
        await page.wait_for_selector(f'li[data-id="{first}"] span[data-state="done"]')
        assert await _shown(page) == [[first, "assistant", [[WHOLE, "done"]]]]

        # Send again and press Stop: the relay ends the reply, and the route aborts its model.
        second = await _send(page, "And then?")
        await page.click('button:text("Stop")')
        frame = await _ended(watcher)
        assert (frame["type"], frame["id"], frame["reason"]) == ("aborted", second, "cancelled")
        stopped = frame["text"]
        assert WHOLE.startswith(stopped) and len(stopped) < len(WHOLE)
        await eventually(lambda: app_server.logs == [ABORTED], 10, what="the model's abort")
        await page.wait_for_selector('main[data-status="ready"]')
        # The page keeps the reply as far as it got; the user's messages are there until a
        # reload, which restores the replies only.
        [one, (_, *asked), (shown_id, role, [(text, state)])] = await _shown(page)
        assert one == [first, "assistant", [[WHOLE, "done"]]]
        assert asked == ["user", [["And then?", None]]]
        assert (shown_id, role, state) == (second, "assistant", "streaming")
        assert stopped.startswith(text)

        # Reload: the chat's replies come back from the relay's history; the stopped one, the
        # newest, is served again by the resume, and replaces itself.
        resumed = await _reload(page, chat)
        assert resumed.status == 200
        await resumed.finished()
        await page.wait_for_selector('main[data-status="ready"]')
        restored = [
            [first, "assistant", [[WHOLE, "done"]]],
            [second, "assistant", [[stopped, "streaming"]]],
        ]
        assert await _shown(page) == restored

        # A reply resumed after a reload stops too.
        third = await _send(page, "Once more")
        assert (await _reload(page, chat)).status == 200
        stop = page.locator('button:text("Stop")')
        await stop.wait_for()
        assert await page.get_attribute("li:last-child", "data-id") == third
        await stop.click()
        frame = await _ended(watcher)
        assert (frame["type"], frame["id"], frame["reason"]) == ("aborted", third, "cancelled")
        assert WHOLE.startswith(frame["text"]) and len(frame["text"]) < len(WHOLE)
        await eventually(lambda: app_server.logs == [ABORTED] * 2, 10, what="the model's abort")
        await page.wait_for_selector('main[data-status="ready"]')
        [*_, (shown_id, _, [(text, state)])] = await _shown(page)
        assert (shown_id, state) == (third, "streaming") and frame["text"].startswith(text)
    assert errors == []
    # The tutorial shows the page that ran here.
    assert '--8<-- "client_demo/integrations/nextjs_chat_page.tsx"' in CHAT_APP.read_text()


@asynccontextmanager
async def _fastapi_app(chat_relay: RunningRelay) -> AsyncIterator[tuple[str, list[str]]]:
    """Recipe 2's FastAPI app, as it is, served by uvicorn: its URL, and what it printed."""
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "uvicorn", "fastapi_app:app", "--app-dir", str(FASTAPI_APP.parent),
        "--port", str(port), "--log-level", "warning",
        stdout=asyncio.subprocess.PIPE, env={**os.environ, "RELAY_URL": _http(chat_relay)},
    )  # fmt: skip
    printed: list[str] = []

    async def read() -> None:
        assert server.stdout is not None
        async for line in server.stdout:
            printed.append(line.decode().rstrip("\n"))

    async def listening() -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        return True

    reading = asyncio.ensure_future(read())
    try:
        await eventually(listening, 30, what="uvicorn listening")
        yield f"http://127.0.0.1:{port}", printed
    finally:
        server.terminate()
        await server.wait()
        reading.cancel()


async def test_the_recipe_page_on_the_fastapi_gateway_resumes_stops_its_model_and_restores(
    chat_relay: RunningRelay, chat_app: Path, page: Page
) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    chat = "chat-fastapi"
    question = " ".join(f"word{n}" for n in range(200))
    whole = f"You said: {question} "  # what the app's stand-in model writes, word by word
    proxy = APP_FILES / "fastapi_route.mjs"
    async with (
        _fastapi_app(chat_relay) as (fastapi_url, printed),
        _app_server(chat_app, chat_app / proxy.name, chat_relay, FASTAPI_URL=fastapi_url) as app,
        chat_relay.connect(f"/subscribe?channel={chat}") as watcher,
    ):
        assert (await recv_json(watcher))["type"] == "subscribed"
        await page.goto(f"{app.url}/?chat={chat}")
        await page.wait_for_selector('main[data-status="ready"]')

        # Send, and reload in the middle: the page resumes the reply to its exact end.
        first = await _send(page, question)
        resumed = await _reload(page, chat)
        assert resumed.status == 200
        await resumed.finished()
        frame = await _ended(watcher)
        assert (frame["type"], frame["id"], frame["text"]) == ("message", first, whole)
        await page.wait_for_selector(f'li[data-id="{first}"] span[data-state="done"]')
        assert await _shown(page) == [[first, "assistant", [[whole, "done"]]]]

        # Stop: the relay ends the reply cancelled, and the app closes its model.
        second = await _send(page, question)
        await page.click('button:text("Stop")')
        frame = await _ended(watcher)
        assert (frame["type"], frame["id"], frame["reason"]) == ("aborted", second, "cancelled")
        stopped = frame["text"]
        assert whole.startswith(stopped) and len(stopped) < len(whole)
        await eventually(
            lambda: printed == ["model: stopped (2 messages)"], 10, what="the model's stop"
        )
        await page.wait_for_selector('main[data-status="ready"]')

        # Reload: the replies come back from the relay's history.
        await (await _reload(page, chat)).finished()
        await page.wait_for_selector('main[data-status="ready"]')
        assert await _shown(page) == [
            [first, "assistant", [[whole, "done"]]],
            [second, "assistant", [[stopped, "streaming"]]],
        ]
    assert errors == []
    assert '--8<-- "client_demo/integrations/fastapi_app.py"' in CHAT_APP.read_text()
