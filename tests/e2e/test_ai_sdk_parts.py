"""Structured replies on the AI SDK's UI message stream, read by the real ``ai`` package in
Node at its current major and the one before (``DefaultChatTransport.reconnectToStream`` and
``readUIMessageStream``): the message the app ends with holds exactly the ``parts`` of the
relay's own ``message`` (or ``aborted``) frame, whether the reply completed while the stream
waited, before it was asked for (on this process or, through Redis, another), or turned
structured while its text was being read."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from token_relay.core.parts import chunks_of
from token_relay.edge.aisdk import AiSdkStream

from ..conftest import RunningRelay, recv_json, send_json, start_relay
from ..docs.blocks import docs_block
from ..harness import RedisServer, eventually, relay_process
from .test_ai_sdk import AI_MAJORS, NodeScript, _post, _resume


@pytest.fixture(scope="session", params=AI_MAJORS)
def resume(js_clients: Path, request: pytest.FixtureRequest) -> NodeScript:
    """The AI SDK's own resume, in Node, at each major."""
    return NodeScript(js_clients / "ai_sdk_resume.mjs", request.param)


def _reply(message_id: str) -> list[dict[str, Any]]:
    """A reply of every kind of part the majors assemble alike: reasoning, a tool call whose
    input streams and whose output follows, text in a second step, a source, a data part
    updated in place."""
    chunks: list[dict[str, Any]] = [
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "r1"},
        {"type": "reasoning-delta", "id": "r1", "delta": "The user wants "},
        {"type": "reasoning-delta", "id": "r1", "delta": "the weather."},
        {"type": "reasoning-end", "id": "r1"},
        {"type": "tool-input-start", "toolCallId": "call-1", "toolName": "weather"},
        {"type": "tool-input-delta", "toolCallId": "call-1", "inputTextDelta": '{"city":'},
        {"type": "tool-input-delta", "toolCallId": "call-1", "inputTextDelta": '"Paris"}'},
        {"type": "tool-input-available", "toolCallId": "call-1", "toolName": "weather",
         "input": {"city": "Paris"}},
        {"type": "data-status", "id": "s1", "data": {"phase": "calling"}},
        {"type": "tool-output-available", "toolCallId": "call-1", "output": {"celsius": 21}},
        {"type": "finish-step"},
        {"type": "start-step"},
        {"type": "text-start", "id": "t1"},
        {"type": "text-delta", "id": "t1", "delta": "It is 21 °C "},
        {"type": "text-delta", "id": "t1", "delta": "in Paris 🌤."},
        {"type": "text-end", "id": "t1"},
        {"type": "source-url", "sourceId": "src-1", "url": "https://weather.example/paris",
         "title": "Paris weather"},
        {"type": "data-status", "id": "s1", "data": {"phase": "done"}},
    ]  # fmt: skip
    return [{"id": message_id, "chunk": chunk} for chunk in chunks]


async def _ended(running: RunningRelay, channel: str) -> Any:
    """A subscriber of ``channel``, and how to read its next message or aborted frame."""
    watcher = await running.connect(f"/subscribe?channel={channel}").__aenter__()
    assert (await recv_json(watcher))["type"] == "subscribed"

    async def frame() -> dict[str, Any]:
        while True:
            got = await recv_json(watcher, 10)
            if got["type"] in ("message", "aborted"):
                await watcher.close()
                return got

    return frame


