"""The AI SDK's ``WebSocketChatTransport`` against ``ws://HOST/ai-sdk/ws``, over real sockets:
the package's own transport (``ai`` 7, in Node) sends a chat's message, a Python gateway
(:class:`~token_relay.client.RelayProducer`) answers it by streaming a structured reply, and
the app holds exactly the relay's parts; resume mid-reply; Stop reaching the producer;
``lastSequence`` after a cut; ``no-active``; ``error`` when no producer listens; bad frames,
tokens and bounds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from token_relay.client import RelayProducer
from token_relay.client import producer as producer_module
from token_relay.core.grants import Role
from token_relay.core.protocol import Cancel, ChatRequest
from token_relay.edge.aisdkws import MAX_REQUESTS
from token_relay.tokens import mint
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from ..conftest import RunningRelay, recv_json, send_json, start_relay
from ..docs.blocks import docs_block
from ..harness import eventually
from .test_docs_samples import _substitute

CHAT = "chat-1"
QUESTION = {
    "id": "u1",
    "role": "user",
    "parts": [{"type": "text", "text": "What is the weather in Paris?"}],
}
SECRET = "ai-sdk-ws-secret-of-at-least-32-bytes!!"

Gateway = Callable[[RelayProducer, ChatRequest], Awaitable[None]]


async def _node(js_clients: Path, *args: str, stdin: bytes | None = None) -> Any:
    """Run ws_chat.mjs (the AI SDK's own transport) to its end; its JSON line."""
    node = await asyncio.create_subprocess_exec(
        "node", "--experimental-websocket", str(js_clients / "ws_chat.mjs"), *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "AI_PACKAGE": "ai"},
    )  # fmt: skip
    out, _ = await asyncio.wait_for(node.communicate(stdin), 60)
    assert node.returncode == 0
    return json.loads(out.splitlines()[-1])


async def _ui_parts(js_clients: Path, chunks: list[dict[str, Any]]) -> Any:
    """The parts ``readUIMessageStream`` builds of ``chunks`` (between start and finish)."""
    node = await asyncio.create_subprocess_exec(
        "node", str(js_clients / "ui_parts.mjs"),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "AI_PACKAGE": "ai"},
    )  # fmt: skip
    case = [{"name": "read", "chunks": chunks}]
    out, _ = await asyncio.wait_for(node.communicate(json.dumps(case).encode()), 60)
    line = json.loads(out)
    assert "error" not in line, line
    return line["parts"]


def _ws(running: RunningRelay) -> str:
    return running.url + "/ai-sdk/ws"


@asynccontextmanager
async def _relay(**settings: Any) -> AsyncIterator[RunningRelay]:
    running, relay = await start_relay(**settings)
    async with relay:
        yield running


@asynccontextmanager
async def _gateway(
    running: RunningRelay, answer: Gateway, chat: str = CHAT
) -> AsyncIterator[list[ChatRequest]]:
    """A Python gateway on ``chat``'s channel, answering each request with ``answer``; yields
    the requests it got."""
    got: list[ChatRequest] = []

    async def serve(producer: RelayProducer) -> None:
        async for request in producer.requests():
            got.append(request)
            await answer(producer, request)

    async with RelayProducer(running.url, channel=chat) as producer:
        await eventually(lambda: takes_requests(running, chat))
        task = asyncio.create_task(serve(producer))
        try:
            yield got
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def takes_requests(running: RunningRelay, chat: str) -> bool:
    """Whether a producer of the relay (in this process) takes ``chat``'s requests."""
    return any(channel == chat for channel, _ in running.relay.producers.takers.values())


async def _ended(sub: Any) -> dict[str, Any]:
    """The next ``message`` or ``aborted`` frame of a subscriber."""
    while True:
        frame = await recv_json(sub, 10)
        if frame["type"] in ("message", "aborted"):
            return frame


