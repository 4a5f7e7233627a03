"""The WebSocket chat transport on several relay processes, one real redis-server: a ``send``
on one process reaches the gateway connected to another, its reply streams back exactly, and
Stop reaches it; with ``--workers 2`` every send is answered wherever it lands; a gateway
whose process died is passed over at once (``no_producer``), never waited for."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from redis.asyncio import Redis
from token_relay.client import RelayProducer
from token_relay.core.protocol import Cancel, ChatRequest

from ..conftest import connect, recv_json
from ..harness import RedisServer, ServiceProcess, eventually, relay_process, relays_on
from .test_ai_sdk_ws import (
    CHAT,
    QUESTION,
    Gateway,
    _ended,
    _node,
    _structured,
    _until_stopped,
    assert_stopped_early,
    stop_mid_reply,
)


async def _registered(redis_url: str, chat: str, count: int = 1) -> None:
    """Wait until ``count`` producers take ``chat``'s requests, as Redis lists them."""
    redis = Redis.from_url(redis_url)
    try:

        async def listed() -> bool:
            return int(await redis.zcard(f"tr:q:{chat}")) >= count

        await eventually(listed, 10, what=f"a producer registered for {chat}")
    finally:
        await redis.aclose()


@asynccontextmanager
async def _gateway(
    relay: ServiceProcess, redis_url: str, answer: Gateway
) -> AsyncIterator[list[ChatRequest]]:
    """A Python gateway on ``relay`` taking CHAT's requests; yields the requests it got."""
    got: list[ChatRequest] = []

    async def serve(producer: RelayProducer) -> None:
        async for request in producer.requests():
            got.append(request)
            await answer(producer, request)

    async with RelayProducer(relay.url, channel=CHAT) as producer:
        await _registered(redis_url, CHAT)
        task = asyncio.create_task(serve(producer))
        try:
            yield got
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _ws(relay: ServiceProcess) -> str:
    return relay.url + "/ai-sdk/ws"


async def test_a_send_on_one_process_reaches_the_gateway_on_another(
    redis_server: RedisServer, js_clients: Path
) -> None:
    async with (
        relays_on(redis_server.url) as (first, second),
        _gateway(first, redis_server.url, _structured) as requests,
        connect(f"{first.url}/subscribe?channel={CHAT}") as sub,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        held = await _node(js_clients, "send", _ws(second), CHAT)
        relayed = await _ended(sub)
    assert held["ok"], held
    (request,) = requests
    assert request.messages == [QUESTION]
    assert held["id"] == relayed["id"] == request.id
    assert held["parts"] == relayed["parts"]
    assert [part["type"] for part in held["parts"]] == ["reasoning", "tool-weather", "text"]


async def test_stop_on_one_process_stops_the_gateway_on_another(
    redis_server: RedisServer, js_clients: Path
) -> None:
    cancelled: list[Cancel] = []
    stopped = asyncio.Event()
    endless = _until_stopped(cancelled, stopped, 0.005)
    async with (
        relays_on(redis_server.url) as (first, second),
        _gateway(first, redis_server.url, endless) as requests,
        connect(f"{second.url}/subscribe?channel={CHAT}") as sub,
    ):
        held, relayed = await stop_mid_reply(js_clients, _ws(second), sub, stopped)
    assert_stopped_early(held, relayed, cancelled, requests)


async def test_with_two_workers_every_send_is_answered(
    redis_server: RedisServer, js_clients: Path
) -> None:
    relay = await relay_process("--workers", "2", "--broker", redis_server.url).start()
    try:
        async with _gateway(relay, redis_server.url, _structured) as requests:
            # Each transport is a new connection: the kernel spreads them over both workers.
            held = await asyncio.gather(
                *(_node(js_clients, "send", _ws(relay), CHAT) for _ in range(6))
            )
        assert [reply["ok"] for reply in held] == [True] * 6, held
        assert sorted(reply["id"] for reply in held) == sorted(r.id for r in requests)
        assert len({repr(reply["parts"]) for reply in held}) == 1
    finally:
        await relay.stop()


async def test_a_gateway_whose_process_died_is_passed_over_at_once(
    redis_server: RedisServer, js_clients: Path
) -> None:
    async with relays_on(redis_server.url) as (first, second):
        doomed = RelayProducer(first.url, channel=CHAT)
        await doomed.__aenter__()
        try:
            await _registered(redis_server.url, CHAT)
            await first.kill()  # its registration stays in Redis: nobody removed it
            failed = await asyncio.wait_for(_node(js_clients, "send", _ws(second), CHAT), 10)
            assert failed["ok"] is False
            assert "no_producer" in failed["error"]
            # A gateway connected now, on the live process, gets the next send.
            async with _gateway(second, redis_server.url, _structured) as requests:
                held = await _node(js_clients, "send", _ws(second), CHAT)
            assert held["ok"] and held["id"] == requests[0].id
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(doomed.__aexit__(None, None, None), 5)


async def test_sends_reach_the_gateway_again_after_redis_restarts_empty(
    redis_server: RedisServer, js_clients: Path
) -> None:
    async with (
        relays_on(redis_server.url) as (first, second),
        _gateway(first, redis_server.url, _structured) as requests,
    ):
        redis_server.kill()
        await eventually(lambda: _unready(second), 10)
        redis_server.start()  # empty: it keeps nothing on disk
        # The gateway's process registers it again once Redis is back.
        await _registered(redis_server.url, CHAT)
        held = await _node(js_clients, "send", _ws(second), CHAT)
    assert held["ok"], held
    assert held["id"] == requests[-1].id
    assert [part["type"] for part in held["parts"]] == ["reasoning", "tool-weather", "text"]


async def _unready(relay: ServiceProcess) -> bool:
    return await relay.http_status("/readyz") == 503
