"""The end-to-end tests' fixtures.

* ``open_relay``: the opening most of these tests share. It starts a relay in this process
  and opens a subscriber and a producer on one channel, with their first frames read.
* ``browser`` and ``page``: real headless Chromium, Debian's own build, never a downloaded
  one. A module that uses ``page`` marks itself ``pytest.mark.asyncio(loop_scope="module")``:
  it shares one browser (launching it costs more than most of these tests), and each test
  still gets a fresh browser context of its own, so no page state is shared between tests.
* ``chat_page``: the useChat page on the AI SDK's ``WebSocketChatTransport``, built for the
  browser, for a relay's ``--web-root``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, async_playwright
from websockets.asyncio.client import ClientConnection

from ..conftest import RunningRelay, start_relay, subscribed_pair
from ..harness import npm_installed


class Opened(NamedTuple):
    """A running relay, a subscriber on it whose ``subscribed`` frame is read, and a producer
    on the same channel whose ``session`` frame is read."""

    running: RunningRelay
    sub: ClientConnection
    producer: ClientConnection


OpenRelay = Callable[..., AbstractAsyncContextManager[Opened]]
"""``open_relay(*, channel="c", deltas=False, **settings)``: see :func:`open_relay`."""


@pytest.fixture
def open_relay() -> OpenRelay:
    """Start a relay with ``settings`` (``Settings`` fields) on a free port, and open a
    subscriber (with ``deltas``) and a producer on ``channel``; the relay stops at the end::

        async with open_relay(idle_timeout=0.3, deltas=True) as (running, sub, producer):
            ...
    """

    @asynccontextmanager
    async def opening(
        *, channel: str = "c", deltas: bool = False, **settings: Any
    ) -> AsyncIterator[Opened]:
        running, relay = await start_relay(**settings)
        async with (
            relay,
            subscribed_pair(running, channel=channel, deltas=deltas) as (sub, producer),
        ):
            yield Opened(running, sub, producer)

    return opening


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context()
    try:
        yield await context.new_page()
    finally:
        await context.close()


WS_CHAT_APP = Path(__file__).resolve().parents[1] / "js" / "ws-chat-app"


@pytest.fixture(scope="session")
def ds_clients(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/dsbridge with its pinned packages installed from the lockfile (npm reaches the
    registry): the official Durable Streams clients."""
    source = Path(__file__).resolve().parents[1] / "dsbridge"
    return npm_installed(source, tmp_path_factory.mktemp("dsbridge"))


@pytest.fixture(scope="module")
def chat_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page of tests/js/ws-chat-app (useChat with the AI SDK's WebSocketChatTransport),
    installed from its lockfile (npm reaches the registry) and bundled for the
    browser (minified: the relay serves files of at most 1 MiB)."""
    npm = shutil.which("npm")
    assert npm is not None
    folder = tmp_path_factory.mktemp("ws-chat-app")
    for name in ("package.json", "package-lock.json", "app.jsx", "index.html"):
        shutil.copy(WS_CHAT_APP / name, folder / name)
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=folder, check=True, timeout=300,
    )  # fmt: skip
    dist = folder / "dist"
    subprocess.run(
        [str(folder / "node_modules" / ".bin" / "esbuild"), "app.jsx", "--bundle",
         "--format=esm", "--jsx=automatic", "--minify", f"--outfile={dist / 'app.js'}",
         "--log-level=warning"],
        cwd=folder, check=True, timeout=120,
    )  # fmt: skip
    shutil.copy(folder / "index.html", dist / "index.html")
    return dist
