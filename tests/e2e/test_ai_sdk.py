"""The AI SDK's UI message stream, driven by the real ``ai`` npm package in Node, at its
current major and the one before (``DefaultChatTransport.reconnectToStream`` and
``readUIMessageStream``), against a running relay: from the start, resumed in the middle, a
reply that completed before it was asked for (by ``?id=``, or the newest within
``--ai-sdk-replay-window``), 204 when there is none, Stop, an abort, and Node's pooled sockets
reused after each stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import pytest
from websockets.asyncio.client import connect

from ..conftest import RunningRelay, recv_json, send_json, start_relay
from ..harness import (
    Proxy,
    RedisServer,
    SseReader,
    eventually,
    free_port,
    relay_process,
)

AI_MAJORS = ("ai", "ai-v6")
"""The AI SDK's packages in tests/js: its current major, and the one before."""


@dataclass(frozen=True)
class NodeScript:
    """A script of tests/js, run by Node with one of the AI SDK's majors."""

    path: Path
    package: str

    async def run(self, *args: str) -> bytes:
        """Run it to its end; what it printed."""
        node = await asyncio.create_subprocess_exec(
            "node", str(self.path), *args,
            stdout=asyncio.subprocess.PIPE, env={**os.environ, "AI_PACKAGE": self.package},
        )  # fmt: skip
        out, _ = await asyncio.wait_for(node.communicate(), 60)
        assert node.returncode == 0
        return out

    async def run_live(self, after_open: Callable[[], Awaitable[None]], *args: str) -> bytes:
        """Run it to its end, calling ``after_open`` once the relay answered with a stream
        (so once that stream joined the channel); what it printed."""
        node = await asyncio.create_subprocess_exec(
            "node", str(self.path), *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "AI_PACKAGE": self.package, "SAY_OPEN": "1"},
        )  # fmt: skip
        try:
            assert node.stderr is not None
            said = b""
            while not said.endswith(b"open\n"):  # after any warning of Node's
                line = await asyncio.wait_for(node.stderr.readline(), 30)
                assert line, said  # it ended without a stream
                said += line
            await after_open()
            out, err = await asyncio.wait_for(node.communicate(), 60)
        finally:
            if node.returncode is None:
                node.kill()
                await node.wait()
        assert node.returncode == 0, err
        return out


@pytest.fixture(scope="session", params=AI_MAJORS)
def ai_sdk(js_clients: Path, request: pytest.FixtureRequest) -> NodeScript:
    """The AI SDK's own resume, in Node, at each major."""
    return NodeScript(js_clients / "ai_sdk_resume.mjs", request.param)


async def _resume(script: NodeScript, running: RunningRelay, chat: str, query: str = "") -> Any:
    base = running.url.replace("ws://", "http://")
    return json.loads(await script.run(base, chat, query))


