"""The npm package token-relay-client: its unit tests under ``node --test``, its type
declarations under ``tsc --strict``, and its packed tarball installed into a fresh Vite
React-TS app, type-checked, built, and run in Chromium against a relay through
``useRelayChannel`` in StrictMode."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Page
from token_relay.core.grants import Role
from token_relay.tokens import mint

from ..conftest import RunningRelay, recv_json, send_json, start_relay
from ..docs.blocks import docs_block
from ..harness import Proxy

pytestmark = pytest.mark.asyncio(loop_scope="module")

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "js"
APP_FILES = Path(__file__).resolve().parents[1] / "js" / "vite-app"
CREATE_VITE = "create-vite@9.3.0"
"""The scaffolder a new user runs (``npm create vite``), pinned so the app is reproducible."""


def _run(args: list[str], cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _npm() -> str:
    npm = shutil.which("npm")
    assert npm is not None, "these tests need Node and npm (scripts/test installs nodejs)"
    return npm


async def test_the_parts_sample_prints_what_the_page_shows(tmp_path: Path) -> None:
    """The browser client page's assembler sample, run by Node against the package."""
    node = shutil.which("node")
    assert node is not None
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "token-relay-client").symlink_to(PACKAGE)
    (tmp_path / "sample.mjs").write_text(docs_block("browser-client-parts-node"))
    printed = _run([node, "sample.mjs"], tmp_path)
    assert json.loads(printed) == json.loads(docs_block("browser-client-parts-output"))


async def test_the_unit_tests_pass_under_node_test() -> None:
    node = shutil.which("node")
    assert node is not None
    output = _run([node, "--test", "test/"], PACKAGE)
    passed = int(re.search(r"^# pass (\d+)", output, re.M).group(1))  # type: ignore[union-attr]
    failed = int(re.search(r"^# fail (\d+)", output, re.M).group(1))  # type: ignore[union-attr]
    assert failed == 0 and passed >= 20, output


async def test_the_declarations_type_check_strictly(js_clients: Path) -> None:
    tsc = js_clients / "node_modules" / ".bin" / "tsc"
    _run([str(tsc), "--noEmit", "--strict", "-p", "test/tsconfig.json"], PACKAGE)


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``npm pack`` of the package, as it would be published."""
    folder = tmp_path_factory.mktemp("pack")
    report = json.loads(
        _run([_npm(), "pack", "--json", "--pack-destination", str(folder)], PACKAGE)
    )
    return folder / report[0]["filename"]


async def test_the_tarball_holds_the_package_and_nothing_else(tarball: Path) -> None:
    with tarfile.open(tarball) as archive:
        names = sorted(archive.getnames())
    assert names == [
        "package/README.md",
        "package/package.json",
        "package/src/index.d.ts",
        "package/src/index.js",
        "package/src/parts.js",
        "package/src/react.d.ts",
        "package/src/react.js",
        "package/src/sse.js",
        "package/src/state.js",
    ]
    manifest = json.loads((PACKAGE / "package.json").read_text())
    assert manifest["name"] == "token-relay-client" and manifest["type"] == "module"
    assert "dependencies" not in manifest  # nothing at run time
    assert manifest["peerDependencies"] == {"react": ">=18"}
    assert set(manifest["exports"]) >= {".", "./react"}


@pytest.fixture(scope="module")
def vite_app(tarball: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh Vite React-TS app with the tarball installed and App.tsx using the hook, built
    by its own ``npm run build`` (``tsc -b && vite build``), with the documentation's React
    sample beside it. npm reaches the registry for Vite and React only."""
    npm = _npm()
    folder = tmp_path_factory.mktemp("vite")
    _run(
        [npm, "exec", "--yes", CREATE_VITE, "--", "app", "--template", "react-ts",
         "--no-interactive"],
        folder,
    )  # fmt: skip
    app = folder / "app"
    _run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error"], app)
    _run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error", str(tarball)], app)
    shutil.copy(APP_FILES / "App.tsx", app / "src" / "App.tsx")
    # The browser client page's React sample, as printed, type-checked and built with the app.
    (app / "src" / "DocsChat.tsx").write_text(docs_block("browser-client-react"))
    (app / "src" / "DocsParts.tsx").write_text(docs_block("browser-client-parts-react"))
    assert "<StrictMode>" in (app / "src" / "main.tsx").read_text()
    _run([npm, "run", "build"], app)
    return app / "dist"


