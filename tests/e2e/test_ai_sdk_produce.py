"""The AI SDK's producer route, ``POST /ai-sdk/{channel}/produce``, over real sockets: a
reply built by the real ``ai`` package in Node (``createUIMessageStream``,
``createUIMessageStreamResponse``) posted as it is generated, its parts exactly what
``readUIMessageStream`` builds of the same chunks; chunks applied as they arrive; Stop
answering the request before its body ends; the message-level chunks; bad input, bounds and
tokens."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from token_relay.core.grants import Role
from token_relay.edge.relay import Relay
from token_relay.tokens import mint

from ..conftest import RunningRelay, recv_json, send_json, start_relay, subscribed_pair
from ..docs.blocks import docs_block
from ..harness import SseReader, eventually
from .test_ai_sdk import AI_MAJORS, NodeScript, _resume
from .test_docs_samples import _run, _substitute

REPLY_TEXT = "It is 21 °C in Paris 🌤."
SECRET = "ai-sdk-produce-secret-of-at-least-32-bytes"


def _port(running: RunningRelay) -> int:
    return int(running.url.rsplit(":", 1)[1])


def _base(running: RunningRelay) -> str:
    return running.url.replace("ws://", "http://")


@pytest.fixture(scope="session", params=AI_MAJORS)
def producer_script(js_clients: Path, request: pytest.FixtureRequest) -> NodeScript:
    """The reply posted by the AI SDK itself, in Node, at each major."""
    return NodeScript(js_clients / "ai_sdk_produce.mjs", request.param)


@pytest.fixture(scope="session")
def resume_script(js_clients: Path) -> NodeScript:
    return NodeScript(js_clients / "ai_sdk_resume.mjs", "ai")


class Interactive:
    """A Node script run with pipes: its JSON lines read one by one, lines written to it."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def line(self) -> Any:
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), 30)
        assert raw, "the script ended without a line"
        return json.loads(raw)

    async def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        await self.process.stdin.drain()


@asynccontextmanager
async def _interactive(script: NodeScript, *args: str) -> AsyncIterator[Interactive]:
    process = await asyncio.create_subprocess_exec(
        "node", str(script.path), *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "AI_PACKAGE": script.package},
    )  # fmt: skip
    try:
        yield Interactive(process)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _in_progress(relay: Relay, message_id: str) -> None:
    """Wait until the relay holds ``message_id`` in progress (its first chunks applied)."""
    await eventually(
        lambda: message_id in [m for _, _, m in relay.owned_messages()], what=message_id
    )


async def _delta_seen(sub: Any, text: str) -> None:
    """Read the subscriber's frames until live chunks carrying ``text`` came."""
    while True:
        frame = await recv_json(sub, 10)
        if frame["type"] == "chunks" and text in json.dumps(frame, ensure_ascii=False):
            return


async def _ended(sub: Any) -> dict[str, Any]:
    """The next ``message`` or ``aborted`` frame."""
    while True:
        frame = await recv_json(sub, 10)
        if frame["type"] in ("message", "aborted"):
            return frame


async def _post(
    running: RunningRelay, path: str, body: bytes, headers: str = ""
) -> tuple[int, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(running))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Type: text/event-stream\r\n{headers}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    response = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    payload = response.partition(b"\r\n\r\n")[2]
    return int(response.split()[1]), json.loads(payload) if payload[:1] == b"{" else payload


async def _stream(running: RunningRelay, path: str) -> list[str]:
    """Every event's data of the AI SDK stream at ``path``, to its end."""
    datas: list[str] = []
    async with SseReader(_port(running), path) as sse:
        assert sse.status == 200
        while True:
            try:
                datas.append((await sse.next()).data)
            except EOFError:
                return datas


def _sse(*chunks: dict[str, Any] | str) -> bytes:
    """A UI message stream's body: each chunk as ``data: JSON`` and a blank line (a str is
    sent as the data itself)."""
    datas = [chunk if isinstance(chunk, str) else json.dumps(chunk) for chunk in chunks]
    return "".join(f"data: {data}\n\n" for data in datas).encode()


TEXT = [
    {"type": "text-start", "id": "t"},
    {"type": "text-delta", "id": "t", "delta": "Hello"},
    {"type": "text-end", "id": "t"},
]


# ---------------------------------------------------------------------- the real ai package


