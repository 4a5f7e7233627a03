"""End to end across processes: two relays on one real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import pytest_asyncio
from redis.asyncio import Redis
from token_relay.client import RelayProducer, RelaySubscriber
from token_relay.core.protocol import Aborted, MessageFrame
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from ..conftest import (
    assert_silent,
    connect,
    open_producer,
    recv_json,
    send_json,
    start_relay,
)
from ..harness import (
    Balancer,
    Proxy,
    RedisServer,
    ServiceProcess,
    eventually,
    relay_process,
)
from .test_ownership import ROUNDS, one_after_the_other, race

# The relay processes live in this module's event loop, so that a pair can outlive a test.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@asynccontextmanager
async def _relays_on(redis: RedisServer) -> AsyncIterator[tuple[ServiceProcess, ServiceProcess]]:
    flags = ("--broker", redis.url, "--idle-timeout", "30")
    a, b = relay_process(*flags), relay_process(*flags)
    await asyncio.gather(a.start(), b.start())
    try:
        yield a, b
    finally:
        await asyncio.gather(a.stop(), b.stop())


@pytest.fixture(scope="module")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_pair(
    shared_redis: RedisServer,
) -> AsyncIterator[tuple[ServiceProcess, ServiceProcess]]:
    async with _relays_on(shared_redis) as relays:
        yield relays


@pytest_asyncio.fixture(loop_scope="module")
async def pair(
    shared_pair: tuple[ServiceProcess, ServiceProcess],
) -> tuple[ServiceProcess, ServiceProcess]:
    """Two relays on one redis-server, started once for the tests that leave Redis alone.

    Each such test streams on a channel of its own, so none sees another's history.
    """
    a, b = shared_pair
    assert a.alive and b.alive, a.log + b.log
    return a, b


@pytest_asyncio.fixture(loop_scope="module")
async def own_pair(
    redis_server: RedisServer,
) -> AsyncIterator[tuple[ServiceProcess, ServiceProcess]]:
    """Two relays on a redis-server of their own, for a test that kills it."""
    async with _relays_on(redis_server) as relays:
        yield relays


async def _subscribed(url: str, query: str = "channel=c") -> ClientConnection:
    ws = await connect(f"{url}/subscribe?{query}")
    confirmation = await recv_json(ws)
    assert confirmation["type"] == "subscribed"
    return ws


async def _eventually(probe: Callable[[], Coroutine[Any, Any, bool]], wait: float = 15) -> None:
    """Poll another process over HTTP until ``probe`` holds."""
    await eventually(probe, wait, interval=0.02, what=probe.__name__)


async def test_producer_on_a_reaches_subscribers_on_a_and_b_exactly_once(
    pair: tuple[ServiceProcess, ServiceProcess],
) -> None:
    a, b = pair
    channel = "fanout"
    subscribers = [
        await _subscribed(url, f"channel={channel}") for url in (a.url, a.url, b.url, b.url)
    ]
    async with open_producer(f"{a.url}/produce?channel={channel}") as producer:
        for i in range(5):
            await send_json(producer, {"id": f"m{i}", "delta": f"text {i} é🚀"})
            await send_json(producer, {"id": f"m{i}", "final": True})
            assert await recv_json(producer) == {"type": "ack", "id": f"m{i}", "channel": channel}
    epochs = set()
    for ws in subscribers:
        frames = [await recv_json(ws) for _ in range(5)]
        assert [(f["type"], f["id"], f["text"], f["offset"]) for f in frames] == [
            ("message", f"m{i}", f"text {i} é🚀", i + 1) for i in range(5)
        ]
        epochs |= {f["epoch"] for f in frames}
    # Each subscriber's own 0.2 s of silence, all watched at once.
    await asyncio.gather(*(assert_silent(ws, 0.2) for ws in subscribers))
    for ws in subscribers:
        await ws.close()
    assert len(epochs) == 1


async def test_deltas_and_snapshot_across_instances(
    pair: tuple[ServiceProcess, ServiceProcess],
) -> None:
    a, b = pair
    channel = "snapshot"
    watcher = await _subscribed(a.url, f"channel={channel}&deltas=1")
    async with open_producer(f"{a.url}/produce?channel={channel}") as producer:
        await send_json(producer, {"id": "m", "delta": "Hel"})
        # Once a's own subscriber has the delta, it has passed through Redis.
        assert (await recv_json(watcher))["delta"] == "Hel"
        late = await _subscribed(b.url, f"channel={channel}&deltas=1")
        assert await recv_json(late) == {
            "type": "snapshot",
            "channel": channel,
            "id": "m",
            "text": "Hel",
        }
        await send_json(producer, {"id": "m", "delta": "lo", "final": True})
        assert await recv_json(late) == {
            "type": "delta",
            "channel": channel,
            "id": "m",
            "delta": "lo",
        }
        final = await recv_json(late)
        assert (final["type"], final["text"]) == ("message", "Hello")
    await watcher.close()
    await late.close()


async def test_resume_on_b_after_being_on_a(pair: tuple[ServiceProcess, ServiceProcess]) -> None:
    a, b = pair
    channel = "resume"
    first = await connect(f"{a.url}/subscribe")
    await send_json(first, {"type": "subscribe", "channel": channel})
    epoch = (await recv_json(first))["epoch"]
    async with open_producer(f"{a.url}/produce?channel={channel}") as producer:
        for i in range(2):
            await send_json(producer, {"id": f"m{i}", "delta": f"t{i}", "final": True})
            await recv_json(producer)
        assert [(await recv_json(first))["offset"] for _ in range(2)] == [1, 2]
        await first.close()
        for i in range(2, 4):
            await send_json(producer, {"id": f"m{i}", "delta": f"t{i}", "final": True})
            await recv_json(producer)
        async with connect(f"{b.url}/subscribe") as again:
            await send_json(
                again,
                {"type": "subscribe", "channel": channel, "since": {"offset": 2, "epoch": epoch}},
            )
            assert await recv_json(again) == {
                "type": "subscribed",
                "channel": channel,
                "offset": 4,
                "epoch": epoch,
                "recovered": True,
                "replayed": 2,
            }
            replayed = [await recv_json(again) for _ in range(2)]
            assert [(f["id"], f["offset"]) for f in replayed] == [("m2", 3), ("m3", 4)]
            await send_json(producer, {"id": "m4", "delta": "t4", "final": True})
            live = await recv_json(again)
            assert (live["id"], live["offset"]) == ("m4", 5)
            await assert_silent(again, 0.2)


async def test_cancel_is_routed_across_instances(
    pair: tuple[ServiceProcess, ServiceProcess],
) -> None:
    a, b = pair
    channel = "cancel"
    watcher = await _subscribed(b.url, f"channel={channel}&deltas=1")
    async with (
        open_producer(f"{a.url}/produce?channel={channel}") as owner,
        open_producer(f"{b.url}/produce?channel={channel}") as bystander,
    ):
        await send_json(owner, {"id": "long", "delta": "thinking"})
        await send_json(bystander, {"id": "other", "delta": "busy"})
        seen = {(await recv_json(watcher))["id"] for _ in range(2)}
        assert seen == {"long", "other"}
        await send_json(watcher, {"type": "cancel", "channel": channel, "id": "long"})
        assert await recv_json(owner) == {"type": "cancel", "channel": channel, "id": "long"}
        await assert_silent(bystander, 0.3)
        await send_json(watcher, {"type": "cancel", "channel": channel, "id": "missing"})
        assert (await recv_json(watcher))["code"] == "unknown_message"
    await watcher.close()


async def test_redis_killed_mid_stream_and_restarted(
    own_pair: tuple[ServiceProcess, ServiceProcess], redis_server: RedisServer
) -> None:
    a, b = own_pair
    assert await a.http_status("/readyz") == 200
    watcher = await _subscribed(b.url, "channel=c&deltas=1")
    old_epoch = None
    async with open_producer(f"{a.url}/produce?channel=c") as producer:
        await send_json(producer, {"id": "before", "delta": "safe", "final": True})
        assert (await recv_json(producer))["type"] == "ack"
        await send_json(producer, {"id": "m", "delta": "part one, "})
        frames = [await recv_json(watcher) for _ in range(3)]
        old_epoch = frames[1]["epoch"]
        assert frames[2]["delta"] == "part one, "

        redis_server.kill()

        async def not_ready() -> bool:
            return await a.http_status("/readyz") == 503

        await _eventually(not_ready)
        assert await a.http_status("/healthz") == 200
        await send_json(producer, {"id": "m", "delta": "part two"})
        await send_json(producer, {"id": "m", "final": True})
        error = await recv_json(producer)
        assert (error["type"], error["code"], error["id"]) == ("error", "broker_unavailable", "m")

        redis_server.start()

        async def ready() -> bool:
            return await a.http_status("/readyz") == 200 and await b.http_status("/readyz") == 200

        await _eventually(ready)
        # Subscribers are told to resume: what was published meanwhile may be missing.
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await recv_json(watcher, 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012

        async with connect(f"{b.url}/subscribe") as again:
            await send_json(
                again,
                {"type": "subscribe", "channel": "c", "since": {"offset": 1, "epoch": old_epoch}},
            )
            gap = await recv_json(again)
            assert gap["recovered"] is False and gap["epoch"] != old_epoch
            # The producer retries its final; nothing it sent was lost.
            await send_json(producer, {"id": "m", "final": True})
            assert await recv_json(producer) == {"type": "ack", "id": "m", "channel": "c"}
            message = await recv_json(again)
            assert (message["type"], message["text"]) == ("message", "part one, part two")
    assert a.alive and b.alive


async def test_workers_share_one_port_through_redis(redis_server: RedisServer) -> None:
    relay = await relay_process("--workers", "2", "--broker", redis_server.url).start()
    try:
        subscribers = [await _subscribed(relay.url) for _ in range(8)]
        async with open_producer(f"{relay.url}/produce?channel=c") as producer:
            await send_json(producer, {"id": "m", "delta": "to every worker", "final": True})
            assert (await recv_json(producer))["type"] == "ack"
        for ws in subscribers:
            assert (await recv_json(ws))["text"] == "to every worker"
            await ws.close()
        assert relay.process is not None
        relay.process.terminate()
        assert await asyncio.wait_for(relay.process.wait(), 15) == 0
    finally:
        await relay.stop()


async def test_one_live_owner_per_id_across_processes(
    pair: tuple[ServiceProcess, ServiceProcess],
) -> None:
    a, b = pair
    watcher = await _subscribed(b.url, "channel=owned&deltas=1")
    try:
        async with (
            open_producer(f"{a.url}/produce?channel=owned") as first,
            open_producer(f"{b.url}/produce?channel=owned") as second,
        ):
            await send_json(first, {"id": "m", "delta": "first "})
            assert (await recv_json(watcher))["delta"] == "first "
            await send_json(second, {"id": "m", "delta": "second"})
            refused = await recv_json(second)
            assert (refused["type"], refused["code"], refused["id"]) == ("error", "id_in_use", "m")
            await send_json(second, {"id": "m", "delta": "again", "final": True})
            assert (await recv_json(second))["code"] == "id_in_use"
            await send_json(first, {"id": "m", "delta": "wins", "final": True})
            assert (await recv_json(first))["type"] == "ack"
            assert await recv_json(watcher) == {
                "type": "delta", "channel": "owned", "id": "m", "delta": "wins",
            }  # fmt: skip
            message = await recv_json(watcher)
            assert (message["type"], message["text"]) == ("message", "first wins")
            # The refused producer's later events stay refused, even now that the id is free.
            await send_json(second, {"id": "m", "delta": "mine now", "final": True})
            assert (await recv_json(second))["code"] == "id_in_use"
            # Another producer, on either process, finds the id still held (--id-hold) once
            # its message ended: refused, and nothing of it is delivered.
            for relay in (b, a):
                async with open_producer(f"{relay.url}/produce?channel=owned") as third:
                    await send_json(third, {"id": "m", "delta": "mine now"})
                    await send_json(third, {"id": "m", "final": True})
                    for _ in range(2):
                        assert (await recv_json(third))["code"] == "id_in_use"
            await send_json(first, {"id": "end", "final": True})
            assert (await recv_json(first))["type"] == "ack"
            end = await recv_json(watcher)
            assert (end["type"], end["id"], end["text"]) == ("message", "end", "")
    finally:
        await watcher.close()


@pytest.mark.parametrize(
    ("play", "watched", "channel"),
    [(race, 0, "raced"), (one_after_the_other, 1, "held")],
    ids=["racing", "one_after_the_other"],
)
async def test_two_producers_on_two_processes_under_one_id_deliver_one_message(
    pair: tuple[ServiceProcess, ServiceProcess],
    play: Callable[..., Coroutine[Any, Any, None]],
    watched: int,
    channel: str,
) -> None:
    # A channel of its own per play: the processes (and their Redis) serve the whole module.
    a, b = pair
    watcher = await _subscribed(pair[watched].url, f"channel={channel}&deltas=1")
    try:
        async with (
            open_producer(f"{a.url}/produce?channel={channel}") as first,
            open_producer(f"{b.url}/produce?channel={channel}") as second,
        ):
            await play((first, second), watcher, ROUNDS)
    finally:
        await watcher.close()


async def test_a_producer_resumes_its_session_on_another_process_exactly_once(
    pair: tuple[ServiceProcess, ServiceProcess],
) -> None:
    a, b = pair
    watcher = await _subscribed(b.url, "channel=moved&deltas=1")
    try:
        async with open_producer(f"{a.url}/produce?channel=moved") as first:
            token = first.session["session"]  # type: ignore[attr-defined]
            for seq, delta in enumerate(["one ", "two ", "three "], start=1):
                await send_json(first, {"id": "m", "delta": delta, "seq": seq})
            await send_json(first, {"id": "done", "delta": "x", "final": True, "seq": 1})
            assert (await recv_json(first))["type"] == "ack"
            # Every delta, in order (deltas written together may come joined), then "done".
            seen = [await recv_json(watcher)]
            while seen[-1]["type"] == "delta":
                seen.append(await recv_json(watcher))
            assert seen[-1]["type"] == "message" and seen[-1]["id"] == "done"
            by_id: dict[str, str] = {}
            for frame in seen[:-1]:
                by_id[frame["id"]] = by_id.get(frame["id"], "") + frame["delta"]
            assert by_id == {"m": "one two three ", "done": "x"}
            # The gateway moves to the other process and, not knowing what arrived, sends
            # everything of its unacknowledged message again, and a final it had acked.
            async with open_producer(f"{b.url}/produce?session={token}") as second:
                assert second.session["resumed"] is True  # type: ignore[attr-defined]
                events = [
                    {"id": "m", "delta": d, "seq": n, "channel": "moved"}
                    for n, d in enumerate(["one ", "two ", "three ", "four"], start=1)
                ]
                events.append({"id": "m", "final": True, "seq": 5, "channel": "moved"})
                events.append({"id": "done", "delta": "x", "final": True, "seq": 1,
                               "channel": "moved"})  # fmt: skip
                await send_json(second, events)
                acks = await recv_json(second)
                assert acks["type"] == "acks"
                assert [(e["id"], e.get("duplicate", False)) for e in acks["acks"]] == [
                    ("m", False), ("done", True),
                ]  # fmt: skip
                assert await recv_json(watcher) == {
                    "type": "delta", "channel": "moved", "id": "m", "delta": "four",
                }  # fmt: skip
                message = await recv_json(watcher)
                assert (message["type"], message["text"]) == ("message", "one two three four")
                await assert_silent(watcher, 0.3)  # no aborted, nothing twice
    finally:
        await watcher.close()


async def test_a_killed_process_leaves_no_zombie_message(redis_server: RedisServer) -> None:
    flags = ("--broker", redis_server.url, "--session-grace", "0.5", "--lease-seconds", "1")
    a, b = relay_process(*flags), relay_process(*flags)
    await asyncio.gather(a.start(), b.start())
    try:
        watcher = await _subscribed(b.url, "channel=z&deltas=1")
        async with open_producer(f"{a.url}/produce?channel=z") as producer:
            await send_json(producer, {"id": "m", "delta": "cut short", "seq": 1})
            assert (await recv_json(watcher))["delta"] == "cut short"
            await a.kill()  # kill -9: no goodbye, no abort from A itself
            started = asyncio.get_running_loop().time()
            aborted = await recv_json(watcher, 15)
            elapsed = asyncio.get_running_loop().time() - started
        assert (aborted["type"], aborted["id"], aborted["text"], aborted["reason"]) == (
            "aborted", "m", "cut short", "relay_lost",
        )  # fmt: skip
        assert elapsed < 0.5 + 1 + 3  # grace, lease and lease rounds, with room
        await assert_silent(watcher, 1.0)  # exactly once
        # A joiner gets no stale snapshot of it.
        late = await _subscribed(b.url, "channel=z&deltas=1")
        await assert_silent(late, 0.2)
        await late.close()
        await watcher.close()
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def test_a_rolling_restart_of_both_processes_aborts_nothing(
    redis_server: RedisServer,
) -> None:
    flags = ("--broker", redis_server.url, "--session-grace", "15")
    relays = [relay_process(*flags), relay_process(*flags)]
    await asyncio.gather(*(relay.start() for relay in relays))
    balancer = Balancer([relay.port for relay in relays])
    expected: dict[str, str] = {}
    received: dict[str, list[str]] = {}
    aborted: list[str] = []

    async def gateway(number: int) -> None:
        async with RelayProducer(balancer.url, channel="roll", backoff=(0.05, 0.5)) as producer:
            for reply in range(5):
                message_id = f"g{number}-r{reply}"
                tokens = [f"{message_id}:{n} " for n in range(30)]
                expected[message_id] = "".join(tokens)
                for token in tokens:
                    await producer.send(message_id, token)
                    await asyncio.sleep(0.01)
                ack = await asyncio.wait_for(producer.finish(message_id), 30)
                assert ack.id == message_id

    async with balancer, RelaySubscriber(balancer.url, ["roll"], deltas=False) as feed:

        async def watch() -> None:
            async for frame in feed:
                if isinstance(frame, MessageFrame):
                    received.setdefault(frame.id, []).append(frame.text)
                elif isinstance(frame, Aborted):
                    aborted.append(frame.id)

        watcher = asyncio.create_task(watch())
        gateways = asyncio.gather(*(gateway(n) for n in range(10)))
        for index in range(2):  # one by one, as a deployment does
            await asyncio.sleep(0.8)
            assert await relays[index].terminate(10) == 0
            relays[index] = relay_process(*flags)
            await relays[index].start()
            balancer.backends = [relay.port for relay in relays]
        await asyncio.wait_for(gateways, 60)
        await eventually(lambda: len(received) == 50, 15)
        await asyncio.sleep(0.3)
        watcher.cancel()
    await asyncio.gather(*(relay.stop() for relay in relays))
    assert aborted == []
    assert {message_id: texts for message_id, texts in received.items()} == {
        message_id: [text] for message_id, text in expected.items()
    }


async def test_a_frame_that_arrives_as_a_process_begins_to_stop_aborts_nothing(
    redis_server: RedisServer,
) -> None:
    # Played step by step: a process begins to stop, a producer's frame arrives before the
    # hand-off (not applied: it ends the connection's serving), then the process hands off
    # and stops; the producer is told 1012 (it was told 1000, as if done with). The session
    # waits in Redis: the producer resumes on the other process and its message completes
    # once, never aborted first (its readers got the message aborted, then whole, when the
    # session was ended there).
    running_a, a = await start_relay(broker=redis_server.url, session_grace=15)
    running_b, b = await start_relay(broker=redis_server.url, session_grace=15)
    async with b:
        watcher = await _subscribed(running_b.url, "channel=stopping&deltas=1")
        async with a, open_producer(f"{running_a.url}/produce?channel=stopping") as producer:
            token = producer.session["session"]  # type: ignore[attr-defined]
            await send_json(producer, {"id": "m", "delta": "one ", "seq": 1})
            assert (await recv_json(watcher))["delta"] == "one "
            # A's stop is held at its first wait (its Durable Streams reads answered), after
            # its first step (stopping) and before its hand-off.
            gate, first_wait = asyncio.Event(), a.channels.stop

            async def held() -> None:
                await gate.wait()
                await first_wait()

            a.channels.stop = held  # type: ignore[method-assign]
            stopping = asyncio.create_task(a.stop())
            await asyncio.sleep(0.05)
            await send_json(producer, {"id": "m", "delta": "two ", "seq": 2})
            await asyncio.sleep(0.2)  # the frame is read, not applied, and serving ends
            gate.set()
            await stopping
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(producer.recv(), 5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
        async with open_producer(f"{running_b.url}/produce?session={token}") as resumed:
            assert resumed.session["resumed"] is True  # type: ignore[attr-defined]
            await send_json(resumed, [
                {"id": "m", "delta": "one ", "seq": 1, "channel": "stopping"},
                {"id": "m", "delta": "two ", "seq": 2, "channel": "stopping"},
                {"id": "m", "final": True, "seq": 3, "channel": "stopping"},
            ])  # fmt: skip
            assert (await recv_json(resumed))["type"] == "acks"
        assert await recv_json(watcher) == {
            "type": "delta", "channel": "stopping", "id": "m", "delta": "two ",
        }  # fmt: skip
        message = await recv_json(watcher)
        assert (message["type"], message["text"]) == ("message", "one two ")
        await assert_silent(watcher, 0.3)  # nothing aborted, nothing twice
        await watcher.close()


async def test_a_redis_restart_mid_stream_loses_and_doubles_nothing(
    redis_server: RedisServer,
) -> None:
    flags = ("--broker", redis_server.url)
    a, b = relay_process(*flags), relay_process(*flags)
    await asyncio.gather(a.start(), b.start())
    expected = {f"q{n}": "".join(f"{n}.{t} " for t in range(30)) for n in range(20)}
    acked: list[str] = []
    live: list[dict[str, Any]] = []
    sent: dict[str, int] = {}

    async def gateway(url: str, ids: list[str]) -> None:
        async with RelayProducer(url, channel="restart", backoff=(0.05, 0.5)) as producer:
            for message_id in ids:
                for token in expected[message_id].split(" ")[:-1]:
                    await producer.send(message_id, token + " ")
                    sent[message_id] = sent.get(message_id, 0) + 1
                    await asyncio.sleep(0.01)
                await asyncio.wait_for(producer.finish(message_id), 30)
                acked.append(message_id)

    try:
        watcher = await _subscribed(b.url, "channel=restart")

        async def watch() -> None:
            with contextlib.suppress(ConnectionClosed):
                while True:
                    live.append(await recv_json(watcher, 30))

        watching = asyncio.create_task(watch())
        ids = sorted(expected)
        gateways = asyncio.gather(*(gateway((a, b)[n % 2].url, ids[n::10]) for n in range(10)))
        # Mid-stream: every gateway has sent 5 of its first message's 30 tokens (10 ms
        # apart), so none has ended one yet.
        await eventually(
            lambda: all(sent.get(first, 0) >= 5 for first in ids[:10]),
            15,
            what="every gateway streaming",
        )
        assert acked == []
        redis_server.kill()  # empty on restart: a new epoch for every channel
        await asyncio.sleep(0.5)
        redis_server.start()
        await asyncio.wait_for(gateways, 60)
        watching.cancel()
        # A's writes go through its pool again, but its pub/sub connection may still be in
        # its reconnect backoff, and until then it refuses subscribes (broker_unavailable):
        # wait until it says it is ready, as a load balancer would.
        await eventually(lambda: _ready(a), 10, what="relay A ready again")
        # What the subscriber saw before the restart, and the new epoch's whole history.
        async with connect(f"{a.url}/subscribe") as replay:
            await send_json(replay, {"type": "subscribe", "channel": "restart"})
            current = await recv_json(replay)
            await send_json(replay, {"type": "unsubscribe", "channel": "restart"})
            await recv_json(replay)
            await send_json(
                replay,
                {"type": "subscribe", "channel": "restart",
                 "since": {"offset": 0, "epoch": current["epoch"]}},
            )  # fmt: skip
            assert (await recv_json(replay))["recovered"] is True
            history = [await recv_json(replay) for _ in range(current["offset"])]
        before = [f for f in live if f["type"] in ("message", "aborted")]
        before = [f for f in before if f["epoch"] != current["epoch"]]
        terminal = before + history
        assert sorted(acked) == ids
        ends = [f["id"] for f in terminal]
        assert sorted(ends) == ids  # every message ends in exactly one terminal frame
        assert {f["id"]: f["text"] for f in terminal if f["type"] == "message"} == expected
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def _kept_in_redis(
    redis_server: RedisServer, message_id: str, text: str, meta: dict[str, Any]
) -> bool:
    """Whether Redis holds what another process reads of a message in progress when it takes
    its session over or aborts it: listed in its owner's messages, its text, its meta."""
    async with Redis.from_url(redis_server.url) as redis:
        listed = [key async for key in redis.scan_iter(match="tr:msg:*")]
        listed = [key for key in listed if await redis.hexists(key, message_id)]
        texts = [key async for key in redis.scan_iter(match=f"tr:text:*|{message_id}")]
        metas = [key async for key in redis.scan_iter(match="tr:meta:*")]
        kept = [await redis.hget(key, message_id) for key in metas]
        return (
            len(listed) == 1
            and [await redis.get(key) for key in texts] == [text.encode()]
            and [json.loads(value) for value in kept if value is not None] == [meta]
        )