@pytest_asyncio.fixture(loop_scope="module")
async def app_relay(vite_app: Path) -> AsyncIterator[tuple[RunningRelay, Any]]:
    running, server = await start_relay(web_root=str(vite_app))
    async with server:
        yield running, server


def _cut(server: Any) -> int:
    """Drop every subscriber connection with no goodbye, as a network would."""
    cut = 0
    for connection in list(server.server.connections):
        if connection.path.startswith(("/subscribe", "/sse")):
            connection.transport.abort()
            cut += 1
    return cut


@pytest.mark.parametrize("transport", ["websocket", "sse"])
async def test_a_built_react_app_shows_a_streamed_reply_through_the_hook(
    app_relay: tuple[RunningRelay, Any], page: Page, transport: str
) -> None:
    running, server = app_relay
    channel = f"react-{transport}"
    http = running.url.replace("ws://", "http://")
    async with running.connect(f"/produce?channel={channel}") as producer:
        await send_json(producer, {"id": "old", "delta": "from before the page", "final": True})
        assert (await recv_json(producer))["type"] == "ack"
        query = f"?channel={channel}" + ("&transport=sse" if transport == "sse" else "")
        await page.goto(f"{http}/{query}")
        await page.wait_for_selector('#status[data-status="live"]')
        # A fresh page rewinds: the message from before it opened is there.
        await page.wait_for_selector('li[data-id="old"][data-status="complete"]')

        pieces = ["Hel", "lo ", "from ", "Re", "act ", "⚛️", "!"]
        shown = ""
        for n, piece in enumerate(pieces):
            if n == 4:
                # A cut mid-reply; the reply goes on meanwhile.
                assert _cut(server) == 1
                await send_json(producer, {"id": "r", "delta": piece})
                shown += piece
                continue
            await send_json(producer, {"id": "r", "delta": piece})
            shown += piece
            await page.wait_for_function(
                """(text) => {
                    const item = document.querySelector('li[data-id="r"]');
                    return item && item.textContent === text && item.dataset.status === "streaming";
                }""",
                arg=shown,
            )
        await send_json(producer, {"id": "r", "final": True})
        assert (await recv_json(producer))["type"] == "ack"
    await page.wait_for_selector('li[data-id="r"][data-status="complete"]')
    items: list[Any] = await page.evaluate(
        "[...document.querySelectorAll('#messages li')]"
        ".map((li) => [li.dataset.id, li.textContent])"
    )
    assert items == [["old", "from before the page"], ["r", shown]]
    # StrictMode mounted everything twice; the text still only ever grew, never doubled.
    rendered: list[str] = await page.evaluate("window.rendered.r")
    assert rendered[-1] == shown
    assert all(shown.startswith(text) for text in rendered)
    assert running.relay.hub.subscribers(channel)
    # A reload restores the conversation, exactly.
    await page.reload()
    await page.wait_for_selector('li[data-id="r"][data-status="complete"]')
    assert await page.evaluate(
        "[...document.querySelectorAll('#messages li')]"
        ".map((li) => [li.dataset.id, li.textContent])"
    ) == [["old", "from before the page"], ["r", shown]]