async def test_a_reply_of_the_ai_package_reaches_subscribers_with_its_exact_parts(
    producer_script: NodeScript, resume_script: NodeScript
) -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe?channel=chat-1") as sub:
        await recv_json(sub)
        got = json.loads(await producer_script.run(_base(running), "chat-1", "reply"))
        frame = await _ended(sub)
        assert frame["type"] == "message"
        # Exactly what readUIMessageStream built of the very same chunks.
        assert (
            (frame["id"], frame["parts"]) == (got["id"], got["parts"]) == ("reply-1", got["parts"])
        )
        assert [part["type"] for part in frame["parts"]] == [
            "step-start", "reasoning", "tool-weather", "step-start", "text", "data-weather",
        ]  # fmt: skip
        assert frame["text"] == REPLY_TEXT
        assert frame["meta"] == {
            "model": "m-1",
            "usage": {"outputTokens": 9},
            "finishReason": "stop",
        }
        assert got["status"] == 200
        assert got["answer"] == {
            "id": "reply-1",
            "channel": "chat-1",
            "outcome": "completed",
            "stopped": False,
            "offset": frame["offset"],
            "epoch": frame["epoch"],
            "errors": [],
        }
        # Read back as a stream by the AI SDK: the same parts, and the metadata with the
        # finish reason, which finish carries too.
        again = await _resume(resume_script, running, "chat-1", "?id=reply-1")
        assert (again["id"], again["message"], again["metadata"]) == (
            "reply-1",
            got["parts"],
            {**got["metadata"], "finishReason": "stop"},
        )
        datas = await _stream(running, "/ai-sdk/chat-1/stream?id=reply-1")
        assert datas[-1] == "[DONE]"
        assert json.loads(datas[-2]) == {
            "type": "finish",
            "finishReason": "stop",
            "messageMetadata": frame["meta"],
        }


async def test_chunks_are_applied_as_they_arrive(js_clients: Path) -> None:
    script = NodeScript(js_clients / "ai_sdk_produce.mjs", "ai")
    running, relay = await start_relay()
    async with (
        relay,
        running.connect("/subscribe?channel=chat-2") as sub,
        _interactive(script, _base(running), "chat-2", "slow") as node,
    ):
        await recv_json(sub)
        assert await node.line() == {"event": "sent"}
        # The body is open, and the relay holds its reply in progress already...
        await _in_progress(relay, "slow-1")
        # ...under its id, which no other producer can take meanwhile.
        async with running.connect("/produce?channel=chat-2") as other:
            await send_json(other, {"id": "slow-1", "delta": "x", "final": True})
            refusal = await recv_json(other)
        assert (refusal["code"], refusal["id"]) == ("id_in_use", "slow-1")
        await node.go()
        done = await node.line()
        frame = await _ended(sub)
        assert (frame["type"], frame["id"], frame["text"]) == ("message", "slow-1", REPLY_TEXT)
        assert done["answer"]["outcome"] == "completed"


@pytest.mark.parametrize("how", ["stop", "cancel"])
async def test_stop_answers_the_request_before_its_body_ends(js_clients: Path, how: str) -> None:
    script = NodeScript(js_clients / "ai_sdk_produce.mjs", "ai")
    running, relay = await start_relay()
    async with (
        relay,
        running.connect("/subscribe?channel=chat-3&deltas=1") as sub,
        _interactive(script, _base(running), "chat-3", "stop") as node,
    ):
        await recv_json(sub)
        assert await node.line() == {"event": "sent"}
        await _in_progress(relay, "stop-1")
        # Stop once the head's last chunk is applied: the message is held from its first.
        await _delta_seen(sub, "The user wants ")
        if how == "stop":
            status, _ = await _post(running, "/ai-sdk/chat-3/stop?id=stop-1", b"")
            assert status == 204
        else:
            await send_json(sub, {"type": "cancel", "channel": "chat-3", "id": "stop-1"})
        got = await node.line()
        frame = await _ended(sub)
    # Node held the body open until the answer came: the answer came before it ended.
    assert got["bodyEndedAtAnswer"] is False
    assert (frame["type"], frame["reason"], frame["meta"]) == (
        "aborted",
        "cancelled",
        {"model": "m-1"},
    )
    assert frame["parts"] == [
        {"type": "step-start"},
        {"type": "reasoning", "id": "r1", "text": "The user wants ", "state": "streaming"},
    ]
    assert got["status"] == 200
    assert got["answer"] == {
        "id": "stop-1",
        "channel": "chat-3",
        "outcome": "stopped",
        "stopped": True,
        "reason": "cancelled",
        "offset": frame["offset"],
        "epoch": frame["epoch"],
        "errors": [],
    }


