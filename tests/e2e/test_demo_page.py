"""The demo chat page in real headless Chromium, with the demo gateway answering what is typed
into it: reload restores the conversation, cuts resume with the text exact, the SSE fallback
behind a proxy that breaks WebSockets, Stop, auto-scroll, rendering, and a clean console."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Page
from token_relay.client import RelayProducer, RelaySubscriber

from client_demo import WEB_ROOT
from client_demo.gateway import REPLIES, DemoGateway, compose_answer, compose_reply

from ..conftest import RunningRelay, recv_json, send_json, start_relay
from ..harness import Nginx

pytestmark = pytest.mark.asyncio(loop_scope="module")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nginx.conf"


@contextlib.asynccontextmanager
async def _gateway(url: str, channel: str, pace: tuple[float, float]) -> AsyncIterator[None]:
    """The demo gateway: answers every prompt on ``<channel>-prompts`` on the channel."""
    async with (
        RelaySubscriber(url, [f"{channel}-prompts"], deltas=False) as prompts,
        RelayProducer(url, channel=channel) as producer,
    ):
        gateway = DemoGateway(producer, pace=pace, seed=7)
        tasks = [
            asyncio.create_task(gateway.watch_cancels()),
            asyncio.create_task(gateway.answer_prompts(prompts, channel)),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@pytest_asyncio.fixture(loop_scope="module")
async def demo() -> AsyncIterator[tuple[RunningRelay, Any]]:
    running, server = await start_relay(web_root=str(WEB_ROOT))
    async with server, _gateway(running.url, "chat", (0.001, 0.004)):
        yield running, server


async def _until(condition: Any, wait: float = 5.0) -> None:
    async with asyncio.timeout(wait):
        while not condition():  # noqa: ASYNC110 - polls state owned by the relay
            await asyncio.sleep(0.01)


def _http(running: RunningRelay) -> str:
    return running.url.replace("ws://", "http://")


async def _open(page: Page, url: str, transport: str = "websocket") -> None:
    await page.goto(url)
    await page.wait_for_selector(f'#status[data-status="open"][data-transport="{transport}"]')


async def _ask(page: Page, prompt: str) -> None:
    await page.fill("#prompt", prompt)
    await page.press("#prompt", "Enter")


async def _conversation(page: Page) -> list[dict[str, str]]:
    turns: list[dict[str, str]] = await page.evaluate(
        """() => [...document.querySelectorAll("#turns .turn")].map((t) => ({
            who: t.querySelector(".who").textContent,
            state: t.dataset.state || "",
            text: t.querySelector(".text").textContent,
            id: t.dataset.id,
        }))"""
    )
    return turns


async def _reply_done(page: Page, count: int, state: str = "complete") -> None:
    await page.wait_for_function(
        """([count, state]) => document.querySelectorAll(
            `#turns .turn.reply[data-state="${state}"]`).length >= count""",
        arg=[count, state],
        timeout=15000,
    )


def _watch_console(page: Page) -> list[str]:
    """Every console error, page error, failed request and error response from now on."""
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else 0)
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url} {r.failure}"))
    page.on("response", lambda r: problems.append(f"{r.status}: {r.url}") if r.status >= 400 else 0)
    return problems


async def test_a_prompt_is_answered_and_a_reload_restores_the_whole_conversation(
    demo: tuple[RunningRelay, Any], page: Page
) -> None:
    running, _ = demo
    problems = _watch_console(page)
    await _open(page, f"{_http(running)}/?channel=chat")
    prompts = ["What does a relay do?", "And after a reload?"]
    for n, prompt in enumerate(prompts, 1):
        await _ask(page, prompt)
        await _reply_done(page, n)
    before = await _conversation(page)
    assert [(t["who"], t["text"]) for t in before] == [
        ("you", prompts[0]),
        ("gateway · reply 1", compose_answer(prompts[0])),
        ("you", prompts[1]),
        ("gateway · reply 2", compose_answer(prompts[1])),
    ]
    # Short, human ids: a prompt's id is a few characters, its reply's is "re-" and it.
    assert re.fullmatch(r"q[0-9a-z]{6,9}", before[0]["id"])
    assert before[1]["id"] == f"re-{before[0]['id']}"

    await page.reload()
    await page.wait_for_selector('#status[data-status="open"]')
    await page.wait_for_function("document.querySelectorAll('#turns .turn').length === 4")
    assert await _conversation(page) == before
    # Each restored message reached the page once, through the rewind.
    events = await page.evaluate("window.relayEvents.filter((e) => e.kind === 'message')")
    assert sorted(e["id"] for e in events) == sorted(t["id"] for t in before)
    assert problems == []


_PARTS = """(turn) => [...turn.querySelectorAll(".parts > .part")].map((part) => ({
    type: part.dataset.type,
    state: part.dataset.state,
    tag: part.tagName.toLowerCase(),
    open: part.open ?? null,
    summary: part.querySelector("summary")?.textContent ?? null,
    name: part.querySelector(".tool-name")?.textContent ?? null,
    input: part.querySelector(".tool-input")?.textContent ?? null,
    output: part.querySelector(".tool-output")?.textContent ?? null,
    text: part.querySelector(".reasoning-text")?.textContent ?? null,
    visible: part.querySelector(".reasoning-text")?.checkVisibility() ?? null,
}))"""
"""Each part the turn shows above its text, as the page renders it."""


async def test_a_structured_reply_shows_its_reasoning_collapsed_and_its_tool_call(
    demo: tuple[RunningRelay, Any], page: Page
) -> None:
    running, _ = demo
    problems = _watch_console(page)
    await _open(page, f"{_http(running)}/?channel=chat-parts")
    async with _gateway(running.url, "chat-parts", (0.001, 0.004)):
        prompt = "What is the weather in Paris?"
        await _ask(page, prompt)
        await _reply_done(page, 1)
    turn = page.locator(".turn.reply")
    reply = compose_reply(str(await turn.get_attribute("data-id")), prompt)
    # The text is the text part alone, exact; the reasoning and the tool call come before it.
    assert await turn.locator(".text").text_content() == reply.text
    assert await turn.evaluate(_PARTS) == [
        {
            "type": "reasoning", "state": "done", "tag": "details", "open": False,
            "summary": "Reasoning", "name": None, "input": None, "output": None,
            "text": reply.reasoning, "visible": False,
        },
        {
            "type": "tool-weather", "state": "output-available", "tag": "div", "open": None,
            "summary": None, "name": "weather", "input": '{\n  "city": "Paris"\n}',
            "output": '{\n  "celsius": 21\n}', "text": None, "visible": None,
        },
    ]  # fmt: skip
    assert await turn.locator(".tool .tool-state").text_content() == "output-available"
    # Collapsed until the reader opens it.
    await turn.locator(".reasoning summary").click()
    shown = await turn.evaluate(_PARTS)
    assert (shown[0]["open"], shown[0]["visible"]) == (True, True)
    # The client's message holds exactly the relay's parts.
    message = await page.evaluate(
        "(id) => window.relayClient.getChannel('chat-parts').messages.find((m) => m.id === id)",
        await turn.get_attribute("data-id"),
    )
    assert [part["type"] for part in message["parts"]] == [
        "step-start", "reasoning", "tool-weather", "text",
    ]  # fmt: skip
    assert message["parts"][2]["input"] == {"city": "Paris"}
    assert message["text"] == message["parts"][3]["text"]
    assert problems == []


async def test_the_canned_structured_reply_shows_on_the_page_after_a_reload(
    demo: tuple[RunningRelay, Any], page: Page
) -> None:
    running, _ = demo
    (structured,) = [reply for reply in REPLIES if reply.structured]
    assert structured.tool is not None
    async with RelayProducer(running.url, channel="canned") as producer:
        await DemoGateway(producer, pace=(0, 0), seed=1).stream(structured)
    await _open(page, f"{_http(running)}/?channel=canned")
    turn = page.locator(f'.turn[data-id="{structured.message_id}"][data-state="complete"]')
    await turn.wait_for()
    assert await turn.locator(".text").text_content() == structured.text
    assert await turn.locator("details.reasoning").evaluate("(d) => d.open") is False
    assert await turn.locator(".reasoning-text").text_content() == structured.reasoning
    assert await turn.locator(".tool-name").text_content() == structured.tool.name
    assert await turn.locator(".tool-output").text_content() == json.dumps(
        structured.tool.output, indent=2
    )


async def test_cuts_mid_reply_resume_with_the_text_exact_every_time(
    demo: tuple[RunningRelay, Any], page: Page
) -> None:
    running, _ = demo
    slow_channel = "cuts"
    async with _gateway(running.url, slow_channel, (0.01, 0.02)):
        await _open(page, f"{_http(running)}/?channel={slow_channel}&backoff=50")
        prompt = "Stream a long answer while the network keeps dropping"
        await _ask(page, prompt)
        await page.wait_for_selector('.turn.reply[data-state="streaming"]')
        hub = running.relay.hub
        for _ in range(4):
            await asyncio.sleep(0.25)
            before = set(hub.subscribers(slow_channel))
            assert before
            # The network drops the page's socket with no close frame.
            for connection in before:
                connection.transport.abort()
            # The page is back once a new connection of its holds the channel again.
            await _until(lambda cut=before: bool(set(hub.subscribers(slow_channel)) - cut), 15)
        await _reply_done(page, 1)
    turns = await _conversation(page)
    assert turns[-1]["text"] == compose_answer(prompt)
    events = await page.evaluate("window.relayEvents")
    reply_id = turns[-1]["id"]
    assert [e["kind"] for e in events if e["id"] == reply_id].count("message") == 1
    # Every resume carried only the characters the page lacked.
    froms = [e["from"] for e in events if e["id"] == reply_id and e["kind"] == "snapshot"]
    assert froms and all(isinstance(start, int) and start > 0 for start in froms)


async def test_stop_ends_the_reply_where_it_was(demo: tuple[RunningRelay, Any], page: Page) -> None:
    running, _ = demo
    async with _gateway(running.url, "stop", (0.03, 0.05)):
        await _open(page, f"{_http(running)}/?channel=stop")
        await _ask(page, "Take your time")
        await page.wait_for_selector('.turn.reply[data-state="streaming"] .stop')
        # Some of the reply is on the page before Stop is pressed.
        await page.wait_for_function(
            """() => document.querySelector('.turn.reply[data-state="streaming"] .text')
                ?.textContent.length > 0"""
        )
        await page.click(".turn.reply .stop")
        await page.wait_for_selector('.turn.reply[data-state="stopped"]', timeout=10000)
    text = (await _conversation(page))[-1]["text"]
    assert 0 < len(text) < len(compose_answer("Take your time"))
    assert compose_answer("Take your time").startswith(text)
    assert await page.locator(".turn.reply .stop").count() == 0


async def test_the_page_follows_new_replies_unless_the_reader_scrolled_up(
    demo: tuple[RunningRelay, Any], page: Page
) -> None:
    running, _ = demo
    await page.set_viewport_size({"width": 800, "height": 500})
    await _open(page, f"{_http(running)}/?channel=scroll")
    at_bottom = "() => window.innerHeight + window.scrollY >= document.body.scrollHeight - 60"
    async with running.connect("/produce?channel=scroll") as producer:
        for n in range(12):
            await send_json(producer, {"id": f"m{n}", "delta": f"line {n}\n" * 6, "final": True})
            assert (await recv_json(producer))["type"] == "ack"
        await page.wait_for_function("document.querySelectorAll('.turn.reply').length === 12")
        await page.wait_for_function(at_bottom)
        # The reader scrolls up to read: new text no longer moves the page.
        await page.mouse.move(400, 250)
        await page.mouse.wheel(0, -5000)
        await page.wait_for_function("window.scrollY < 100")
        await send_json(producer, {"id": "late", "delta": "a new reply\n" * 6, "final": True})
        await page.wait_for_selector('.turn[data-id="late"]')
        await asyncio.sleep(0.2)
        assert await page.evaluate("window.scrollY") < 100
        assert await page.is_visible("#newer")
        await page.click("#newer")
        await page.wait_for_function(at_bottom)
        await send_json(producer, {"id": "later", "delta": "more\n" * 6, "final": True})
        await page.wait_for_selector('.turn[data-id="later"]')
        await page.wait_for_function(at_bottom)


async def test_code_blocks_and_line_breaks_render_and_keep_the_exact_text(
    demo: tuple[RunningRelay, Any], page: Page
) -> None:
    running, _ = demo
    await _open(page, f"{_http(running)}/?channel=code")
    text = "Two lines:\nfirst\nsecond\n```python\nprint('<b>hi</b>')\n```\nthen `x = 1` inline."
    async with running.connect("/produce?channel=code") as producer:
        for piece in re.findall(r".{1,5}", text, re.S):
            await send_json(producer, {"id": "c", "delta": piece})
        await send_json(producer, {"id": "c", "final": True})
        await page.wait_for_selector('.turn[data-id="c"][data-state="complete"]')
    turn = page.locator('.turn[data-id="c"] .text')
    assert await turn.text_content() == text
    assert await turn.locator("pre code").text_content() == "print('<b>hi</b>')\n"
    inline = "(e) => [...e.children].filter((c) => c.tagName === 'CODE').map((c) => c.innerText)"
    assert await turn.evaluate(inline) == ["x = 1"]
    assert await page.locator('.turn[data-id="c"] b').count() == 0  # text, never markup
    assert await turn.evaluate("(e) => getComputedStyle(e).whiteSpace") == "pre-wrap"
    # The fences are hidden; the line breaks show.
    assert "```" not in await turn.inner_text()
    assert (await turn.inner_text()).startswith("Two lines:\nfirst\nsecond")


def _breaking_proxy(directory: Path, backend: int) -> Nginx:
    """nginx with the shipped config, less the two lines that pass a WebSocket upgrade on:
    the proxy that breaks WebSockets while plain HTTP works."""
    config = directory / "no-upgrade.conf"
    text = DEPLOY.read_text()
    text, dropped = re.subn(r"(?m)^\s*proxy_set_header (Upgrade|Connection) .*\n", "", text)
    assert dropped == 2
    config.write_text(text)
    nginx = Nginx(config, [backend], directory)
    nginx.start()
    return nginx


_RECORD_STATUSES = """() => {
  const status = document.querySelector("#status");
  window.statuses = [];
  new MutationObserver((records) => {
    for (const record of records) window.statuses.push(record.oldValue, status.dataset.status);
  }).observe(status, { attributeFilter: ["data-status"], attributeOldValue: true });
}"""
"""Record, in ``window.statuses``, every value the page's ``#status`` takes from now on."""


