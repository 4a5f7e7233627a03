"""End to end: batched producer frames, the delta flush window, the event loop choice."""

from __future__ import annotations

import asyncio
import json
import signal

from ..conftest import (
    RunningRelay,
    assert_silent,
    recv_json,
    send_json,
    start_relay,
    subscribed_pair,
)
from ..harness import relay_process
from .conftest import OpenRelay


async def test_a_batch_is_applied_in_order_and_acked_in_one_frame(relay: RunningRelay) -> None:
    async with subscribed_pair(relay, deltas=True) as (sub, producer):
        batch = [
            {"id": "a", "delta": "Hel"},
            {"id": "b", "delta": "Wor"},
            {"id": "a", "delta": "lo", "final": True},
            {"id": "b", "delta": "ld"},
            {"id": "b", "final": True},
            {"id": "a", "final": True},
        ]
        await send_json(producer, batch)
        assert await recv_json(producer) == {
            "type": "acks",
            "acks": [
                {"id": "a", "channel": "c"},
                {"id": "b", "channel": "c"},
                {"id": "a", "channel": "c"},
            ],
        }
        frames = [await recv_json(sub) for _ in range(6)]
        assert [(f["type"], f["id"]) for f in frames] == [
            ("delta", "a"),
            ("delta", "b"),
            ("delta", "a"),
            ("message", "a"),
            ("delta", "b"),
            ("message", "b"),
        ]
        assert (frames[3]["text"], frames[5]["text"]) == ("Hello", "World")
        await assert_silent(sub, 0.1)


async def test_an_invalid_event_rejects_the_whole_batch_and_names_its_index(
    relay: RunningRelay,
) -> None:
    async with subscribed_pair(relay) as (sub, producer):
        await send_json(
            producer, [{"id": "a", "delta": "x", "final": True}, {"id": "b", "delta": 5}]
        )
        error = await recv_json(producer)
        assert (error["code"], error["index"], error["id"]) == ("invalid_event", 1, "b")
        assert "'delta'" in error["message"]
        await send_json(producer, [])
        assert (await recv_json(producer))["code"] == "invalid_event"
        await assert_silent(sub, 0.1)
        await send_json(producer, [{"id": "a", "delta": "ok", "final": True}])
        assert (await recv_json(producer))["type"] == "acks"
        assert (await recv_json(sub))["text"] == "ok"


async def test_a_rejected_event_in_a_batch_leaves_the_others_applied(
    relay: RunningRelay,
) -> None:
    async with subscribed_pair(relay, producer="/produce") as (sub, producer):
        await send_json(
            producer,
            [
                {"id": "a", "delta": "one", "channel": "c"},
                {"id": "a", "delta": "wrong room", "channel": "d"},
                {"id": "a", "delta": " two", "final": True, "channel": "c"},
            ],
        )
        error = await recv_json(producer)
        assert (error["code"], error["index"], error["id"]) == ("channel_mismatch", 1, "a")
        assert await recv_json(producer) == {"type": "acks", "acks": [{"id": "a", "channel": "c"}]}
        assert (await recv_json(sub))["text"] == "one two"


async def test_flush_window_merges_deltas_per_message_losslessly(open_relay: OpenRelay) -> None:
    async with open_relay(delta_flush_ms=50, deltas=True) as (_, sub, producer):
        await send_json(
            producer,
            [{"id": "a", "delta": f"a{i} "} for i in range(50)]
            + [{"id": "b", "delta": f"b{i} "} for i in range(50)],
        )
        first = await recv_json(sub)
        second = await recv_json(sub)
        assert (first["id"], first["delta"]) == ("a", "".join(f"a{i} " for i in range(50)))
        assert (second["id"], second["delta"]) == ("b", "".join(f"b{i} " for i in range(50)))
        # A final sends what the window holds before the message, never after.
        await send_json(producer, [{"id": "a", "delta": "end"}, {"id": "a", "final": True}])
        assert (await recv_json(sub))["delta"] == "end"
        message = await recv_json(sub)
        assert (message["type"], message["text"]) == (
            "message",
            "".join(f"a{i} " for i in range(50)) + "end",
        )


async def test_flush_window_keeps_snapshot_plus_deltas_exact_for_joiners() -> None:
    running, relay = await start_relay(delta_flush_ms=200)
    async with relay, running.connect("/produce?channel=c") as producer:
        watcher = await running.connect("/subscribe?channel=c&deltas=1").__aenter__()
        await recv_json(watcher)
        await send_json(producer, {"id": "m", "delta": "held "})
        await asyncio.sleep(0.02)
        async with running.connect("/subscribe?channel=c&deltas=1") as late:
            await recv_json(late)
            snapshot = await recv_json(late)
            assert (snapshot["type"], snapshot["text"]) == ("snapshot", "held ")
            await send_json(producer, {"id": "m", "delta": "more", "final": True})
            assert (await recv_json(late))["delta"] == "more"
            assert (await recv_json(late))["text"] == "held more"
        assert (await recv_json(watcher))["delta"] == "held "
        await watcher.close()


async def test_relay_runs_on_uvloop() -> None:
    relay = await relay_process("--loop", "uvloop").start()
    try:
        async with subscribed_pair(relay) as (sub, producer):
            await producer.send(json.dumps({"id": "m", "delta": "fast", "final": True}))
            assert (await recv_json(sub))["text"] == "fast"
        assert relay.process is not None
        relay.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(relay.process.wait(), 10) == 0
    finally:
        await relay.stop()


def test_websockets_c_speedups_are_loaded() -> None:
    from token_relay.edge.relay import SPEEDUPS

    assert SPEEDUPS is True
