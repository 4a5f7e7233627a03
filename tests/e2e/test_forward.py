"""``RelayProducer.forward`` with the real ``openai`` and ``anthropic`` SDKs, reading a local
provider that speaks their SSE wire formats, into a real relay and a real subscriber."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import openai
import pytest
from token_relay.client import RelayProducer

from ..conftest import RunningRelay, recv_json
from ..docs.blocks import docs_block
from ..harness.providers import Provider

CHAT_PARTS = [
    {"type": "text", "text": "Let me check.", "state": "done"},
    {
        "type": "tool-weather",
        "toolCallId": "call_1",
        "state": "input-available",
        "input": {"city": "Paris"},
    },
]
RESPONSES_PARTS = [
    {"type": "reasoning", "id": "rs_1:0", "text": "Weather asked.", "state": "done"},
    {"type": "text", "text": "Checking now.", "state": "done"},
    {
        "type": "tool-weather",
        "toolCallId": "call_9",
        "state": "input-available",
        "input": {"city": "Oslo"},
    },
]
MESSAGES_PARTS = [
    {"type": "reasoning", "id": "reasoning-0", "text": "Needs a tool.", "state": "done"},
    {"type": "text", "text": "On it.", "state": "done"},
    {
        "type": "tool-weather",
        "toolCallId": "toolu_1",
        "state": "input-available",
        "input": {"city": "Rome"},
    },
]


@pytest.fixture
def provider() -> Iterator[Provider]:
    served = Provider()
    try:
        yield served
    finally:
        served.close()


async def _delivered(relay: RunningRelay, forwarding: Any) -> tuple[Any, dict[str, Any]]:
    """Run ``forwarding(producer)`` while a subscriber listens; its result and the message."""
    async with relay.connect("/subscribe?channel=c") as sub:
        assert (await recv_json(sub))["type"] == "subscribed"
        async with RelayProducer(relay.url, channel="c") as producer:
            result = await forwarding(producer)
        message = await recv_json(sub)
    return result, message


def _chat_args(**extra: Any) -> dict[str, Any]:
    return {
        "model": "gpt-x",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "stream": True,
        **extra,
    }


@pytest.mark.parametrize("usage", [True, False])
async def test_a_chat_completions_stream_arrives_as_parts_with_meta(
    relay: RunningRelay, provider: Provider, usage: bool
) -> None:
    client = openai.AsyncOpenAI(base_url=provider.base_url, api_key="k", max_retries=0)
    extra = {"stream_options": {"include_usage": True}} if usage else {}

    async def forwarding(producer: RelayProducer) -> Any:
        stream = await client.chat.completions.create(**_chat_args(**extra))
        return await producer.forward(stream, id="r1")

    ack, message = await _delivered(relay, forwarding)
    assert (ack.id, ack.channel) == ("r1", "c")
    assert (message["type"], message["id"], message["text"]) == ("message", "r1", "Let me check.")
    assert message["parts"] == CHAT_PARTS
    meta = {"model": "gpt-x", "finish_reason": "tool_calls", "finishReason": "tool-calls"}
    if usage:
        meta["usage"] = {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}
    assert message["meta"] == meta
    assert provider.requests[0].finished


async def test_a_sync_chat_completions_stream_is_read_off_the_loop(
    relay: RunningRelay, provider: Provider
) -> None:
    client = openai.OpenAI(base_url=provider.base_url, api_key="k", max_retries=0)

    async def forwarding(producer: RelayProducer) -> Any:
        stream = await asyncio.to_thread(
            client.chat.completions.create,
            **_chat_args(stream_options={"include_usage": True}),
        )
        return await producer.forward(stream, id="r1")

    ack, message = await _delivered(relay, forwarding)
    assert ack.id == "r1"
    assert message["parts"] == CHAT_PARTS
    assert message["meta"]["usage"]["total_tokens"] == 21


@pytest.mark.parametrize("entered", [False, True])
async def test_the_chat_completions_stream_helper_arrives_as_parts(
    relay: RunningRelay, provider: Provider, entered: bool
) -> None:
    client = openai.AsyncOpenAI(base_url=provider.base_url, api_key="k", max_retries=0)
    arguments = _chat_args(stream_options={"include_usage": True})
    del arguments["stream"]

    async def forwarding(producer: RelayProducer) -> Any:
        if entered:
            async with client.chat.completions.stream(**arguments) as stream:
                return await producer.forward(stream, id="r1")
        return await producer.forward(client.chat.completions.stream(**arguments), id="r1")

    ack, message = await _delivered(relay, forwarding)
    assert ack.id == "r1"
    assert message["parts"] == CHAT_PARTS
    assert message["meta"]["finishReason"] == "tool-calls"
    assert message["meta"]["usage"]["total_tokens"] == 21


@pytest.mark.parametrize("sync", [False, True])
async def test_a_responses_stream_arrives_as_parts_with_meta(
    relay: RunningRelay, provider: Provider, sync: bool
) -> None:
    arguments = {"model": "gpt-x", "input": "Weather in Oslo?", "stream": True}

    async def forwarding(producer: RelayProducer) -> Any:
        if sync:
            client = openai.OpenAI(base_url=provider.base_url, api_key="k", max_retries=0)
            stream: Any = await asyncio.to_thread(client.responses.create, **arguments)
        else:
            aclient = openai.AsyncOpenAI(base_url=provider.base_url, api_key="k", max_retries=0)
            stream = await aclient.responses.create(**arguments)
        return await producer.forward(stream, id="r2")

    ack, message = await _delivered(relay, forwarding)
    assert ack.id == "r2"
    assert message["text"] == "Checking now."
    assert message["parts"] == RESPONSES_PARTS
    assert message["meta"] == {
        "model": "gpt-x",
        "finish_reason": "completed",
        "finishReason": "tool-calls",
        "usage": {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 5},
            "total_tokens": 30,
        },
    }


MESSAGES_META = {
    "model": "claude-x",
    "stop_reason": "tool_use",
    "finishReason": "tool-calls",
    "usage": {"input_tokens": 25, "output_tokens": 40},
}


def _anthropic_url(provider: Provider) -> str:
    return provider.base_url.removesuffix("/v1")


def _message_args(model: str = "claude-x") -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Weather in Rome?"}],
    }


@pytest.mark.parametrize("kind", ["raw", "raw-sync", "manager", "manager-sync", "entered"])
async def test_an_anthropic_messages_stream_arrives_as_parts_with_meta(
    relay: RunningRelay, provider: Provider, kind: str
) -> None:
    url = _anthropic_url(provider)

    async def forwarding(producer: RelayProducer) -> Any:
        aclient = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
        client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
        if kind == "raw":
            stream: Any = await aclient.messages.create(**_message_args(), stream=True)
        elif kind == "raw-sync":
            stream = await asyncio.to_thread(
                lambda: client.messages.create(**_message_args(), stream=True)
            )
        elif kind == "manager":
            stream = aclient.messages.stream(**_message_args())
        elif kind == "manager-sync":
            stream = client.messages.stream(**_message_args())
        else:
            async with aclient.messages.stream(**_message_args()) as entered:
                return await producer.forward(entered, id="r3")
        return await producer.forward(stream, id="r3")

    ack, message = await _delivered(relay, forwarding)
    assert ack.id == "r3"
    assert message["text"] == "On it."
    assert message["parts"] == MESSAGES_PARTS
    assert message["meta"] == MESSAGES_META


async def _stopped(
    relay: RunningRelay, provider: Provider, start: Any, last: dict[str, Any]
) -> dict[str, Any]:
    """Forward a held stream, press Stop once the chunks of what the provider sent arrived
    (up to ``last``); the ``aborted`` frame, after checking that forward returned None and
    that the provider saw the connection closed."""
    async with relay.connect("/subscribe?channel=c&deltas=true") as sub:
        assert (await recv_json(sub))["type"] == "subscribed"
        async with RelayProducer(relay.url, channel="c") as producer:
            stream = await start()
            forwarding = asyncio.create_task(producer.forward(stream, id="held"))
            frame = await recv_json(sub, 10)
            while frame.get("chunks", [None])[-1] != last:
                frame = await recv_json(sub, 10)
            await sub.send('{"type": "cancel", "channel": "c", "id": "held"}')
            assert await asyncio.wait_for(forwarding, 10) is None
        while frame["type"] != "aborted":
            frame = await recv_json(sub, 10)
    closed = await asyncio.to_thread(provider.requests[0].closed_early.wait, 10)
    assert closed, "the provider's connection stayed open"
    assert not provider.requests[0].finished
    return frame


@pytest.mark.parametrize("sync", [False, True])
async def test_a_stop_closes_the_openai_stream_and_aborts_the_reply(
    relay: RunningRelay, provider: Provider, sync: bool
) -> None:
    async def start() -> Any:
        arguments = _chat_args(model="hold")
        if sync:
            client = openai.OpenAI(base_url=provider.base_url, api_key="k", max_retries=0)
            return await asyncio.to_thread(client.chat.completions.create, **arguments)
        aclient = openai.AsyncOpenAI(base_url=provider.base_url, api_key="k", max_retries=0)
        return await aclient.chat.completions.create(**arguments)

    last = {"type": "tool-input-start", "toolCallId": "call_1", "toolName": "weather"}
    frame = await _stopped(relay, provider, start, last)
    assert (frame["id"], frame["reason"], frame["text"]) == ("held", "cancelled", "Let me check.")
    assert frame["parts"] == [
        {"type": "text", "text": "Let me check.", "state": "streaming"},
        {"type": "tool-weather", "toolCallId": "call_1", "state": "input-streaming"},
    ]
    assert frame["meta"] == {"model": "gpt-x"}


@pytest.mark.parametrize("sync", [False, True])
async def test_a_stop_exits_the_anthropic_stream_manager_and_aborts_the_reply(
    relay: RunningRelay, provider: Provider, sync: bool
) -> None:
    url = _anthropic_url(provider)

    async def start() -> Any:
        if sync:
            client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
            return client.messages.stream(**_message_args("hold"))
        aclient = anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0)
        return aclient.messages.stream(**_message_args("hold"))

    last = {"type": "reasoning-delta", "id": "reasoning-0", "delta": "a tool."}
    frame = await _stopped(relay, provider, start, last)
    assert (frame["reason"], frame["text"]) == ("cancelled", "")
    assert frame["parts"] == [
        {"type": "reasoning", "id": "reasoning-0", "text": "Needs a tool.", "state": "streaming"}
    ]
    assert frame["meta"] == {
        "model": "claude-x",
        "usage": {"input_tokens": 25, "output_tokens": 1},
    }


async def test_a_stream_of_something_else_is_refused_and_sends_nothing(
    relay: RunningRelay,
) -> None:
    from token_relay.core.errors import UsageError

    async def other() -> AsyncIterator[dict[str, str]]:
        yield {"type": "something"}

    async with RelayProducer(relay.url, channel="c") as producer:
        with pytest.raises(UsageError):
            await producer.forward(other(), id="x")
        assert producer._unacked == {}


def test_the_client_imports_neither_sdk() -> None:
    import subprocess

    code = (
        "import sys, token_relay.client.forward\n"
        "print(sorted(m for m in ('openai', 'anthropic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("code", "reply", "parts", "meta"),
    [
        (
            docs_block("gateway-openai"),
            "reply-1",
            CHAT_PARTS,
            {
                "model": "gpt-x",
                "finish_reason": "tool_calls",
                "finishReason": "tool-calls",
                "usage": {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21},
            },
        ),
        (docs_block("gateway-anthropic"), "reply-2", MESSAGES_PARTS, MESSAGES_META),
    ],
    ids=["openai", "anthropic"],
)
async def test_the_documented_gateways_forward_as_printed(
    relay: RunningRelay,
    provider: Provider,
    code: str,
    reply: str,
    parts: list[dict[str, Any]],
    meta: dict[str, Any],
) -> None:
    environment = {
        **os.environ,
        "OPENAI_API_KEY": "k",
        "OPENAI_BASE_URL": provider.base_url,
        "ANTHROPIC_API_KEY": "k",
        "ANTHROPIC_BASE_URL": _anthropic_url(provider),
    }
    async with relay.connect("/subscribe?channel=chat-42") as sub:
        assert (await recv_json(sub))["type"] == "subscribed"
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code.replace("ws://127.0.0.1:8765", relay.url),
            stdout=asyncio.subprocess.PIPE,
            env=environment,
        )
        out, _ = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0
        assert out.decode().strip() == f"delivered: {reply}"
        message = await recv_json(sub)
    assert (message["type"], message["id"]) == ("message", reply)
    assert message["parts"] == parts
    assert message["meta"] == meta
    assert [request.path for request in provider.requests] == [
        "/v1/messages" if "anthropic" in code else "/v1/chat/completions"
    ]


async def test_a_stream_that_fails_midway_ends_the_reply_in_error(relay: RunningRelay) -> None:
    async def failing() -> AsyncIterator[dict[str, Any]]:
        yield {
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "Half"}}],
        }
        raise ConnectionError("upstream broke")

    async with relay.connect("/subscribe?channel=c") as sub:
        assert (await recv_json(sub))["type"] == "subscribed"
        async with RelayProducer(relay.url, channel="c") as producer:
            with pytest.raises(ConnectionError, match="upstream broke"):
                await producer.forward(failing(), id="r")
        aborted = await recv_json(sub)
    assert (aborted["type"], aborted["reason"], aborted["text"]) == ("aborted", "error", "Half")
    assert aborted["meta"] == {"model": "m", "finishReason": "error", "errorText": "upstream broke"}


async def test_cancelling_forward_closes_the_upstream_stream(
    relay: RunningRelay, provider: Provider
) -> None:
    client = openai.AsyncOpenAI(base_url=provider.base_url, api_key="k", max_retries=0)
    async with relay.connect("/subscribe?channel=c&deltas=true") as sub:
        assert (await recv_json(sub))["type"] == "subscribed"
        async with RelayProducer(relay.url, channel="c") as producer:
            stream = await client.chat.completions.create(**_chat_args(model="hold"))
            forwarding = asyncio.create_task(producer.forward(stream, id="held"))
            frame = await recv_json(sub, 10)
            while frame["type"] not in ("chunks", "delta"):
                frame = await recv_json(sub, 10)
            forwarding.cancel()
            with pytest.raises(asyncio.CancelledError):
                await forwarding
            assert await asyncio.to_thread(provider.requests[0].closed_early.wait, 10)
            assert producer._stops == {}