async def test_meta_survives_a_move_to_another_process_and_a_lost_one(
    redis_server: RedisServer,
) -> None:
    flags = ("--broker", redis_server.url, "--session-grace", "0.5", "--lease-seconds", "1")
    a, b = relay_process(*flags), relay_process(*flags)
    await asyncio.gather(a.start(), b.start())
    try:
        watcher = await _subscribed(b.url, "channel=meta")
        # A session resumed on the other process keeps its message's meta.
        first = await connect(f"{a.url}/produce?channel=meta")
        token = (await recv_json(first))["session"]
        await send_json(first, {"id": "m", "delta": "one ", "seq": 1, "meta": {"model": "x"}})
        await eventually(
            lambda: _kept_in_redis(redis_server, "m", "one ", {"model": "x"}),
            10,
            what="m's text and meta in Redis",
        )
        assert first.transport is not None
        first.transport.abort()
        async with connect(f"{b.url}/produce?channel=meta&session={token}") as second:
            assert (await recv_json(second))["resumed"] is True
            final = {"id": "m", "delta": "two", "seq": 2, "final": True, "meta": {"end": 1}}
            await send_json(second, final)
            assert (await recv_json(second))["type"] == "ack"
        message = await recv_json(watcher)
        assert (message["text"], message["meta"]) == ("one two", {"model": "x", "end": 1})
        # A message whose process died is aborted elsewhere with its meta.
        async with open_producer(f"{a.url}/produce?channel=meta") as producer:
            await send_json(producer, {"id": "n", "delta": "cut", "seq": 1, "meta": {"k": 2}})
            await eventually(
                lambda: _kept_in_redis(redis_server, "n", "cut", {"k": 2}),
                10,
                what="n's text and meta in Redis",
            )
            await a.kill()
            aborted = await recv_json(watcher, 15)
        assert (aborted["type"], aborted["reason"], aborted["meta"]) == (
            "aborted", "relay_lost", {"k": 2},
        )  # fmt: skip
        await watcher.close()
    finally:
        await asyncio.gather(a.stop(), b.stop())