STRUCTURED = [
    {"type": "start-step"},
    {"type": "reasoning-start", "id": "r1"},
    {"type": "reasoning-delta", "id": "r1", "delta": "Look it up."},
    {"type": "reasoning-end", "id": "r1"},
    {"type": "tool-input-start", "toolCallId": "c1", "toolName": "weather"},
    {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"city":'},
    {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '"Paris"}'},
    {"type": "tool-input-available", "toolCallId": "c1", "toolName": "weather",
     "input": {"city": "Paris"}},
    {"type": "tool-output-available", "toolCallId": "c1", "output": {"celsius": 21}},
]  # fmt: skip
"""A structured reply's chunks before its text: reasoning, then a tool call."""


async def test_the_hook_gives_each_message_its_parts(
    app_relay: tuple[RunningRelay, Any], page: Page
) -> None:
    running, _ = app_relay
    channel = "react-parts"
    http = running.url.replace("ws://", "http://")
    await page.goto(f"{http}/?channel={channel}")
    await page.wait_for_selector('#status[data-status="live"]')
    async with (
        running.connect(f"/produce?channel={channel}") as producer,
        running.connect("/subscribe") as watcher,
    ):
        await send_json(watcher, {"type": "subscribe", "channel": channel})
        assert (await recv_json(watcher))["type"] == "subscribed"
        await send_json(producer, {"id": "plain", "delta": "Just text.", "final": True})
        for chunk in STRUCTURED:
            await send_json(producer, {"id": "s", "chunk": chunk})
        for delta in ("It is ", "21 °C."):
            await send_json(producer, {"id": "s", "delta": delta})
        await send_json(producer, {"id": "s", "final": True})
        relayed = [await recv_json(watcher) for _ in range(2)]
    assert [frame["id"] for frame in relayed] == ["plain", "s"]
    await page.wait_for_selector('li[data-id="s"][data-status="complete"]')
    items: list[Any] = await page.evaluate(
        "[...document.querySelectorAll('#messages li')]"
        ".map((li) => [li.dataset.id, li.textContent, li.dataset.parts])"
    )
    assert items == [
        ["plain", "Just text.", "text:done"],
        ["s", "It is 21 °C.", "step-start reasoning:done tool-weather:output-available text:done"],
    ]
    # The hook's parts are exactly the relay's.
    assert await page.evaluate("window.parts.s") == relayed[1]["parts"]
    assert relayed[1]["parts"][2]["input"] == {"city": "Paris"}


async def test_a_refused_token_is_an_error_state_in_the_app(vite_app: Path, page: Page) -> None:
    running, server = await start_relay(
        web_root=str(vite_app), secret="a-secret-for-the-react-app-test-32b"
    )
    async with server:
        await page.goto(running.url.replace("ws://", "http://") + "/?channel=locked")
        await page.wait_for_selector('#status[data-status="error"]')
        assert "token" in (await page.text_content("#status") or "")
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        await asyncio.sleep(1.0)
        assert not [url for url in requests if "/sse" in url or "/subscribe" in url]


async def test_the_client_over_a_websocket_subscribes_unsubscribes_cancels_and_refreshes_tokens(
    page: Page,
) -> None:
    """The package's own files in Chromium (no bundler), against a relay that wants tokens."""
    secret = "a-secret-for-the-js-client-test-of-32-bytes"
    running, server = await start_relay(web_root=str(PACKAGE / "src"), secret=secret)
    reader = mint(secret, Role.SUBSCRIBE, ["a", "b", "forbidden-not"], 60)
    writer = mint(secret, Role.PRODUCE, ["a", "b"], 60)
    headers = {"Authorization": f"Bearer {writer}"}
    async with server:
        http = running.url.replace("ws://", "http://")
        await page.goto(f"{http}/")  # any page of the relay's origin
        await page.evaluate(
            """async ([url, token]) => {
                const { RelayClient } = await import("/index.js");
                window.tokens = 0;
                window.client = new RelayClient(url, {
                    channels: ["a"],
                    backoff: { initial: 50 },
                    token: async () => { window.tokens += 1; return token; },
                });
            }""",
            [f"{running.url}/subscribe", reader],
        )
        await page.wait_for_function("client.getChannel('a').status === 'live'")
        assert await page.evaluate("client.transport") == "websocket"

        async with (
            running.connect("/produce?channel=a", additional_headers=headers) as on_a,
            running.connect("/produce?channel=b", additional_headers=headers) as on_b,
        ):
            # Subscribe while connected: b joins the same socket.
            await page.evaluate("client.subscribe('b')")
            await page.wait_for_function("client.getChannel('b').status === 'live'")
            await send_json(on_b, {"id": "b1", "delta": "to b", "final": True})
            await recv_json(on_b)
            await page.wait_for_function("client.getChannel('b').messages.length === 1")
            # Stop reaches the producer as a cancel frame.
            await send_json(on_a, {"id": "long", "delta": "going on"})
            await page.wait_for_function("client.getChannel('a').messages.length === 1")
            assert await page.evaluate("client.cancel('a', 'long')") is True
            assert await recv_json(on_a) == {"type": "cancel", "channel": "a", "id": "long"}
            await send_json(on_a, {"id": "long", "final": True})
            await recv_json(on_a)
            # Unsubscribe: the relay lets it go, and what follows on a never shows.
            await page.evaluate("client.unsubscribe('a')")
            await _eventually(lambda: not running.relay.hub.subscribers("a"))
            await send_json(on_a, {"id": "after", "delta": "unseen", "final": True})
            await recv_json(on_a)
            # A cut: the reconnect asks the token function again and resumes b exactly.
            assert _cut(server) == 1
            await send_json(on_b, {"id": "b2", "delta": "while away", "final": True})
            await recv_json(on_b)
            await page.wait_for_function("client.getChannel('b').messages.length === 2")
            assert await page.evaluate("window.tokens") == 2
            assert await page.evaluate("client.channels") == ["b"]
            assert await page.evaluate("client.getChannel('a').messages.length") == 0
            texts = await page.evaluate("client.getChannel('b').messages.map((m) => m.text)")
            assert texts == ["to b", "while away"]
            # A channel the token does not grant is an error for that channel only.
            await page.evaluate("client.subscribe('secret')")
            await page.wait_for_function("client.getChannel('secret').status === 'error'")
            assert await page.evaluate("client.getChannel('secret').error.code") == "forbidden"
            assert await page.evaluate("client.getChannel('b').status") == "live"


async def _eventually(condition: Any, wait: float = 5.0) -> None:
    async with asyncio.timeout(wait):
        while not condition():  # noqa: ASYNC110 - polls state owned by the relay
            await asyncio.sleep(0.01)


async def test_the_react_app_through_a_proxy_that_cuts_keeps_the_text_exact(
    app_relay: tuple[RunningRelay, Any], page: Page
) -> None:
    """The page and its relay connection through a TCP proxy that drops every connection
    with no goodbye, three times in the middle of a reply."""
    running, server = app_relay
    port = int(running.url.rsplit(":", 1)[1])
    async with Proxy(port) as proxy, running.connect("/produce?channel=cut") as producer:
        await page.goto(f"http://127.0.0.1:{proxy.port}/?channel=cut")
        await page.wait_for_selector('#status[data-status="live"]')
        shown = ""
        for n in range(12):
            piece = f"piece {n} · "
            await send_json(producer, {"id": "r", "delta": piece})
            shown += piece
            if n % 4 == 3:
                await page.wait_for_function(
                    "(text) => document.querySelector('li[data-id=\"r\"]')?.textContent === text",
                    arg=shown,
                )
                subscribers = [c for c in server.server.connections if c.path == "/subscribe"]
                assert subscribers, [c.path for c in server.server.connections]
                assert proxy.cut() >= 1
        await send_json(producer, {"id": "r", "final": True})
        assert (await recv_json(producer))["type"] == "ack"
        await page.wait_for_selector('li[data-id="r"][data-status="complete"]', timeout=20000)
        assert await page.text_content('li[data-id="r"]') == shown
        assert proxy.cuts == 3
        rendered: list[str] = await page.evaluate("window.rendered.r")
        assert all(shown.startswith(text) for text in rendered)
