"""The end-to-end tests' fixtures.

* ``open_relay``: the opening most of these tests share. It starts a relay in this process
  and opens a subscriber and a producer on one channel, with their first frames read.
* ``browser`` and ``page``: real headless Chromium, Debian's own build, never a downloaded
  one. A module that uses ``page`` marks itself ``pytest.mark.asyncio(loop_scope="module")``:
  it shares one browser (launching it costs more than most of these tests), and each test
  still gets a fresh browser context of its own, so no page state is shared between tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NamedTuple

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, async_playwright
from websockets.asyncio.client import ClientConnection

from ..conftest import RunningRelay, start_relay, subscribed_pair


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