# ---------------------------------------------------------------------- message-level chunks


async def test_the_message_level_chunks() -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        # [DONE] without finish completes it; ?id= names it when start does not.
        status, answer = await _post(running, "/ai-sdk/c/produce?id=a", _sse(*TEXT, "[DONE]"))
        frame = await _ended(sub)
        assert (status, answer["outcome"], answer["id"]) == (200, "completed", "a")
        assert (frame["type"], frame["id"], frame["text"]) == ("message", "a", "Hello")
        # start's messageId wins over ?id=; message-metadata, start's and finish's merge.
        body = _sse(
            {"type": "start", "messageId": "b", "messageMetadata": {"model": "m", "n": 1}},
            {"type": "message-metadata", "messageMetadata": {"n": 2}},
            *TEXT,
            {"type": "finish", "finishReason": "length", "messageMetadata": {"usage": 3}},
            "[DONE]",
        )
        status, answer = await _post(running, "/ai-sdk/c/produce?id=ignored", body)
        frame = await _ended(sub)
        assert (answer["id"], frame["id"]) == ("b", "b")
        assert frame["meta"] == {"model": "m", "n": 2, "usage": 3, "finishReason": "length"}
        # abort: aborted, cancelled; what comes after the end changes nothing.
        body = _sse({"type": "start", "messageId": "c"}, *TEXT[:2], {"type": "abort"}, "[DONE]")
        status, answer = await _post(running, "/ai-sdk/c/produce", body)
        frame = await _ended(sub)
        assert (frame["type"], frame["reason"], frame["text"]) == ("aborted", "cancelled", "Hello")
        assert (answer["outcome"], answer["reason"], answer["stopped"]) == (
            "aborted",
            "cancelled",
            False,
        )
        # error: kept in meta; the message takes chunks after it, and ends aborted, error.
        body = _sse(
            {"type": "start", "messageId": "d"},
            *TEXT[:2],
            {"type": "error", "errorText": "the model failed"},
            {"type": "text-delta", "id": "t", "delta": "!"},
            {"type": "finish", "finishReason": "error"},
            "[DONE]",
        )
        status, answer = await _post(running, "/ai-sdk/c/produce", body)
        frame = await _ended(sub)
        assert (frame["type"], frame["reason"], frame["text"]) == ("aborted", "error", "Hello!")
        assert frame["meta"] == {"errorText": "the model failed", "finishReason": "error"}
        assert (answer["outcome"], answer["reason"], answer["offset"]) == (
            "aborted",
            "error",
            frame["offset"],
        )
        # The AI SDK stream ends it with its error, as it came.
        datas = await _stream(running, "/ai-sdk/c/stream?id=d")
        assert datas[-2:] == [json.dumps({"type": "error", "errorText": "the model failed"},
                                          separators=(",", ":")), "[DONE]"]  # fmt: skip
        assert json.loads(datas[0])["messageId"] == "d"


async def test_a_body_that_ends_before_its_reply_aborts_it() -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        # Neither finish nor [DONE]: the producer went away.
        status, answer = await _post(running, "/ai-sdk/c/produce?id=cut", _sse(*TEXT[:2]))
        frame = await _ended(sub)
        assert (frame["type"], frame["id"], frame["reason"]) == (
            "aborted",
            "cut",
            "producer_disconnected",
        )
        assert frame["parts"] == [{"type": "text", "text": "Hello", "state": "streaming"}]
        assert (status, answer["outcome"], answer["reason"], answer["offset"]) == (
            200,
            "aborted",
            "producer_disconnected",
            frame["offset"],
        )
        # A body with no chunk: no message.
        status, answer = await _post(running, "/ai-sdk/c/produce?id=none", _sse("[DONE]"))
        assert (status, answer["outcome"], answer["errors"]) == (200, "none", [])
        assert "offset" not in answer


# ---------------------------------------------------------------------- bad input and bounds


