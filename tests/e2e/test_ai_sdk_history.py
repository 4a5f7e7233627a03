"""``GET /ai-sdk/{channel}/messages``: a channel's recent replies as the AI SDK's
``UIMessage``\\ s, checked by the real ``ai`` package's ``validateUIMessages`` at its current
major and the one before, as an app restores a chat with ``useChat({messages})`` after a
reload; and the documented recipe, run as printed."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from ..conftest import RunningRelay, recv_json, send_json, start_relay
from ..docs.blocks import docs_block
from .test_ai_sdk import AI_MAJORS, NodeScript
from .test_ai_sdk_parts import _reply


@pytest.fixture(scope="session", params=AI_MAJORS)
def history(js_clients: Path, request: pytest.FixtureRequest) -> NodeScript:
    return NodeScript(js_clients / "ui_history.mjs", request.param)


def _base(running: RunningRelay) -> str:
    return running.url.replace("ws://", "http://")


async def _get(running: RunningRelay, path: str) -> tuple[int, str]:
    port = int(running.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


async def _chat(running: RunningRelay, channel: str) -> list[dict[str, Any]]:
    """Three replies: plain, structured with meta, and one aborted; their terminal frames."""
    watcher = await running.connect(f"/subscribe?channel={channel}").__aenter__()
    assert (await recv_json(watcher))["type"] == "subscribed"
    async with running.connect(f"/produce?channel={channel}") as producer:
        await send_json(producer, {"id": "a1", "delta": "Hello, wörld", "final": True})
        for event in _reply("a2"):
            await send_json(producer, event)
        await send_json(producer, {"id": "a2", "final": True, "meta": {"model": "m-1"}})
        await send_json(producer, {"id": "a3", "delta": "cut sh"})
        await asyncio.sleep(0.1)
    frames = [await recv_json(watcher) for _ in range(3)]
    await watcher.close()
    return frames


async def test_the_replies_are_valid_ui_messages_with_exactly_their_parts(
    history: NodeScript,
) -> None:
    running, relay = await start_relay(session_grace=0)
    async with relay:
        frames = await _chat(running, "chat-h")
        assert [f["type"] for f in frames] == ["message", "message", "aborted"]
        got = json.loads(await history.run(_base(running), "chat-h"))
        assert got["status"] == 200
        assert got["messages"] == [
            {"id": "a1", "role": "assistant",
             "parts": [{"type": "text", "text": "Hello, wörld", "state": "done"}]},
            {"id": "a2", "role": "assistant", "parts": frames[1]["parts"],
             "metadata": {"model": "m-1"}},
            {"id": "a3", "role": "assistant",
             "parts": [{"type": "text", "text": "cut sh", "state": "streaming"}]},
        ]  # fmt: skip
        # The newest N, oldest first.
        last = json.loads(await history.run(_base(running), "chat-h", "?limit=2"))
        assert [m["id"] for m in last["messages"]] == ["a2", "a3"]
        empty = json.loads(await history.run(_base(running), "nothing-here"))
        assert empty == {"status": 200, "messages": []}


async def test_bad_limits_and_tokens_are_refused() -> None:
    running, relay = await start_relay()
    async with relay:
        for query in ("?limit=0", "?limit=x", "?limit=1001"):
            status, body = await _get(running, f"/ai-sdk/c/messages{query}")
            assert (status, body) == (400, "?limit= must be 1 to 1000\n"), query
        status, _ = await _get(running, "/ai-sdk/c/messages/x")
        assert status == 404
    secret = "a-secret-that-is-long-enough-for-hs256"
    running, relay = await start_relay(secret=secret)
    async with relay:
        status, _ = await _get(running, "/ai-sdk/c/messages")
        assert status == 401


async def test_the_documented_restore_recipe_runs_as_printed(js_clients: Path) -> None:
    running, relay = await start_relay()
    async with relay:
        await _chat(running, "chat-42")
        script = js_clients / f"recipe-history-{os.getpid()}.mjs"
        script.write_text(
            docs_block("ai-sdk-history")
            + "\nconsole.log(JSON.stringify(messages.map((m) => m.id)));\n"
        )
        try:
            node = await asyncio.create_subprocess_exec(
                "node", str(script), stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "RELAY_URL": _base(running)},
            )  # fmt: skip
            out, _ = await asyncio.wait_for(node.communicate(), 60)
        finally:
            script.unlink()
        assert node.returncode == 0
        assert json.loads(out) == ["a1", "a2", "a3"]
