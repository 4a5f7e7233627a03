"""The AI SDK's UI message stream, driven by the real ``ai`` npm package in Node
(``DefaultChatTransport.reconnectToStream`` and ``readUIMessageStream``) against a running
relay: from the start, resumed in the middle, 204 once done, Stop, and an abort."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from token_relay.testing import RedisServer, SseReader, eventually, free_port, relay_process
from websockets.asyncio.client import connect

from ..conftest import RunningRelay, recv_json, send_json, start_relay


@pytest.fixture(scope="session")
def ai_sdk(js_clients: Path) -> Path:
    """The AI SDK's own resume, in Node."""
    return js_clients / "ai_sdk_resume.mjs"


async def _resume(script: Path, running: RunningRelay, chat: str, query: str = "") -> Any:
    base = running.url.replace("ws://", "http://")
    node = await asyncio.create_subprocess_exec(
        "node", str(script), base, chat, query, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(node.communicate(), 30)
    assert node.returncode == 0
    return json.loads(out)


async def _post(running: RunningRelay, path: str) -> int:
    port = int(running.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Length: 0\r\n\r\n".encode())
    line = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    return int(line.split()[1])


async def test_a_stream_read_from_its_start_and_a_204_once_it_is_done(ai_sdk: Path) -> None:
    running, relay = await start_relay()
    async with relay:
        assert await _resume(ai_sdk, running, "chat-1") == {"resumed": False}
        reading = asyncio.ensure_future(_resume(ai_sdk, running, "chat-1", "?wait=10"))
        await asyncio.sleep(1.0)  # Node has started and waits for a message
        tokens = ["Hello", ", ", "wörld", " 👋", "", "!"]
        async with running.connect("/produce?channel=chat-1") as producer:
            for token in tokens:
                await send_json(producer, {"id": "reply-1", "delta": token})
                await asyncio.sleep(0.02)
            usage = {"usage": {"outputTokens": 6}, "model": "m-1"}
            await send_json(producer, {"id": "reply-1", "final": True, "meta": usage})
            assert (await recv_json(producer))["type"] == "ack"
        got = await reading
        assert got["metadata"] == {"usage": {"outputTokens": 6}, "model": "m-1"}
        assert (got["id"], got["text"], got["states"]) == ("reply-1", "".join(tokens), ["done"])
        assert got["parts"][:2] == ["start", "text-start"]
        assert got["parts"][-2:] == ["text-end", "finish"]
        assert await _resume(ai_sdk, running, "chat-1") == {"resumed": False}


async def _resume_mid_reply(
    ai_sdk: Path, producer: Any, reader: RunningRelay, chat: str, pieces: list[str]
) -> Any:
    """Stream the first half of a reply, resume it through ``reader``'s AI SDK stream once
    ``reader`` holds that half, stream the rest and the final; what the AI SDK read."""
    half = len(pieces) // 2
    for piece in pieces[:half]:
        await send_json(producer, {"id": "r", "delta": piece})
    so_far = "".join(pieces[:half])
    for _ in range(200):
        async with connect(f"{reader.url}/subscribe?channel={chat}&deltas=1") as probe:
            await recv_json(probe)  # subscribed
            try:
                snapshot = await recv_json(probe, 0.1)
            except TimeoutError:
                continue
        if snapshot.get("text") == so_far:
            break
    reading = asyncio.ensure_future(_resume(ai_sdk, reader, chat))
    await asyncio.sleep(1.0)
    for piece in pieces[half:]:
        await send_json(producer, {"id": "r", "delta": piece})
    await send_json(producer, {"id": "r", "final": True})
    return await reading


async def test_a_resume_in_the_middle_replays_from_start_under_the_same_id(ai_sdk: Path) -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/produce?channel=chat-2") as producer:
        pieces = [f"{n} " for n in range(40)]
        got = await _resume_mid_reply(ai_sdk, producer, running, "chat-2", pieces)
        assert (got["id"], got["text"]) == ("r", "".join(pieces))
        # The head came as one delta of the text so far, then the live ones, once each.
        assert got["parts"].count("start") == 1 and got["parts"].count("text-start") == 1


async def test_stop_reaches_the_producer_and_an_abort_ends_the_stream(ai_sdk: Path) -> None:
    running, relay = await start_relay(session_grace=0)
    async with relay:
        assert await _post(running, "/ai-sdk/chat-3/stop") == 404
        async with running.connect("/produce?channel=chat-3") as producer:
            await send_json(producer, {"id": "long", "delta": "thinking"})
            await asyncio.sleep(0.1)
            reading = asyncio.ensure_future(_resume(ai_sdk, running, "chat-3"))
            await asyncio.sleep(1.0)
            assert await _post(running, "/ai-sdk/chat-3/stop") == 204
            assert await recv_json(producer) == {
                "type": "cancel",
                "channel": "chat-3",
                "id": "long",
            }
            # The gateway stops its model and goes away without a final: an abort.
        got = await reading
        assert (got["id"], got["text"], got["states"]) == ("long", "thinking", ["streaming"])
        assert got["parts"][-1] == "abort"
        assert await _post(running, "/ai-sdk/chat-3/stop") == 404


async def test_a_resume_on_another_process_through_redis(
    ai_sdk: Path, redis_server: RedisServer
) -> None:
    flags = ("--broker", redis_server.url)
    a, b = relay_process(*flags), relay_process(*flags)
    await asyncio.gather(a.start(), b.start())
    try:
        on_b = RunningRelay(None, b.url)  # type: ignore[arg-type]
        async with connect(f"{a.url}/produce?channel=chat-4") as producer:
            await recv_json(producer)
            # Started on a, resumed on b once b holds it through Redis.
            pieces = [f"{n}," for n in range(20)]
            got = await _resume_mid_reply(ai_sdk, producer, on_b, "chat-4", pieces)
        assert (got["id"], got["text"]) == ("r", "".join(pieces))
    finally:
        await asyncio.gather(a.stop(), b.stop())


INTEGRATIONS = Path(__file__).resolve().parents[2] / "client_demo" / "integrations"
README = Path(__file__).resolve().parents[2] / "README.md"


async def test_the_readme_nextjs_route_answers_use_chat(js_clients: Path) -> None:
    """The README's Next.js route, type-checked strictly and run as useChat drives it."""
    route = INTEGRATIONS / "nextjs_route.ts"
    assert route.read_text().strip() in README.read_text()
    compile_ts = await asyncio.create_subprocess_exec(
        "npx", "tsc", "--strict", "--target", "ES2022", "--module", "ES2022",
        "--moduleResolution", "bundler", "--lib", "ES2022,DOM", "--types", "node",
        "--skipLibCheck", "--outDir", str(js_clients / "build"), str(route),
        cwd=js_clients,
    )  # fmt: skip
    assert await asyncio.wait_for(compile_ts.wait(), 120) == 0
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe?channel=chat-ts") as sub:
        await recv_json(sub)
        node = await asyncio.create_subprocess_exec(
            "node",
            str(js_clients / "use_chat.mjs"),
            str(js_clients / "build" / "nextjs_route.js"),
            "chat-ts",
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "RELAY_URL": running.url.replace("ws://", "http://")},
        )
        out, _ = await asyncio.wait_for(node.communicate(), 30)
        assert node.returncode == 0
        got = json.loads(out)
        assert got["text"] == "Hello from the relay (1 messages)"
        stored = await recv_json(sub)  # what the app's backend would keep
        assert (stored["id"], stored["text"]) == (got["id"], got["text"])


async def test_the_readme_fastapi_app_answers_use_chat(js_clients: Path) -> None:
    """The README's FastAPI app, served by uvicorn, answering the AI SDK's transport."""
    app = INTEGRATIONS / "fastapi_app.py"
    assert app.read_text().strip() in README.read_text()
    running, relay = await start_relay()
    relay_url = running.url.replace("ws://", "http://")
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "uvicorn", "fastapi_app:app", "--app-dir", str(INTEGRATIONS),
        "--port", str(port), "--log-level", "warning",
        env={**os.environ, "RELAY_URL": relay_url},
    )  # fmt: skip
    try:
        async with relay, running.connect("/subscribe?channel=chat-py") as sub:
            await recv_json(sub)

            async def listening() -> bool:
                with contextlib.suppress(OSError):
                    _, writer = await asyncio.open_connection("127.0.0.1", port)
                    writer.close()
                    return True
                return False

            await eventually(listening, 15)
            node = await asyncio.create_subprocess_exec(
                "node",
                str(js_clients / "use_chat.mjs"),
                f"http://127.0.0.1:{port}/api/chat",
                "chat-py",
                stdout=asyncio.subprocess.PIPE,
            )
            out, _ = await asyncio.wait_for(node.communicate(), 30)
            assert node.returncode == 0
            got = json.loads(out)
            assert got["text"] == "Hello from the relay (1 messages)"
            stored = await recv_json(sub)
            assert (stored["id"], stored["text"]) == (got["id"], got["text"])
    finally:
        server.terminate()
        await server.wait()


async def test_the_stream_has_the_ui_message_stream_headers() -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/produce?channel=chat-h") as producer:
        await send_json(producer, {"id": "m", "delta": "so far"})
        await asyncio.sleep(0.1)
        async with SseReader(int(running.url.rsplit(":", 1)[1]), "/ai-sdk/chat-h/stream") as sse:
            assert sse.status == 200
            headers = sse.response_headers
            assert headers["content-type"].startswith("text/event-stream")
            assert (headers["cache-control"], headers["x-accel-buffering"]) == ("no-cache", "no")
            assert headers["connection"] == "keep-alive"
            assert headers["x-vercel-ai-ui-message-stream"] == "v1"
            parts = [(await sse.next()).json() for _ in range(3)]
            assert parts == [
                {"type": "start", "messageId": "m"},
                {"type": "text-start", "id": "text-1"},
                {"type": "text-delta", "id": "text-1", "delta": "so far"},
            ]