async def _curl(running: RunningRelay, path: str) -> str:
    """What ``curl -sN`` prints for ``path`` on the relay."""
    port = running.url.rsplit(":", 1)[1]
    curl = await asyncio.create_subprocess_exec(
        "curl", "-sN", f"http://127.0.0.1:{port}{path}", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(curl.communicate(), 10)
    return out.decode()


async def _stream_joined(running: RunningRelay, channel: str) -> None:
    hub = running.relay.subscribers.router.hub

    def joined() -> bool:
        return any(isinstance(peer, AiSdkStream) for peer in hub.subscribers(channel))

    await eventually(joined, what="the stream joined")


async def test_a_structured_reply_is_read_with_exactly_its_parts(resume: NodeScript) -> None:
    running, relay = await start_relay()
    async with relay:
        ended = await _ended(running, "chat-1")
        reading = asyncio.ensure_future(_resume(resume, running, "chat-1", "?wait=20"))
        await _stream_joined(running, "chat-1")
        meta = {"model": "m-1", "usage": {"outputTokens": 42}}
        async with running.connect("/produce?channel=chat-1") as producer:
            for event in _reply("reply-1"):
                await send_json(producer, event)
            await send_json(producer, {"id": "reply-1", "final": True, "meta": meta})
            assert (await recv_json(producer))["type"] == "ack"
        frame = await ended()
        assert [part["type"] for part in frame["parts"]] == [
            "step-start", "reasoning", "tool-weather", "data-status", "step-start", "text",
            "source-url",
        ]  # fmt: skip
        # Completed while the stream waited.
        got = await reading
        assert (got["id"], got["message"], got["metadata"]) == ("reply-1", frame["parts"], meta)
        assert got["text"] == frame["text"] == "It is 21 °C in Paris 🌤."
        assert got["parts"][0] == "start" and got["parts"][-1] == "finish"
        assert got["parts"].count("start") == 1
        # Live: each delta as it was sent.
        assert got["parts"].count("text-delta") == got["parts"].count("reasoning-delta") == 2
        # Completed before it was asked for: by its id, and as the channel's newest; whole,
        # one delta per part.
        for query in ("?id=reply-1", ""):
            again = await _resume(resume, running, "chat-1", query)
            assert (again["id"], again["message"], again["metadata"]) == (
                got["id"],
                got["message"],
                got["metadata"],
            ), query
            assert again["parts"].count("text-delta") == 1, query
            assert again["parts"].count("reasoning-delta") == 1, query


async def test_a_structured_reply_joined_at_any_point_is_read_exactly(resume: NodeScript) -> None:
    """The stream asked for mid-reply gets the reply so far compacted, then live: the app
    ends with exactly the relay's parts, whatever the point it joined at."""
    running, relay = await start_relay()
    async with relay:
        events = _reply("r")
        for cut in (1, 4, 7, 9, 12, 15, len(events)):
            message_id = f"reply-{cut}"
            async with running.connect("/produce?channel=chat-4") as producer:
                for event in _reply(message_id)[:cut]:
                    await send_json(producer, event)
                await send_json(producer, {"id": f"{message_id}-sync", "final": True})
                assert (await recv_json(producer))["id"] == f"{message_id}-sync"
                ended = await _ended(running, "chat-4")
                query = f"?id={message_id}"
                reading = asyncio.ensure_future(_resume(resume, running, "chat-4", query))
                await _stream_joined(running, "chat-4")
                for event in _reply(message_id)[cut:]:
                    await send_json(producer, event)
                await send_json(producer, {"id": message_id, "final": True, "meta": {"n": cut}})
                assert (await recv_json(producer))["id"] == message_id
            frame = await ended()
            got = await reading
            assert (got["id"], got["message"], got["metadata"]) == (
                message_id,
                frame["parts"],
                {"n": cut},
            ), cut
            assert got["parts"].count("start") == 1, cut


async def test_a_reply_that_turns_structured_while_its_text_is_read(resume: NodeScript) -> None:
    running, relay = await start_relay()
    async with relay:
        ended = await _ended(running, "chat-2")
        reading = asyncio.ensure_future(_resume(resume, running, "chat-2", "?wait=20"))
        await _stream_joined(running, "chat-2")
        async with running.connect("/produce?channel=chat-2") as producer:
            for piece in ("Let me ", "check. "):
                await send_json(producer, {"id": "reply-2", "delta": piece})
            await asyncio.sleep(0.2)  # the stream has sent them, as text
            for event in _reply("reply-2"):
                await send_json(producer, event)
            await send_json(producer, {"id": "reply-2", "final": True})
            assert (await recv_json(producer))["type"] == "ack"
        frame = await ended()
        assert frame["parts"][0] == {"type": "text", "text": "Let me check. ", "state": "done"}
        got = await reading
        assert (got["id"], got["message"]) == ("reply-2", frame["parts"])
        assert got["parts"].count("start") == got["parts"].count("text-start") - 1 == 1


async def test_an_aborted_structured_reply_ends_with_abort_and_keeps_its_parts(
    resume: NodeScript,
) -> None:
    running, relay = await start_relay(session_grace=0)
    async with relay:
        ended = await _ended(running, "chat-3")
        reading = asyncio.ensure_future(_resume(resume, running, "chat-3", "?wait=20"))
        await _stream_joined(running, "chat-3")
        async with running.connect("/produce?channel=chat-3") as producer:
            for event in _reply("reply-3")[:8]:  # up to the tool's input, half streamed
                await send_json(producer, event)
            await send_json(producer, {"id": "reply-3", "chunk": {"type": "text-start", "id": "t"}})
            chunk = {"type": "text-delta", "id": "t", "delta": "So far"}
            await send_json(producer, {"id": "reply-3", "chunk": chunk})
            await asyncio.sleep(0.2)
        # The producer went away without a final: the reply is aborted, as it was.
        frame = await ended()
        assert frame["type"] == "aborted"
        states = [(part["type"], part.get("state")) for part in frame["parts"]]
        assert states == [
            ("step-start", None), ("reasoning", "done"), ("tool-weather", "input-streaming"),
            ("text", "streaming"),
        ]  # fmt: skip
        got = await reading
        assert (got["id"], got["message"]) == ("reply-3", frame["parts"])
        assert got["parts"][0] == "start" and got["parts"][-1] == "abort"
        again = await _resume(resume, running, "chat-3", "?id=reply-3")
        assert again["message"] == got["message"]
        assert again["parts"].count("reasoning-delta") == 1  # whole: one delta per part


async def test_the_documented_structured_stream_is_what_curl_prints() -> None:
    running, relay = await start_relay()
    async with relay:
        ended = await _ended(running, "chat-42")
        async with running.connect("/produce?channel=chat-42") as producer:
            for line in docs_block("producer-parts").splitlines():
                await send_json(producer, json.loads(line))
            assert (await recv_json(producer))["type"] == "ack"
        frame = await ended()
        out = await _curl(running, "/ai-sdk/chat-42/stream?id=reply-7")
    printed = docs_block("ai-sdk-parts-output")
    assert out == printed
    chunks = [json.loads(line[6:]) for line in printed.splitlines() if line.startswith("data: {")]
    assert chunks[1:-1] == chunks_of(frame["parts"])


async def test_a_structured_reply_completed_on_another_process_is_read_through_redis(
    resume: NodeScript, redis_server: RedisServer
) -> None:
    flags = ("--broker", redis_server.url)
    a, b = relay_process(*flags), relay_process(*flags)
    await asyncio.gather(a.start(), b.start())
    try:
        on_a = RunningRelay(None, a.url)  # type: ignore[arg-type]
        on_b = RunningRelay(None, b.url)  # type: ignore[arg-type]
        ended = await _ended(on_b, "shared")
        async with on_a.connect("/produce?channel=shared") as producer:
            for event in _reply("s1"):
                await send_json(producer, event)
            await send_json(producer, {"id": "s1", "final": True, "meta": {"n": 1}})
            assert (await recv_json(producer))["type"] == "ack"
        frame = await ended()
        assert len(frame["parts"]) == 7
        for query in ("?id=s1", ""):
            got = await _resume(resume, on_b, "shared", query)
            assert (got["id"], got["message"], got["metadata"]) == ("s1", frame["parts"], {"n": 1})
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def test_a_structured_reply_joined_mid_way_on_another_process_is_read_exactly(
    resume: NodeScript, redis_server: RedisServer
) -> None:
    """Half the reply is produced on one process; the app's stream asks another process for
    it mid-way (its snapshot rebuilt there from Redis, compacted), and reads the rest live."""
    flags = ("--broker", redis_server.url)
    a, b = relay_process(*flags), relay_process(*flags)
    await asyncio.gather(a.start(), b.start())
    redis = Redis.from_url(redis_server.url)
    try:
        on_a = RunningRelay(None, a.url)  # type: ignore[arg-type]
        on_b = RunningRelay(None, b.url)  # type: ignore[arg-type]
        events = _reply("s2")
        async with on_a.connect("/produce?channel=shared") as producer:
            for event in [{"id": "s2", "delta": "Let me see. "}, *events[:8]]:
                await send_json(producer, event)
            await send_json(producer, {"id": "sync", "final": True})
            assert (await recv_json(producer))["id"] == "sync"
            ended = await _ended(on_b, "shared")
            reading = asyncio.ensure_future(_resume(resume, on_b, "shared", "?id=s2"))

            async def listening() -> bool:
                numsub = await redis.pubsub_numsub("tr:d:shared")
                return bool(numsub[0][1])

            for _ in range(400):  # b listens for the channel's live frames: it joined
                if await listening():
                    break
                await asyncio.sleep(0.05)
            assert await listening(), "the stream never joined"
            for event in events[8:]:
                await send_json(producer, event)
            await send_json(producer, {"id": "s2", "final": True, "meta": {"n": 2}})
            assert (await recv_json(producer))["id"] == "s2"
        frame = await ended()
        got = await reading
        assert (got["id"], got["message"], got["metadata"]) == ("s2", frame["parts"], {"n": 2})
        assert frame["parts"][0] == {"type": "text", "text": "Let me see. ", "state": "done"}
    finally:
        await redis.aclose()
        await asyncio.gather(a.stop(), b.stop())


async def test_finish_carries_the_finish_reason_a_reply_s_meta_names(resume: NodeScript) -> None:
    running, relay = await start_relay()
    async with relay:
        ended = await _ended(running, "chat-5")
        async with running.connect("/produce?channel=chat-5") as producer:
            for event in _reply("reply-5"):
                await send_json(producer, event)
            meta = {"finishReason": "tool-calls", "usage": {"outputTokens": 7}}
            await send_json(producer, {"id": "reply-5", "final": True, "meta": meta})
            assert (await recv_json(producer))["type"] == "ack"
        frame = await ended()
        out = await _curl(running, "/ai-sdk/chat-5/stream?id=reply-5")
        chunks = [json.loads(line[6:]) for line in out.splitlines() if line[6:7] == "{"]
        finish = {"type": "finish", "finishReason": "tool-calls", "messageMetadata": meta}
        assert chunks[-1] == finish
        # The package reads it as it is, at each major.
        got = await _resume(resume, running, "chat-5", "?id=reply-5")
        assert (got["message"], got["metadata"]) == (frame["parts"], meta)
        # A reason ai does not know is not put on the finish chunk (the package would refuse
        # it): it stays in the metadata.
        async with running.connect("/produce?channel=chat-5") as producer:
            odd = {"finishReason": "because"}
            await send_json(producer, {"id": "reply-6", "delta": "x", "final": True, "meta": odd})
            assert (await recv_json(producer))["type"] == "ack"
        again = await _resume(resume, running, "chat-5", "?id=reply-6")
        assert (again["text"], again["metadata"]) == ("x", odd)


async def test_stop_without_an_id_reaches_a_structured_reply_in_progress() -> None:
    running, relay = await start_relay()
    async with relay, running.connect("/produce?channel=chat-7") as producer:
        for event in _reply("reply-7")[:4]:
            await send_json(producer, event)
        await send_json(producer, {"id": "sync", "final": True})
        assert (await recv_json(producer))["id"] == "sync"
        assert await _post(running, "/ai-sdk/chat-7/stop") == 204
        cancel = await recv_json(producer)
        assert (cancel["type"], cancel["channel"], cancel["id"]) == ("cancel", "chat-7", "reply-7")


async def test_a_waiting_stream_gets_a_one_shot_reply_and_a_stopped_empty_one_whole() -> None:
    running, relay = await start_relay()
    async with relay:
        for message_id, events, last in (
            ("one", [{"id": "one", "delta": "Hi 👋", "final": True}], '{"type":"finish"}'),
            ("cut", [{"id": "cut", "meta": {"m": 1}}, {"id": "cut", "abort": "cancelled"}],
             '{"type":"abort","reason":"cancelled"}'),
        ):  # fmt: skip
            reading = asyncio.ensure_future(
                _curl(running, f"/ai-sdk/chat-8/stream?wait=10&id={message_id}")
            )
            await _stream_joined(running, "chat-8")
            async with running.connect("/produce?channel=chat-8") as producer:
                for event in events:
                    await send_json(producer, event)
                await send_json(producer, {"id": f"{message_id}-sync", "final": True})
                while (await recv_json(producer)).get("id") != f"{message_id}-sync":
                    pass
            lines = [line for line in (await reading).splitlines() if line.startswith("data: ")]
            assert lines[0] == f'data: {{"type":"start","messageId":"{message_id}"}}'
            assert lines[-2:] == [f"data: {last}", "data: [DONE]"]
            if message_id == "one":
                assert 'data: {"type":"text-delta","id":"text","delta":"Hi 👋"}' in lines
