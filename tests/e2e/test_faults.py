"""Faults: peers that die or stall, and what everyone else sees."""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap

import pytest
from websockets.exceptions import ConnectionClosed

from ..conftest import (
    RunningRelay,
    assert_silent,
    recv_json,
    send_json,
    start_relay,
    subscribed_pair,
)

STREAMER = textwrap.dedent(
    """
    import asyncio, json, sys
    from websockets.asyncio.client import connect

    async def main():
        async with connect(sys.argv[1]) as ws:
            n = 0
            while True:
                await ws.send(json.dumps({"id": "doomed", "delta": f"t{n} "}))
                n += 1
                await asyncio.sleep(0.01)

    asyncio.run(main())
    """
)

LISTENER = textwrap.dedent(
    """
    import asyncio, sys
    from websockets.asyncio.client import connect

    async def main():
        async with connect(sys.argv[1]) as ws:
            async for _ in ws:
                pass

    asyncio.run(main())
    """
)


async def _spawn(script: str, url: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, "-c", script, url)


async def test_killed_producer_process_aborts_its_message_after_the_grace() -> None:
    relay, server = await start_relay(session_grace=1.0)
    async with server, relay.connect("/subscribe?channel=c&deltas=1") as sub:
        await recv_json(sub)
        producer = await _spawn(STREAMER, relay.url + "/produce?channel=c")
        seen = ""
        while len(seen) < 40:
            frame = await recv_json(sub)
            assert frame["type"] == "delta"
            seen += frame["delta"]
        producer.send_signal(signal.SIGKILL)
        await producer.wait()
        # It vanished without a close frame: its session waits for a reconnect first.
        async with asyncio.timeout(5):
            while not any(  # noqa: ASYNC110 - waits for the relay to notice the drop
                link.connection is None for link in relay.relay.sessions.by_owner.values()
            ):
                await asyncio.sleep(0.01)
        while (frame := await recv_json(sub))["type"] == "delta":
            seen += frame["delta"]
        assert (frame["type"], frame["id"], frame["reason"]) == (
            "aborted",
            "doomed",
            "producer_disconnected",
        )
        assert frame["text"] == seen
        assert relay.relay.sessions.by_owner == {}


async def test_killed_subscriber_process_leaves_others_unaffected(relay: RunningRelay) -> None:
    async with subscribed_pair(relay) as (survivor, producer):
        victim = await _spawn(LISTENER, relay.url + "/subscribe?channel=c")
        hub = relay.relay.hub
        async with asyncio.timeout(10):
            while len(hub.subscribers("c")) < 2:  # noqa: ASYNC110 - waits for the spawned peer
                await asyncio.sleep(0.02)
        await send_json(producer, {"id": "before", "delta": "both", "final": True})
        assert (await recv_json(survivor))["text"] == "both"
        victim.send_signal(signal.SIGKILL)
        await victim.wait()
        for i in range(20):
            await send_json(producer, {"id": f"after{i}", "delta": "only me", "final": True})
            assert (await recv_json(producer))["type"] == "ack"
        for i in range(20):
            assert (await recv_json(survivor))["id"] == f"after{i}"
        async with asyncio.timeout(10):
            while len(hub.subscribers("c")) > 1:  # noqa: ASYNC110 - waits for the relay to notice
                await asyncio.sleep(0.02)


async def test_subscriber_that_never_reads_is_merged_then_closed_and_others_go_on() -> None:
    running, relay = await start_relay(
        subscriber_high_water_bytes=16 * 1024,
        max_subscriber_buffer_bytes=2 * 1024 * 1024,
        max_message_chars=64 * 1024 * 1024,
    )
    async with (
        relay,
        running.connect("/subscribe?channel=c&deltas=1", max_size=None) as stuck,
        running.connect("/subscribe?channel=c", max_size=None) as healthy,
        running.connect("/produce?channel=c") as producer,
    ):
        await recv_json(stuck)
        await recv_json(healthy)
        stuck.transport.pause_reading()
        piece = "z" * 1000
        for _ in range(8_000):
            await send_json(producer, {"id": "flood", "delta": piece})
        await send_json(producer, {"id": "flood", "final": True})
        assert (await recv_json(producer))["type"] == "ack"
        message = await recv_json(healthy, 10)
        assert message["text"] == piece * 8_000
        assert relay.metrics.deltas_coalesced.value > 0
        assert relay.metrics.slow_closes.value == 1
        assert stuck not in relay.hub.subscriber_handles()
        await assert_silent(healthy, 0.1)
        stuck.transport.resume_reading()
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await recv_json(stuck, 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