async def test_bad_lines_and_chunks_are_refused_and_the_rest_applies() -> None:
    running, relay = await start_relay()
    async with relay, subscribed_pair(running) as (sub, other):
        await send_json(other, {"id": "other", "delta": "untouched "})
        body = (
            (
                b'data: {"type":"start","messageId":"m"}\n\n'  # lines 1-2
                b"event: ignored\nid: 7\n: a keep-alive\n\n"  # lines 3-6
                b'{"type":"text-start","id":"t"}\n\n'  # line 7: NDJSON, not SSE
                b"data: {not json\n\n"  # line 9
                b'data: ["no", "type"]\n\n'  # line 11
                b'data: {"type":"text-delta","id":"nope","delta":"x"}\n\n'  # line 13
                b'data: {"type":"start","messageId":"other-id"}\n\n'  # line 15
                b'data: {"type":"text-start",\ndata: "id":"t"}\n\n'  # lines 17-19: one event
            )
            + _sse(*TEXT[1:], {"type": "finish"}, "[DONE]")
        )
        status, answer = await _post(running, "/ai-sdk/c/produce", body)
        frame = await _ended(sub)
        assert (frame["id"], frame["text"]) == ("m", "Hello")
        assert status == 200 and answer["outcome"] == "completed"
        assert [(e["code"], e.get("line"), e["id"]) for e in answer["errors"]] == [
            ("invalid_sse", 7, None),
            ("invalid_json", 9, None),
            ("invalid_chunk", 11, "m"),
            ("unknown_part", None, "m"),
            ("invalid_chunk", 15, "m"),
        ]
        assert "not a server-sent event field" in answer["errors"][0]["message"]
        # Another producer's message, streaming all along, is untouched.
        await send_json(other, {"id": "other", "delta": "still", "final": True})
        frame = await _ended(sub)
        assert (frame["id"], frame["text"]) == ("other", "untouched still")


async def test_bounds_are_those_of_post_produce() -> None:
    running, relay = await start_relay(max_frame_bytes=1024, max_body_bytes=4096)
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        # An event over --max-frame-bytes is refused whole, naming its line; the rest applies.
        long = {"type": "text-delta", "id": "t", "delta": "x" * 2000}
        body = _sse({"type": "start", "messageId": "m"}, *TEXT[:1], long, *TEXT[1:], "[DONE]")
        status, answer = await _post(running, "/ai-sdk/c/produce", body)
        frame = await _ended(sub)
        assert (frame["text"], answer["outcome"]) == ("Hello", "completed")
        assert [(e["code"], e["line"]) for e in answer["errors"]] == [("line_too_long", 5)]
        assert status == 413
        # A chunked body over --max-body-bytes: 413 once it passes, what came whole applied.
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(running))
        writer.write(
            b"POST /ai-sdk/c/produce?id=big HTTP/1.1\r\nHost: r\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        pieces = [_sse(*TEXT[:1])] + [
            _sse({"type": "text-delta", "id": "t", "delta": f"{index}" * 500})
            for index in range(1, 10)
        ]
        for piece in pieces:
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        response = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        frame = await _ended(sub)
        answer = json.loads(response.partition(b"\r\n\r\n")[2])
        assert response.startswith(b"HTTP/1.1 413 ")
        assert b"connection: close" in response.lower()
        assert [e["code"] for e in answer["errors"]] == ["body_too_large"]
        assert (answer["outcome"], answer["reason"]) == ("aborted", "producer_disconnected")
        assert (frame["id"], frame["reason"]) == ("big", "producer_disconnected")
        # The events that came whole under the limit were applied, and only they.
        whole = next(n for n in range(len(pieces)) if len(b"".join(pieces[: n + 1])) > 4096)
        assert frame["text"] == "".join(f"{index}" * 500 for index in range(1, whole))


async def test_tokens_are_a_producers() -> None:
    running, relay = await start_relay(secret=SECRET)
    async with relay:
        body = _sse(*TEXT, "[DONE]")
        path = "/ai-sdk/c/produce?id=m"
        assert (await _post(running, path, body))[0] == 401
        subscriber = mint(SECRET, Role.SUBSCRIBE, ["c"], 60)
        other = mint(SECRET, Role.PRODUCE, ["d"], 60)
        producer = mint(SECRET, Role.PRODUCE, ["c"], 60)
        assert (await _post(running, f"{path}&token={subscriber}", body))[0] == 403
        assert (await _post(running, f"{path}&token={other}", body))[0] == 403
        bearer = f"Authorization: Bearer {producer}\r\n"
        status, answer = await _post(running, path, body, bearer)
        assert (status, answer["outcome"]) == (200, "completed")


