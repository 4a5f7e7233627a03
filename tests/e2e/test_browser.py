"""The demo page and the token-relay-client package in real headless Chromium, against the
real relay."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Page

from client_demo import WEB_ROOT

from ..conftest import RunningRelay, recv_json, send_json, start_relay

# One Chromium for the module (see tests/e2e/conftest.py); each test still gets a fresh
# browser context of its own, so no page state is shared between tests.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module")
async def web_relay() -> AsyncIterator[tuple[RunningRelay, Any]]:
    running, server = await start_relay(web_root=str(WEB_ROOT))
    async with server:
        yield running, server


async def _open(page: Page, running: RunningRelay, channel: str, query: str = "") -> None:
    http = running.url.replace("ws://", "http://")
    await page.goto(f"{http}/?channel={channel}{query}")
    await page.wait_for_selector('#status[data-status="open"]')
    await _until(lambda: running.relay.hub.subscribers(channel))


async def _until(condition: Any, wait: float = 5.0) -> None:
    async with asyncio.timeout(wait):
        while not condition():  # noqa: ASYNC110 - polls state owned by the relay
            await asyncio.sleep(0.01)


async def _shows(page: Page, message_id: str, text: str, state: str) -> None:
    await page.wait_for_function(
        """([id, text, state]) => {
            const turn = document.querySelector(`.turn[data-id="${id}"]`);
            return turn && turn.dataset.state === state
                && turn.querySelector(".text").textContent === text;
        }""",
        arg=[message_id, text, state],
        timeout=5000,
    )


async def _events(page: Page, kind: str, message_id: str) -> int:
    count: int = await page.evaluate(
        "([kind, id]) => window.relayEvents.filter(e => e.kind === kind && e.id === id).length",
        [kind, message_id],
    )
    return count


async def test_reply_appears_live_and_ends_equal_to_the_completed_text(
    web_relay: tuple[RunningRelay, Any], page: Page, tmp_path: Path
) -> None:
    running, _ = web_relay
    await _open(page, running, "web")
    async with running.connect("/produce?channel=web") as producer:
        shown = ""
        for delta in ["Stre", "", "aming ", "to the ", "brow", "ser 🚀"]:
            await send_json(producer, {"id": "m1", "delta": delta})
            shown += delta
            await _shows(page, "m1", shown, "streaming")
        await send_json(producer, {"id": "m1", "delta": "!", "final": True})
        await _shows(page, "m1", "Streaming to the browser 🚀!", "complete")
        assert await _events(page, "message", "m1") == 1
        await page.screenshot(path=str(tmp_path / "live.png"))


async def test_page_reconnects_and_shows_missed_messages_exactly_once(
    web_relay: tuple[RunningRelay, Any], page: Page
) -> None:
    running, server = web_relay
    await _open(page, running, "web", "&backoff=600")
    async with running.connect("/produce?channel=web") as producer:
        await send_json(producer, {"id": "before", "delta": "seen live", "final": True})
        await _shows(page, "before", "seen live", "complete")
        await send_json(producer, {"id": "open", "delta": "abc"})
        await _shows(page, "open", "abc", "streaming")

        # The relay drops the page's socket with no close frame, as a network would.
        assert server.server is not None
        for connection in list(server.server.connections):
            if connection.path.startswith("/subscribe"):
                connection.transport.abort()
        await _until(lambda: not running.relay.hub.subscribers("web"))

        # Completed, and continued, while the page is away.
        await send_json(producer, {"id": "missed-1", "delta": "first gap", "final": True})
        await send_json(producer, {"id": "missed-2", "delta": "second gap", "final": True})
        await send_json(producer, {"id": "open", "delta": "def"})
        for _ in range(2):
            assert (await recv_json(producer))["type"] == "ack"

        await page.wait_for_selector('#status[data-status="reconnecting"]', state="attached")
        await page.wait_for_selector('#status[data-status="open"]')
        await _shows(page, "missed-1", "first gap", "complete")
        await _shows(page, "missed-2", "second gap", "complete")
        # The snapshot carried only what the page lacked: no gap, no overlap.
        await _shows(page, "open", "abcdef", "streaming")
        await send_json(producer, {"id": "open", "delta": "ghi", "final": True})
        await _shows(page, "open", "abcdefghi", "complete")

        for message_id in ("before", "missed-1", "missed-2", "open"):
            assert await _events(page, "message", message_id) == 1
            assert await page.locator(f'.turn[data-id="{message_id}"]').count() == 1
        snapshots = await page.evaluate(
            "window.relayEvents.filter(e => e.kind === 'snapshot' && e.id === 'open')"
        )
        assert [snapshot["from"] for snapshot in snapshots] == [3]


async def test_stop_button_cancels_the_generation_at_the_producer(
    web_relay: tuple[RunningRelay, Any], page: Page
) -> None:
    running, _ = web_relay
    await _open(page, running, "web")
    async with running.connect("/produce?channel=web") as producer:
        await send_json(producer, {"id": "long", "delta": "a long answer"})
        await _shows(page, "long", "a long answer", "streaming")
        await page.click('.turn[data-id="long"] .stop')
        assert await recv_json(producer) == {"type": "cancel", "channel": "web", "id": "long"}
        await send_json(producer, {"id": "long", "final": True})
        await _shows(page, "long", "a long answer", "stopped")


async def test_page_marks_an_aborted_reply(web_relay: tuple[RunningRelay, Any], page: Page) -> None:
    running, _ = web_relay
    await _open(page, running, "web")
    async with running.connect("/produce?channel=web") as producer:
        await send_json(producer, {"id": "dies", "delta": "half a rep"})
        await _shows(page, "dies", "half a rep", "streaming")
    await _shows(page, "dies", "half a rep", "aborted")
    state = await page.text_content('.turn[data-id="dies"] .state')
    assert state == "aborted: producer_disconnected"


async def test_relay_serves_the_page_and_client_over_http(
    web_relay: tuple[RunningRelay, Any], page: Page
) -> None:
    running, _ = web_relay
    http = running.url.replace("ws://", "http://")
    # The page imports the npm package's own files, which the relay serves next to it.
    response = await page.goto(f"{http}/token-relay-client/index.js")
    assert response is not None and response.status == 200
    assert response.headers["content-type"].startswith("text/javascript")
    package = Path(__file__).parents[2] / "clients" / "js" / "src" / "index.js"
    assert await response.body() == package.read_bytes()
    missing = await page.goto(f"{http}/nothing-here")
    assert missing is not None and missing.status == 404


async def test_demo_relay_start_helper_is_independent(page: Page) -> None:
    # Without --web-root the relay serves no page at all.
    running, server = await start_relay()
    async with server:
        response = await page.goto(running.url.replace("ws://", "http://") + "/")
        assert response is not None and response.status == 404


async def test_event_source_resumes_after_cuts_with_every_message_exactly_once(
    web_relay: tuple[RunningRelay, Any], page: Page
) -> None:
    """Chromium's own EventSource, cut in the middle of a stream, more than once."""
    running, server = web_relay
    http = running.url.replace("ws://", "http://")
    await page.goto(f"{http}/")
    await page.evaluate(
        """(url) => {
            window.seen = [];
            window.opened = 0;
            window.subscribed = 0;
            const source = new EventSource(url);
            source.onopen = () => { window.opened += 1; };
            source.addEventListener("subscribed", () => { window.subscribed += 1; });
            source.addEventListener("message", (e) => window.seen.push(JSON.parse(e.data)));
        }""",
        f"{http}/sse?channel=es",
    )
    await page.wait_for_function("window.opened === 1")
    # The browser holds its first id (the subscribed event's). A cut before it has read even
    # that event (a reset drops what it had not read) leaves EventSource nothing to resume
    # from: it comes back as a new reader, which no server can tell from one.
    await page.wait_for_function("window.subscribed === 1")
    await _until(lambda: running.relay.hub.subscribers("es"))
    expected: list[str] = []

    async def publish(producer: Any, message_id: str) -> None:
        expected.append(message_id)
        await send_json(producer, {"id": message_id, "delta": f"text {message_id}"})
        await send_json(producer, {"id": message_id, "final": True})
        assert (await recv_json(producer))["type"] == "ack"

    async with running.connect("/produce?channel=es") as producer:
        for round_ in range(3):
            await page.wait_for_function(f"window.opened === {round_ + 1}", timeout=15000)
            await _until(lambda: running.relay.hub.subscribers("es"))
            for n in range(3):
                await publish(producer, f"r{round_}-{n}")
            # Cut the stream with no goodbye, as a network would, and publish meanwhile.
            assert server.server is not None
            for connection in list(server.server.connections):
                if connection.path.startswith("/sse"):
                    connection.transport.abort()
            for n in range(3, 5):
                await publish(producer, f"r{round_}-{n}")
        await page.wait_for_function("window.opened === 4", timeout=15000)
    await page.wait_for_function(f"window.seen.length >= {len(expected)}", timeout=10000)
    seen = await page.evaluate("window.seen")
    assert [frame["id"] for frame in seen] == expected
    assert all(frame["text"] == f"text {frame['id']}" for frame in seen)


async def test_event_source_from_another_origin_reads_the_stream(
    web_relay: tuple[RunningRelay, Any], page: Page
) -> None:
    """A page on one origin reads a relay on another: the relay answers CORS."""
    running, _ = web_relay
    other, other_relay = await start_relay()
    async with other_relay:
        await page.goto(running.url.replace("ws://", "http://") + "/")
        url = other.url.replace("ws://127.0.0.1", "http://localhost") + "/sse?channel=x"
        await page.evaluate(
            """(url) => {
                window.got = [];
                const source = new EventSource(url);
                source.addEventListener("message", (e) => window.got.push(JSON.parse(e.data)));
                source.onopen = () => { window.open_ = true; };
            }""",
            url,
        )
        await page.wait_for_function("window.open_ === true", timeout=10000)
        await _until(lambda: other.relay.hub.subscribers("x"))
        async with other.connect("/produce?channel=x") as producer:
            await send_json(producer, {"id": "far", "delta": "across origins", "final": True})
            await recv_json(producer)
        await page.wait_for_function("window.got.length === 1", timeout=10000)
        assert (await page.evaluate("window.got"))[0]["text"] == "across origins"