STRUCTURED_HEAD = [
    {"type": "reasoning-start", "id": "r1"},
    {"type": "reasoning-delta", "id": "r1", "delta": "The user wants "},
    {"type": "reasoning-delta", "id": "r1", "delta": "the weather."},
    {"type": "reasoning-end", "id": "r1"},
    {"type": "tool-input-start", "toolCallId": "call-1", "toolName": "weather"},
    {"type": "tool-input-delta", "toolCallId": "call-1", "inputTextDelta": '{"city":'},
]
STRUCTURED_TAIL = [
    {"type": "tool-input-delta", "toolCallId": "call-1", "inputTextDelta": '"Paris"}'},
    {"type": "tool-input-available", "toolCallId": "call-1", "toolName": "weather",
     "input": {"city": "Paris"}},
    {"type": "tool-output-available", "toolCallId": "call-1", "output": {"celsius": 21}},
    {"type": "text-start", "id": "t1"},
    {"type": "text-delta", "id": "t1", "delta": "It is 21 °C "},
    {"type": "text-delta", "id": "t1", "delta": "in Paris 🌤."},
    {"type": "text-end", "id": "t1"},
]  # fmt: skip


def _paced(*pauses: tuple[int, asyncio.Event]) -> Gateway:
    """A gateway answering with the structured reply, that waits for each ``(n, event)``'s
    event before it sends the reply's ``n``-th chunk, then finishes."""

    async def answer(producer: RelayProducer, request: ChatRequest) -> None:
        waits = dict(pauses)
        for n, chunk in enumerate([*STRUCTURED_HEAD, *STRUCTURED_TAIL]):
            if n in waits:
                await waits[n].wait()
            await producer.send_chunk(request.id, chunk, channel=request.channel)
        await producer.finish(request.id, channel=request.channel)

    return answer


def _until_stopped(cancelled: list[Cancel], stopped: asyncio.Event, pause: float) -> Gateway:
    """A gateway answering with up to 2,000 words, one every ``pause`` seconds, until a Stop
    (noted in ``cancelled``, and ``stopped`` set) reaches it; then it finishes."""

    async def answer(producer: RelayProducer, request: ChatRequest) -> None:
        async def watch() -> None:
            async for cancel in producer.cancellations():
                cancelled.append(cancel)
                stopped.set()
                return

        watching = asyncio.create_task(watch())
        for _ in range(2000):
            if stopped.is_set():
                break
            await producer.send(request.id, "word ", channel=request.channel)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), pause)
        await producer.finish(request.id, channel=request.channel)
        watching.cancel()

    return answer


_structured = _paced()
HALF = len(STRUCTURED_HEAD)