async def _post(running: RunningRelay, path: str) -> int:
    port = int(running.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Length: 0\r\n\r\n".encode())
    line = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    return int(line.split()[1])


async def test_a_stream_read_from_its_start_and_whole_once_it_is_done(ai_sdk: NodeScript) -> None:
    running, relay = await start_relay()
    async with relay:
        assert await _resume(ai_sdk, running, "chat-1") == {"resumed": False}
        reading = asyncio.ensure_future(_resume(ai_sdk, running, "chat-1", "?wait=10"))
        # Node has started and its stream waits on the channel for a message.
        await eventually(lambda: bool(relay.hub.subscribers("chat-1")), timeout=30)
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
        # Done before it is asked for again: served whole, under the same id.
        again = await _resume(ai_sdk, running, "chat-1")
        assert (again["id"], again["text"], again["metadata"]) == (got["id"], got["text"], usage)
        assert again["parts"] == ["start", "text-start", "text-delta", "text-end", "finish"]


async def _resume_mid_reply(
    ai_sdk: NodeScript, producer: Any, reader: RunningRelay, chat: str, pieces: list[str]
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

    async def the_rest() -> None:
        for piece in pieces[half:]:
            await send_json(producer, {"id": "r", "delta": piece})
        await send_json(producer, {"id": "r", "final": True})

    # The rest is sent once the AI SDK's stream has joined: it comes live, after the head.
    base = reader.url.replace("ws://", "http://")
    return json.loads(await ai_sdk.run_live(the_rest, base, chat))


async def test_a_resume_in_the_middle_replays_from_start_under_the_same_id(
    ai_sdk: NodeScript,
) -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/produce?channel=chat-2") as producer:
        pieces = [f"{n} " for n in range(40)]
        got = await _resume_mid_reply(ai_sdk, producer, running, "chat-2", pieces)
        assert (got["id"], got["text"]) == ("r", "".join(pieces))
        # The head came as one delta of the text so far, then the live ones, once each.
        assert got["parts"].count("start") == 1 and got["parts"].count("text-start") == 1


async def test_stop_reaches_the_producer_and_an_abort_ends_the_stream(ai_sdk: NodeScript) -> None:
    running, relay = await start_relay(session_grace=0)
    async with relay:
        assert await _post(running, "/ai-sdk/chat-3/stop") == 404
        async with running.connect("/produce?channel=chat-3") as producer:
            await send_json(producer, {"id": "long", "delta": "thinking"})
            await asyncio.sleep(0.1)
            reading = asyncio.ensure_future(_resume(ai_sdk, running, "chat-3"))
            await eventually(lambda: bool(relay.hub.subscribers("chat-3")), timeout=30)
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
    ai_sdk: NodeScript, redis_server: RedisServer
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
CHAT_APP = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "chat-app.md"


async def test_the_documented_nextjs_route_answers_use_chat(js_clients: Path) -> None:
    """The chat-app tutorial's Next.js route, type-checked strictly and run as useChat drives it."""
    route = INTEGRATIONS / "nextjs_route.ts"
    # The tutorial prints this very file: it includes it when the site is built.
    assert '--8<-- "client_demo/integrations/nextjs_route.ts"' in CHAT_APP.read_text()
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


async def test_the_documented_fastapi_app_answers_use_chat_and_stops_its_model(
    js_clients: Path,
) -> None:
    """The chat-app tutorial's FastAPI app, served by uvicorn, answering the AI SDK's
    transport; a Stop pressed on the relay mid-reply closes its model and ends the reply
    cancelled."""
    assert (INTEGRATIONS / "fastapi_app.py").is_file()
    assert '--8<-- "client_demo/integrations/fastapi_app.py"' in CHAT_APP.read_text()
    running, relay = await start_relay()
    relay_url = running.url.replace("ws://", "http://")
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "uvicorn", "fastapi_app:app", "--app-dir", str(INTEGRATIONS),
        "--port", str(port), "--log-level", "warning",
        stdout=asyncio.subprocess.PIPE, env={**os.environ, "RELAY_URL": relay_url},
    )  # fmt: skip
    assert server.stdout is not None
    long_question = " ".join(f"word{index}" for index in range(60))
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
            api = f"http://127.0.0.1:{port}/api/chat"
            node = await asyncio.create_subprocess_exec(
                "node", str(js_clients / "use_chat.mjs"), api, "chat-py",
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await asyncio.wait_for(node.communicate(), 30)
            assert node.returncode == 0
            got = json.loads(out)
            assert got["text"] == "You said: hi "
            stored = await recv_json(sub)  # what the app's backend would keep
            assert (stored["id"], stored["text"]) == (got["id"], got["text"])

            # Stop, pressed on the relay while the model echoes 62 words, 50 ms apart.
            node = await asyncio.create_subprocess_exec(
                "node", str(js_clients / "use_chat_stopped.mjs"), api, "chat-py",
                long_question, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            assert node.stdout is not None
            replying = json.loads(await asyncio.wait_for(node.stdout.readline(), 30))
            reply_id = replying["replying"]
            assert await _post(running, f"/ai-sdk/chat-py/stop?id={reply_id}") == 204
            model_said = await asyncio.wait_for(server.stdout.readline(), 30)
            cut = await _ended(sub)
            out, _ = await asyncio.wait_for(node.communicate(), 30)
            assert node.returncode == 0
            held = json.loads(out)
    finally:
        server.terminate()
        await server.wait()
    # The model's generator was closed before its end: a real client closes its request there.
    assert model_said == b"model: stopped (1 messages)\n"
    assert (cut["type"], cut["id"], cut["reason"]) == ("aborted", reply_id, "cancelled")
    whole = f"You said: {long_question} "
    assert whole.startswith(cut["text"]) and 0 < len(cut["text"]) < len(whole)
    # The page holds the reply as far as it got, still streaming, as the AI SDK leaves a Stop.
    assert held["id"] == reply_id
    assert held["parts"] == [{"type": "text", "text": cut["text"], "state": "streaming"}]


async def _ended(sub: Any) -> dict[str, Any]:
    """The next ``message`` or ``aborted`` frame of a subscriber."""
    while True:
        frame = await recv_json(sub, 10)
        if frame["type"] in ("message", "aborted"):
            return frame


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
                {"type": "text-start", "id": "text"},
                {"type": "text-delta", "id": "text", "delta": "so far"},
            ]


async def test_a_stream_whose_reply_a_rolling_restart_interrupts_is_cut_not_ended(
    redis_server: RedisServer,
) -> None:
    # On Redis a stopping process hands its producers off: their replies go on elsewhere,
    # and its streams of them end unfinished. A UI message stream that ends cleanly reads
    # to the AI SDK as a reply that is over: a page would keep the partial reply as if
    # whole. Cut, it reads as the network's, which the SDK marks resumable. (It was ended:
    # ": closed 1012 …", then the last chunk.)
    running, relay = await start_relay(broker=redis_server.url)
    port = int(running.url.rsplit(":", 1)[1])
    async with running.connect("/produce?channel=chat-cut") as producer:
        await send_json(producer, {"id": "m", "delta": "so far"})
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ai-sdk/chat-cut/stream HTTP/1.1\r\nHost: r\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower()
        body = await asyncio.wait_for(reader.readuntil(b'"delta":"so far"}\n\n'), 5)
        await relay.stop()
        with contextlib.suppress(ConnectionError):
            body += await asyncio.wait_for(reader.read(), 5)
        writer.close()
    assert b'"finish"' not in body and b"[DONE]" not in body and b": closed" not in body
    assert not body.endswith(b"0\r\n\r\n"), body[-80:]


# ---------------------------------------------------------------------- completed first


async def _parts(running: RunningRelay, path: str) -> tuple[int, list[Any]]:
    """The status of an AI SDK stream, and every part it sent (``[DONE]`` as a string)."""
    port = int(running.url.rsplit(":", 1)[1])
    async with SseReader(port, path) as sse:
        parts: list[Any] = []
        if sse.status == 200:
            while True:
                try:
                    event = await sse.next()
                except EOFError:
                    break
                parts.append(event.data if event.data == "[DONE]" else event.json())
        return sse.status, parts


def _whole(message_id: str, text: str, end: list[Any]) -> list[Any]:
    return [
        {"type": "start", "messageId": message_id},
        {"type": "text-start", "id": "text"},
        {"type": "text-delta", "id": "text", "delta": text},
        *end,
        "[DONE]",
    ]


async def _complete(running: RunningRelay, channel: str, message_id: str, text: str) -> None:
    async with running.connect(f"/produce?channel={channel}") as producer:
        await send_json(producer, {"id": message_id, "delta": text})
        await send_json(producer, {"id": message_id, "final": True, "meta": {"n": message_id}})
        assert (await recv_json(producer))["type"] == "ack"


async def test_a_reply_that_completed_before_it_was_asked_for_is_served_whole() -> None:
    running, relay = await start_relay()
    async with relay:
        assert await _parts(running, "/ai-sdk/first/stream") == (204, [])
        await _complete(running, "first", "r1", "the whole ✓ reply")
        await _complete(running, "first", "r2", "a newer one")
        finish = [{"type": "text-end", "id": "text"}, {"type": "finish"}]
        r1 = [finish[0], {**finish[1], "messageMetadata": {"n": "r1"}}]
        r2 = [finish[0], {**finish[1], "messageMetadata": {"n": "r2"}}]
        # The newest, without an id; the one asked for, by its id; twice each.
        for _ in range(2):
            assert await _parts(running, "/ai-sdk/first/stream") == (
                200,
                _whole("r2", "a newer one", r2),
            )
            assert await _parts(running, "/ai-sdk/first/stream?id=r1") == (
                200,
                _whole("r1", "the whole ✓ reply", r1),
            )
        # An id that history does not hold, and another channel: nothing to serve.
        assert await _parts(running, "/ai-sdk/first/stream?id=r3") == (204, [])
        assert await _parts(running, "/ai-sdk/other/stream") == (204, [])
        # ?wait= waits for a new reply, not the one done: here r3, which starts meanwhile.
        waiting = asyncio.ensure_future(_parts(running, "/ai-sdk/first/stream?wait=10"))
        hub = running.relay.subscribers.router.hub
        await eventually(lambda: bool(hub.subscribers("first")), what="the stream joined")
        await _complete(running, "first", "r3", "the next one")
        r3 = [finish[0], {**finish[1], "messageMetadata": {"n": "r3"}}]
        assert await waiting == (200, _whole("r3", "the next one", r3))


async def test_an_aborted_reply_that_ended_first_is_served_as_its_abort() -> None:
    running, relay = await start_relay(session_grace=0)
    async with relay:
        async with running.connect("/produce?channel=cut") as producer:
            await send_json(producer, {"id": "half", "delta": "half a"})
            async with running.connect("/subscribe?channel=cut&deltas=1") as probe:
                assert [(await recv_json(probe))["type"] for _ in range(2)] == [
                    "subscribed",
                    "snapshot",
                ]
        # The producer went away without a final: once the abort is in history, it is served.
        async with running.connect("/subscribe?channel=cut&rewind=1") as watcher:
            while (await recv_json(watcher))["type"] != "aborted":
                pass
        abort = [{"type": "abort", "reason": "producer_disconnected"}]
        assert await _parts(running, "/ai-sdk/cut/stream") == (200, _whole("half", "half a", abort))


async def test_outside_the_replay_window_only_an_id_serves_a_completed_reply() -> None:
    running, relay = await start_relay(ai_sdk_replay_window=0)
    async with relay:
        await _complete(running, "late", "old", "long done")
        assert await _parts(running, "/ai-sdk/late/stream") == (204, [])
        status, parts = await _parts(running, "/ai-sdk/late/stream?id=old")
        assert (status, parts[2]["delta"], parts[-1]) == (200, "long done", "[DONE]")


async def test_a_reply_completed_on_another_process_is_served_through_redis(
    redis_server: RedisServer,
) -> None:
    flags = ("--broker", redis_server.url)
    a, b = relay_process(*flags), relay_process(*flags, "--ai-sdk-replay-window", "0")
    await asyncio.gather(a.start(), b.start())
    try:
        on_a = RunningRelay(None, a.url)  # type: ignore[arg-type]
        on_b = RunningRelay(None, b.url)  # type: ignore[arg-type]
        await _complete(on_a, "shared", "s1", "from a")
        finish = {"type": "finish", "messageMetadata": {"n": "s1"}}
        end = [{"type": "text-end", "id": "text"}, finish]
        for reader in (on_a, on_b):
            assert await _parts(reader, "/ai-sdk/shared/stream?id=s1") == (
                200,
                _whole("s1", "from a", end),
            )
        assert await _parts(on_a, "/ai-sdk/shared/stream") == (200, _whole("s1", "from a", end))
        assert await _parts(on_b, "/ai-sdk/shared/stream") == (204, [])  # its window is 0
    finally:
        await asyncio.gather(a.stop(), b.stop())


# ---------------------------------------------------------------------- kept alive


class _Counting(Proxy):
    """A proxy that counts the connections clients open through it."""

    accepted = 0

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await super()._accept(reader, writer)


async def _rounds(
    script: NodeScript, running: RunningRelay, chat: str, query: str = ""
) -> tuple[Any, int]:
    """Ten rounds of Node's keep_alive.mjs; what each got, and the sockets Node opened."""
    async with _Counting(int(running.url.rsplit(":", 1)[1])) as proxy:
        out = await script.run(f"http://127.0.0.1:{proxy.port}", chat, "10", query)
        return json.loads(out), proxy.accepted


@pytest.fixture(scope="session", params=AI_MAJORS)
def keep_alive(js_clients: Path, request: pytest.FixtureRequest) -> NodeScript:
    """Node's fetch reusing its pool after the AI SDK's reconnectToStream, at each major."""
    return NodeScript(js_clients / "keep_alive.mjs", request.param)


async def test_node_fetch_reuses_its_pooled_socket_after_a_204(keep_alive: NodeScript) -> None:
    running, relay = await start_relay()
    async with relay:
        rounds, sockets = await _rounds(keep_alive, running, "nothing-here")
    assert rounds == [{"resumed": False, "health": "200 ok"}] * 10
    # 20 requests on the sockets kept alive: Node may open a second while the first is
    # not back in its pool yet, but none is closed under it (each would be a new one).
    assert sockets <= 2, sockets


async def test_node_fetch_reuses_its_pooled_socket_after_a_whole_stream(
    keep_alive: NodeScript,
) -> None:
    running, relay = await start_relay()
    async with relay:
        await _complete(running, "pooled", "p1", "served ten times")
        newest = await _rounds(keep_alive, running, "pooled")
        by_id = await _rounds(keep_alive, running, "pooled", "?id=p1")
    expected = {"resumed": True, "text": "served ten times", "health": "200 ok"}
    assert newest[0] == by_id[0] == [expected] * 10
    assert newest[1] <= 2 and by_id[1] <= 2, (newest[1], by_id[1])  # as after a 204


async def test_a_kept_alive_socket_serves_the_next_request_after_a_whole_stream() -> None:
    running, relay = await start_relay()
    async with relay:
        await _complete(running, "raw", "w1", "whole")
        port = int(running.url.rsplit(":", 1)[1])
        async with SseReader(port, "/ai-sdk/raw/stream") as sse:
            assert sse.response_headers["connection"] == "keep-alive"
            parts = []
            while not sse.ended:
                with contextlib.suppress(EOFError):
                    parts.append((await sse.next()).data)
            assert parts[-1] == "[DONE]"
            # The same socket, its next request.
            client = sse._http
            client.start_next_cycle()
            assert sse._writer is not None
            sse._writer.write(
                client.send(h11.Request(method="GET", target="/healthz", headers=[("Host", "r")]))
                + client.send(h11.EndOfMessage())
            )
            response = await sse._next_http()
            body = await sse._next_http()
        assert (response.status_code, bytes(body.data)) == (200, b"ok\n")