async def test_a_pub_sub_connection_gone_dead_without_a_reset_is_replaced(
    redis_server: RedisServer,
) -> None:
    """Every connection to Redis goes silent at once, none reset (a network path dropped):
    the relay pings its quiet pub/sub connection, replaces it when the ping goes unanswered,
    tells its subscribers to resume (1012), and publishes again on new connections."""
    async with Proxy(redis_server.port) as path:
        relay = relay_process("--broker", f"redis://127.0.0.1:{path.port}/0")
        await relay.start()
        try:
            watcher = await _subscribed(relay.url)
            assert path.freeze() >= 2  # pub/sub and at least one command connection
            loop = asyncio.get_running_loop()
            frozen = loop.time()
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await recv_json(watcher, 20)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
            # About 3 s of silence, then 5 s for the ping's answer: not before, not long after.
            assert 7 < loop.time() - frozen < 16

            async def ready() -> bool:
                return await relay.http_status("/readyz") == 200

            await _eventually(ready)
            again = await _subscribed(relay.url)
            async with open_producer(f"{relay.url}/produce?channel=c") as producer:
                await send_json(producer, {"id": "after", "delta": "through", "final": True})
                assert (await recv_json(producer, 10))["type"] == "ack"
            frame = await recv_json(again, 10)
            assert (frame["type"], frame["id"], frame["text"]) == ("message", "after", "through")
            await again.close()
        finally:
            await relay.stop()


async def _ready(relay: ServiceProcess) -> bool:
    return await relay.http_status("/readyz") == 200