# ---------------------------------------------------------------------- the documented recipe

ROUTE = (
    Path(__file__).resolve().parents[2] / "client_demo" / "integrations" / "nextjs_produce_route.ts"
)
CHAT_APP = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "chat-app.md"


async def test_the_documented_producer_route_aborts_its_model_on_stop(js_clients: Path) -> None:
    """The chat-app tutorial's route that posts its model's stream to the relay, type-checked
    strictly and called as useChat calls it; Stop pressed while the model streams."""
    assert '--8<-- "client_demo/integrations/nextjs_produce_route.ts"' in CHAT_APP.read_text()
    # Compiled beside the pinned packages it imports, as it is.
    (js_clients / "app").mkdir(exist_ok=True)
    shutil.copy(ROUTE, js_clients / "app" / ROUTE.name)
    compile_ts = await asyncio.create_subprocess_exec(
        "npx", "tsc", "--strict", "--target", "ES2022", "--module", "ES2022",
        "--moduleResolution", "bundler", "--lib", "ES2022,DOM", "--types", "node",
        "--skipLibCheck", "--outDir", str(js_clients / "build"),
        str(js_clients / "app" / ROUTE.name),
        cwd=js_clients,
    )  # fmt: skip
    assert await asyncio.wait_for(compile_ts.wait(), 120) == 0
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe?channel=chat-stop") as sub:
        await recv_json(sub)
        node = await asyncio.create_subprocess_exec(
            "node", str(js_clients / "use_chat_stop.mjs"),
            str(js_clients / "build" / "nextjs_produce_route.js"), "chat-stop",
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "RELAY_URL": _base(running)},
        )  # fmt: skip
        # The model streams to the relay: press Stop on its reply once its text has begun
        # there (its first chunks, before any word, may still be on their way).
        await eventually(lambda: bool(relay.owned_messages()), 15, what="the reply started")
        [(_, owner, reply_id)] = relay.owned_messages()

        def words_arrived() -> bool:
            live = relay.live_parts(owner, reply_id)
            return live is not None and live[0].startswith("word0 ")

        await eventually(words_arrived, 15, what="the reply's first word reached the relay")
        status, _ = await _post(running, f"/ai-sdk/chat-stop/stop?id={reply_id}", b"")
        assert status == 204
        out, _ = await asyncio.wait_for(node.communicate(), 30)
        assert node.returncode == 0
        # The route's model logged its abort, then the script printed what it saw.
        *logged, printed = out.decode().splitlines()
        got = json.loads(printed)
        frame = await _ended(sub)
    assert (frame["type"], frame["id"], frame["reason"]) == ("aborted", reply_id, "cancelled")
    # The page read the reply as the relay ended it, under its id.
    assert (got["id"], got["parts"]) == (reply_id, frame["parts"])
    [part] = frame["parts"][1:]
    whole = "".join(f"word{n} " for n in range(40))
    assert part["state"] == "streaming" and whole.startswith(part["text"])
    # The relay answered "stopped", and the route aborted its model: its stream ends in an
    # abort, before its 40 words and its finish.
    assert (got["answer"]["outcome"], got["answer"]["stopped"]) == ("stopped", True)
    abort = {"type": "abort", "reason": "AbortError: This operation was aborted"}
    assert got["model"].endswith(
        f"data: {json.dumps(abort, separators=(',', ':'))}\n\n" + "data: [DONE]\n\n"
    )
    assert '"type":"finish"' not in got["model"] and "word39" not in got["model"]
    assert logged == ["model: aborted"]


async def test_the_documented_curl_gets_the_printed_answer(relay: RunningRelay) -> None:
    async with relay.connect("/subscribe?channel=chat-42") as sub:
        await recv_json(sub)
        command = _substitute(docs_block("ai-sdk-produce-curl"), {8765: _port(relay)})
        code, out, err = await _run(command, 30)
        frame = await _ended(sub)
    assert code == 0, err
    printed = json.loads(docs_block("ai-sdk-produce-answer"))
    assert json.loads(out) == {**printed, "epoch": frame["epoch"]}
    assert (frame["id"], frame["text"], frame["meta"]) == (
        "reply-1",
        "Hello",
        {"finishReason": "stop"},
    )