async def test_behind_a_proxy_that_breaks_websockets_the_page_falls_back_to_sse(
    page: Page, tmp_path: Path
) -> None:
    running, server = await start_relay(web_root=str(WEB_ROOT))
    async with server, _gateway(running.url, "proxied", (0.01, 0.02)):
        port = int(running.url.rsplit(":", 1)[1])
        nginx = _breaking_proxy(tmp_path, port)
        try:
            problems = _watch_console(page)
            url = f"http://127.0.0.1:{nginx.port}/?channel=proxied&backoff=50"
            await _open(page, url, transport="sse")
            prompt = "Reach me without WebSockets"
            await _ask(page, prompt)
            await page.wait_for_selector('.turn.reply[data-state="streaming"]')
            # The refused WebSocket is the only error the browser reports, and the page
            # does not try it again while SSE works.
            assert problems and all("426" in p for p in problems), problems
            assert len(problems) == 1
            # A cut mid-reply: the stream resumes, and the text ends exact. The page may be
            # "reconnecting" for less than a frame (its backoff is 50 ms): every status it
            # takes is recorded as it changes, not looked for afterwards.
            await page.evaluate(_RECORD_STATUSES)
            await asyncio.sleep(0.2)
            for connection in list(server.server.connections):
                if connection.path.startswith("/sse"):
                    connection.transport.abort()
            await page.wait_for_function("window.statuses.includes('reconnecting')")
            await _reply_done(page, 1)
            before = await _conversation(page)
            assert before[-1]["text"] == compose_answer(prompt)
            # Stop works over plain HTTP too (POST /cancel).
            await _ask(page, "Now stop me")
            await page.wait_for_selector('.turn.reply[data-state="streaming"] .stop')
            await page.click('.turn.reply[data-state="streaming"] .stop')
            await page.wait_for_selector('.turn.reply[data-state="stopped"]', timeout=10000)
            # A reload restores everything over SSE.
            shown = await _conversation(page)
            await page.reload()
            await page.wait_for_selector('#status[data-status="open"][data-transport="sse"]')
            await page.wait_for_function(
                f"document.querySelectorAll('#turns .turn').length === {len(shown)}"
            )
            after = await _conversation(page)
            # (After a reload the page no longer knows which reply it stopped: "complete".)
            assert [(t["id"], t["text"]) for t in after] == [(t["id"], t["text"]) for t in shown]
        finally:
            nginx.stop()