async def test_send_streams_the_gateways_structured_reply(js_clients: Path) -> None:
    async with (
        _relay() as running,
        _gateway(running, _structured) as requests,
        connect(f"{running.url}/subscribe?channel={CHAT}") as sub,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        held = await _node(js_clients, "send", _ws(running), CHAT)
        relayed = await _ended(sub)
    assert held["ok"], held
    assert held["parts"] == relayed["parts"]
    assert held["id"] == relayed["id"] == requests[0].id
    assert [part["type"] for part in held["parts"]] == ["reasoning", "tool-weather", "text"]
    assert held["chunks"][0] == "start" and held["chunks"][-1] == "finish"
    (request,) = requests
    assert request.channel == CHAT
    assert request.trigger == "submit-message"
    assert request.messages == [QUESTION]
    assert request.body == {"app": "test"}


async def test_resume_mid_reply_replays_it_exactly(js_clients: Path) -> None:
    go_on = asyncio.Event()
    halfway = _paced((HALF, go_on))

    async with (
        _relay() as running,
        _gateway(running, halfway),
        connect(f"{running.url}/subscribe?channel={CHAT}&deltas=1") as sub,
        connect(_ws(running)) as sender,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        await send_json(sender, _send("first"))
        # The reply is under way: its head is applied.
        await eventually(
            lambda: any(c["type"] == "tool-input-delta" for c in _live_chunks(running))
        )
        relay = running.relay
        resuming = asyncio.create_task(_node(js_clients, "resume", _ws(running), CHAT))
        # The resume has joined: three deltas subscribers (the raw one, the sender's, its own).
        await eventually(lambda: len(relay.hub.delta_subscribers(CHAT)) == 3, timeout=30)
        go_on.set()
        held = await resuming
        relayed = await _ended(sub)
    assert held["resumed"]
    assert held["parts"] == relayed["parts"]
    assert held["id"] == relayed["id"]
    # Never a part twice: one start per part, one start of the message.
    assert held["chunks"].count("start") == 1
    assert held["chunks"].count("reasoning-start") == 1
    assert held["chunks"].count("tool-input-start") == 1
    assert held["chunks"].count("text-start") == 1


def _live_chunks(running: RunningRelay) -> list[dict[str, Any]]:
    """The catch-up chunks of the one reply in progress, or []."""
    owned = running.relay.owned_messages()
    if not owned:
        return []
    _, owner, message_id = owned[0]
    parts = running.relay.live_parts(owner, message_id)
    return [] if parts is None else parts[1]


def _send(request_id: str, chat: str = CHAT) -> dict[str, Any]:
    return {
        "type": "send",
        "requestId": request_id,
        "id": chat,
        "trigger": "submit-message",
        "messages": [QUESTION],
        "headers": {},
        "body": {},
    }


async def test_abort_reaches_the_producer_and_ends_the_reply(js_clients: Path) -> None:
    cancelled: list[Cancel] = []
    stopped = asyncio.Event()

    endless = _until_stopped(cancelled, stopped, 0.005)

    async with (
        _relay() as running,
        _gateway(running, endless) as requests,
        connect(f"{running.url}/subscribe?channel={CHAT}") as sub,
    ):
        held, relayed = await stop_mid_reply(js_clients, _ws(running), sub, stopped)
    assert_stopped_early(held, relayed, cancelled, requests)


async def stop_mid_reply(
    js_clients: Path, url: str, sub: Any, stopped: asyncio.Event
) -> tuple[Any, dict[str, Any]]:
    """Send with the AI SDK's transport at ``url`` and press Stop once text arrives; what
    the app held, and the reply as the subscriber ``sub`` got it."""
    assert (await recv_json(sub))["type"] == "subscribed"
    node = asyncio.create_task(_node(js_clients, "abort", url, CHAT, stdin=b"x\n"))
    await asyncio.wait_for(stopped.wait(), 30)
    relayed = await _ended(sub)
    return await node, relayed


def assert_stopped_early(
    held: Any, relayed: dict[str, Any], cancelled: list[Cancel], requests: list[ChatRequest]
) -> None:
    """The Stop reached the gateway as one cancel of its reply, which ended early."""
    assert held["aborted"] and held["text"].startswith("word")
    (cancel,) = cancelled
    assert (cancel.channel, cancel.id) == (CHAT, requests[0].id)
    assert relayed["id"] == requests[0].id
    assert relayed["text"].count("word") < 2000  # the reply ended early


async def _frames_until_end(ws: Any) -> list[dict[str, Any]]:
    frames = []
    while True:
        frame = await recv_json(ws, 10)
        frames.append(frame)
        if frame["type"] in ("end", "error", "no-active"):
            return frames


async def test_resume_with_last_sequence_after_a_cut(js_clients: Path) -> None:
    cut_done, finish_now = asyncio.Event(), asyncio.Event()

    # During the cut: the tail's chunks up to the text's first delta.
    in_three = _paced((HALF, cut_done), (HALF + 5, finish_now))

    async with (
        _relay() as running,
        _gateway(running, in_three),
        connect(f"{running.url}/subscribe?channel={CHAT}") as sub,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        first: list[dict[str, Any]] = []
        async with connect(_ws(running)) as ws:
            await send_json(ws, _send("req-1"))
            assert await recv_json(ws) == {"type": "start", "requestId": "req-1"}
            # start, reasoning (start, 2 deltas, end), tool-input-start, its first delta: 7
            while len(first) < 5:
                first.append(await recv_json(ws))
        # Cut after sequence 4 (the second reasoning delta); chunks 5 and 6 may have been
        # sent and lost, as on a real cut.
        held_up_to = first[-1]["sequence"]
        assert [f["sequence"] for f in first] == [0, 1, 2, 3, 4]
        cut_done.set()
        await eventually(lambda: _text_started(running))
        async with connect(_ws(running)) as ws:
            resume = {"type": "resume", "requestId": "req-1", "id": CHAT,
                      "lastSequence": held_up_to, "headers": {}, "body": {}}  # fmt: skip
            await send_json(ws, resume)
            assert await recv_json(ws) == {"type": "start", "requestId": "req-1"}
            caught_up = await recv_json(ws)
            finish_now.set()
            rest = [caught_up, *await _frames_until_end(ws)]
        relayed = await _ended(sub)
    chunks = [f for f in rest if f["type"] == "chunk"]
    assert rest[-1] == {"type": "end", "requestId": "req-1"}
    assert [f["sequence"] for f in chunks] == list(range(5, 5 + len(chunks)))
    whole = [f["chunk"] for f in first + chunks]
    assert whole[0] == {"type": "start", "messageId": relayed["id"]}
    assert whole[-1]["type"] == "finish"
    # What a reader of chunks 0 to 4, then the resumed ones, holds: exactly the relay's parts.
    assert await _ui_parts(js_clients, whole[1:-1]) == relayed["parts"]
    # Nothing it held came again: the reasoning's text once, the tool's start once.
    assert [c["type"] for c in whole].count("reasoning-start") == 1
    assert [c["type"] for c in whole].count("tool-input-start") == 1
    reasoning = "".join(c["delta"] for c in whole if c["type"] == "reasoning-delta")
    assert reasoning == "The user wants the weather."


def _text_started(running: RunningRelay) -> bool:
    return "It is" in json.dumps(_live_chunks(running), ensure_ascii=False)


async def test_last_sequence_of_a_reply_that_ended_during_the_cut(js_clients: Path) -> None:
    cut_done = asyncio.Event()

    in_two = _paced((HALF, cut_done))

    async with (
        _relay() as running,
        _gateway(running, in_two),
        connect(f"{running.url}/subscribe?channel={CHAT}") as sub,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        async with connect(_ws(running)) as ws:
            await send_json(ws, _send("req-2"))
            await recv_json(ws)
            first = [await recv_json(ws) for _ in range(3)]  # start, reasoning-start, a delta
        cut_done.set()
        relayed = await _ended(sub)  # the reply completed while the reader was away
        async with connect(_ws(running)) as ws:
            resume = {"type": "resume", "requestId": "req-2", "id": CHAT,
                      "lastSequence": 2, "headers": {}, "body": {}}  # fmt: skip
            await send_json(ws, resume)
            assert await recv_json(ws) == {"type": "start", "requestId": "req-2"}
            rest = await _frames_until_end(ws)
    chunks = [f for f in rest if f["type"] == "chunk"]
    assert [f["sequence"] for f in chunks] == list(range(3, 3 + len(chunks)))
    whole = [f["chunk"] for f in first + chunks]
    assert whole[-1]["type"] == "finish"
    assert await _ui_parts(js_clients, whole[1:-1]) == relayed["parts"]


async def test_resume_with_nothing_in_progress_is_no_active(js_clients: Path) -> None:
    async with _relay() as running:
        held = await _node(js_clients, "resume", _ws(running), CHAT)
        async with connect(_ws(running)) as ws:
            await send_json(ws, {"type": "resume", "requestId": "q", "id": CHAT})
            assert await recv_json(ws) == {"type": "no-active", "requestId": "q"}
    assert held == {"resumed": False}


async def test_send_with_no_producer_is_an_error(js_clients: Path) -> None:
    async with _relay() as running:
        held = await _node(js_clients, "send", _ws(running), CHAT)
    assert not held["ok"]
    assert held["error"] == f"no_producer: no producer listens on channel '{CHAT}'"


async def test_unknown_sequence_and_bad_frames() -> None:
    async with _relay() as running, connect(_ws(running)) as ws:
        resume = {"type": "resume", "requestId": "never", "id": CHAT, "lastSequence": 3}
        await send_json(ws, resume)
        frame = await recv_json(ws)
        assert frame["type"] == "error" and frame["requestId"] == "never"
        assert frame["errorText"].startswith("unknown_sequence: ")
        await send_json(ws, {"type": "send", "requestId": "bad", "id": CHAT})
        frame = await recv_json(ws)
        assert frame["type"] == "error" and frame["requestId"] == "bad"
        assert frame["errorText"].startswith("invalid_frame: ")
        await send_json(ws, {"type": "resume", "requestId": "neg", "id": CHAT, "lastSequence": -1})
        assert (await recv_json(ws))["errorText"].startswith("invalid_frame: lastSequence")
        await ws.send("not json")
        with pytest.raises(ConnectionClosed):
            await recv_json(ws)
        assert ws.close_code == 1008


async def test_one_request_per_chat_and_bounded_requests() -> None:
    async with _relay() as running, RelayProducer(running.url, channel=CHAT):
        await eventually(lambda: takes_requests(running, CHAT))
        async with connect(_ws(running)) as ws:
            await send_json(ws, _send("a"))
            await send_json(ws, _send("b"))
            frame = await recv_json(ws)
            assert frame["requestId"] == "b"
            assert frame["errorText"].startswith("request_in_progress: ")
            for index in range(MAX_REQUESTS):
                resume = {"type": "resume", "requestId": f"r{index}", "id": f"other-{index}"}
                await send_json(ws, resume)
            frames = [await recv_json(ws) for _ in range(MAX_REQUESTS)]
            assert all(frame["type"] == "no-active" for frame in frames)


async def test_the_token_must_grant_the_chat() -> None:
    async with _relay(secret=SECRET) as running:
        token = mint(SECRET, Role.SUBSCRIBE, ["mine"], 60)
        async with connect(f"{_ws(running)}?token={token}") as ws:
            await send_json(ws, {"type": "resume", "requestId": "x", "id": "theirs"})
            frame = await recv_json(ws)
            assert frame["requestId"] == "x" and frame["errorText"].startswith("forbidden: ")
            await send_json(ws, {"type": "resume", "requestId": "y", "id": "mine"})
            assert await recv_json(ws) == {"type": "no-active", "requestId": "y"}
        with pytest.raises(Exception, match="401"):
            async with connect(_ws(running)):
                pass


async def test_the_documented_gateway_client_and_frames_are_what_runs(
    js_clients: Path, tmp_path: Path
) -> None:
    async with _relay() as running:
        port = int(running.url.rsplit(":", 1)[1])
        gateway_file = tmp_path / "gateway.py"
        gateway_file.write_text(_substitute(docs_block("ai-sdk-ws-gateway"), {8765: port}))
        gateway = await asyncio.create_subprocess_exec(sys.executable, str(gateway_file))
        try:
            await eventually(lambda: takes_requests(running, "chat-42"), 30)
            client_file = js_clients / "doc_ws_client.mjs"
            client_file.write_text(_substitute(docs_block("ai-sdk-ws-client"), {8765: port}))
            node = await asyncio.create_subprocess_exec(
                "node", "--experimental-websocket", str(client_file),
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await asyncio.wait_for(node.communicate(), 60)
            assert node.returncode == 0
            assert out.decode().splitlines()[-1] == "Hello, world"
            async with connect(_ws(running)) as ws:
                await send_json(ws, _send("r1", "chat-42"))
                frames = [json.dumps(f, ensure_ascii=False, separators=(",", ":"))
                          for f in await _frames_until_end(ws)]  # fmt: skip
        finally:
            gateway.kill()
            await gateway.wait()
    printed = docs_block("ai-sdk-ws-frames").splitlines()
    reply_id = json.loads(printed[1])["chunk"]["messageId"]
    got_id = json.loads(frames[1])["chunk"]["messageId"]
    assert re.fullmatch(r"chat-[A-Za-z0-9_-]{16}", got_id)
    assert [line.replace(got_id, reply_id) for line in frames] == printed


GATEWAY_RECIPE = Path(__file__).resolve().parents[2] / "client_demo/integrations/ws_gateway.py"


async def test_the_gateway_recipe_answers_and_stops(js_clients: Path) -> None:
    long_question = " ".join(f"word{index}" for index in range(60))
    async with (
        _relay() as running,
        connect(f"{running.url}/subscribe?channel={CHAT}") as sub,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        environment = {**os.environ, "RELAY_URL": running.url, "CHAT_ID": CHAT}
        gateway = await asyncio.create_subprocess_exec(
            sys.executable, str(GATEWAY_RECIPE), env=environment
        )
        try:
            await eventually(lambda: takes_requests(running, CHAT), 30)
            held = await _node(js_clients, "send", _ws(running), CHAT)
            relayed = await _ended(sub)
            assert held["ok"], held
            assert held["parts"] == relayed["parts"]
            reasoning, text = held["parts"]
            assert (reasoning["type"], reasoning["text"]) == ("reasoning", "An echo.")
            assert text["text"] == "You said: What is the weather in Paris? "
            # Stop while it echoes 62 words, 50 ms apart: the reply ends early, completed.
            stopped = await _node(
                js_clients, "abort", _ws(running), CHAT, long_question, stdin=b"x\n"
            )
            cut = await _ended(sub)
        finally:
            gateway.kill()
            await gateway.wait()
    assert stopped["aborted"] and stopped["text"] == "You "
    whole = f"You said: {long_question} "
    assert cut["type"] == "message" and cut["text"].startswith("You ")
    assert whole.startswith(cut["text"]) and len(cut["text"]) < len(whole)


async def test_a_resumed_reply_can_be_stopped() -> None:
    async with (
        _relay() as running,
        running.connect(f"/produce?channel={CHAT}") as producer,
        connect(_ws(running)) as ws,
    ):
        await send_json(producer, {"id": "m1", "delta": "so far"})
        await eventually(lambda: len(running.relay.owned_messages()) == 1)
        await send_json(ws, {"type": "resume", "requestId": "q1", "id": CHAT})
        assert await recv_json(ws) == {"type": "start", "requestId": "q1"}
        replayed = [await recv_json(ws) for _ in range(3)]
        assert [f["chunk"] for f in replayed] == [
            {"type": "start", "messageId": "m1"},
            {"type": "text-start", "id": "text"},
            {"type": "text-delta", "id": "text", "delta": "so far"},
        ]
        await send_json(ws, {"type": "abort", "requestId": "q1"})
        assert await recv_json(producer) == {"type": "cancel", "channel": CHAT, "id": "m1"}
        await send_json(producer, {"id": "m1", "final": True})
        rest = await _frames_until_end(ws)
    assert [f["chunk"]["type"] for f in rest[:-1]] == ["text-end", "finish"]
    assert [f["sequence"] for f in rest[:-1]] == [3, 4]
    assert rest[-1] == {"type": "end", "requestId": "q1"}


async def test_a_request_past_the_gateways_unread_bound_is_refused_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(producer_module, "MAX_UNREAD_REQUESTS", 2)
    async with (
        _relay() as running,
        RelayProducer(running.url, channel=CHAT) as gateway,
        connect(f"{running.url}/subscribe?channel={CHAT}") as sub,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        await eventually(lambda: takes_requests(running, CHAT))
        transports = [await connect(_ws(running)) for _ in range(3)]
        try:
            for index, ws in enumerate(transports[:2]):
                await send_json(ws, _send(f"r{index}"))
                await eventually(lambda n=index + 1: gateway.unread_requests == n)
            await send_json(transports[2], _send("r2"))
            # The third is past the two the gateway holds unread: its reply ends at once.
            refused = await _ended(sub)
            frames = await _frames_until_end(transports[2])
            unread = gateway.requests()
            held = [await anext(unread), await anext(unread)]
        finally:
            for ws in transports:
                await ws.close()
    assert refused["type"] == "aborted" and refused["reason"] == "error"
    assert refused["meta"]["errorText"].startswith("the gateway has 2 chat requests")
    assert [request.request for request in held] == ["r0", "r1"]
    chunks = [frame["chunk"] for frame in frames if frame["type"] == "chunk"]
    assert {"type": "error", "errorText": refused["meta"]["errorText"]} in chunks
    assert frames[-1] == {"type": "end", "requestId": "r2"}
