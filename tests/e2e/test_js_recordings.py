"""The frame sequences the JS client's unit tests replay, recorded from a real relay.

Each scenario plays a subscriber's connections against a relay over real sockets and
records what each connection sent and got. The recordings live in
``clients/js/test/recordings/``; ``node --test`` feeds them to the client's state logic.
This test records every scenario again and compares it with the committed file (epochs,
which are random per relay, are named ``E1``, ``E2``… in order of appearance), so the
recordings can never drift from what the relay really sends. ``TOKEN_RELAY_RECORD=1``
writes them afresh.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from ..conftest import RunningRelay, recv_json, send_json, start_relay

RECORDINGS = Path(__file__).parents[2] / "clients" / "js" / "test" / "recordings"

Frame = dict[str, Any]


class Recorder:
    """The connections of one subscriber, in order: what it sent, what it got."""

    def __init__(self, running: RunningRelay, stack: AsyncExitStack) -> None:
        self.running = running
        self.stack = stack
        self.connections: list[dict[str, Any]] = []

    async def producer(self) -> Any:
        return await self.stack.enter_async_context(self.running.connect("/produce?channel=chat"))

    async def watcher(self) -> Any:
        """A deltas subscriber of its own, not recorded: it tells when a delta was applied."""
        ws = await self.stack.enter_async_context(self.running.connect("/subscribe"))
        await send_json(ws, _sub("chat"))
        assert (await recv_json(ws))["type"] == "subscribed"
        return ws

    async def connect(self, subscribe: Frame, *, stale: bool = False) -> Any:
        ws = await self.stack.enter_async_context(self.running.connect("/subscribe"))
        await send_json(ws, subscribe)
        entry: dict[str, Any] = {"subscribe": subscribe, "frames": []}
        if stale:
            entry["stale"] = True
        self.connections.append(entry)
        return ws

    async def take(self, ws: Any, count: int) -> list[Frame]:
        frames = [await recv_json(ws) for _ in range(count)]
        self.connections[-1]["frames"].extend(frames)
        return frames


async def _publish(producer: Any, message_id: str, *deltas: str, final: bool = True) -> None:
    for delta in deltas:
        await send_json(producer, {"id": message_id, "delta": delta})
    if final:
        await send_json(producer, {"id": message_id, "final": True})
        assert (await recv_json(producer))["type"] == "ack"


async def _applied(watcher: Any, message_id: str, delta: str) -> None:
    """Wait until the relay has applied ``delta`` of ``message_id`` (its watcher saw it)."""
    while True:
        frame = await recv_json(watcher)
        if frame.get("type") == "delta" and (frame["id"], frame["delta"]) == (message_id, delta):
            return


def _sub(channel: str, **extra: Any) -> Frame:
    return {"type": "subscribe", "channel": channel, "deltas": True, **extra}


# ---------------------------------------------------------------- scenarios


async def stream_and_abort(rec: Recorder) -> dict[str, Any]:
    ws = await rec.connect(_sub("chat", rewind=100))
    await rec.take(ws, 1)
    producer = await rec.producer()
    await _publish(producer, "m1", "Hel", "lo, ", "wörld 👋")
    await rec.take(ws, 4)
    await _publish(producer, "m2", "half a ", final=False)
    await rec.take(ws, 1)
    await producer.close()  # the producer dies mid-message
    await rec.take(ws, 1)
    await ws.close()
    return {
        "description": "a reply streamed by deltas and completed, then one whose producer died",
        "rewind": 100,
        "expected": [
            {"id": "m1", "text": "Hello, wörld 👋", "status": "complete"},
            {
                "id": "m2",
                "text": "half a ",
                "status": "aborted",
                "reason": "producer_disconnected",
            },
        ],
    }


async def resume(rec: Recorder) -> dict[str, Any]:
    producer = await rec.producer()
    watcher = await rec.watcher()
    first = await rec.connect(_sub("chat"))
    await rec.take(first, 1)
    await _publish(producer, "a1", "one")
    await rec.take(first, 2)
    await _publish(producer, "b", "Hal", "lo ", final=False)
    await rec.take(first, 2)
    await first.close()  # the network drops; the relay moves on meanwhile
    await _publish(producer, "a2", "two")
    await _publish(producer, "b", "wö", final=False)
    await _applied(watcher, "b", "wö")
    again = await rec.connect(
        _sub("chat", since={"offset": 1, "epoch": rec.connections[0]["frames"][0]["epoch"]},
             positions={"b": 6})
    )  # fmt: skip
    await rec.take(again, 3)  # subscribed (recovered), a2 replayed, b's snapshot from 6
    await _publish(producer, "b", "rld")
    await rec.take(again, 2)
    await again.close()
    await producer.close()
    return {
        "description": "a cut mid-reply: the missed message is replayed once and the reply "
        "in progress continues from the characters held (a snapshot with from)",
        "rewind": 0,
        "expected": [
            {"id": "a1", "text": "one", "status": "complete"},
            {"id": "b", "text": "Hallo wörld", "status": "complete"},
            {"id": "a2", "text": "two", "status": "complete"},
        ],
    }


async def rewind(rec: Recorder) -> dict[str, Any]:
    producer = await rec.producer()
    watcher = await rec.watcher()
    for n in range(1, 4):
        await _publish(producer, f"r{n}", f"reply {n}")
    await _publish(producer, "r4", "par", final=False)
    await _applied(watcher, "r4", "par")
    ws = await rec.connect(_sub("chat", rewind=2))
    await rec.take(ws, 4)  # subscribed (replayed 2), r2, r3, r4's snapshot
    await _publish(producer, "r4", "tial")
    await rec.take(ws, 2)
    await ws.close()
    await producer.close()
    return {
        "description": "a fresh page: the channel's last two messages, then the reply in "
        "progress, then live",
        "rewind": 2,
        "expected": [
            {"id": "r2", "text": "reply 2", "status": "complete"},
            {"id": "r3", "text": "reply 3", "status": "complete"},
            {"id": "r4", "text": "partial", "status": "complete"},
        ],
    }


async def duplicates(rec: Recorder) -> dict[str, Any]:
    producer = await rec.producer()
    first = await rec.connect(_sub("chat"))
    await rec.take(first, 1)
    for n in (1, 2):
        await _publish(producer, f"d{n}", f"text {n}")
    await rec.take(first, 4)
    await first.close()
    epoch = rec.connections[0]["frames"][0]["epoch"]
    # A resume from further back than the client holds (a second tab's position, say):
    # d2 comes again, and the client must not show it twice.
    again = await rec.connect(_sub("chat", since={"offset": 1, "epoch": epoch}), stale=True)
    await rec.take(again, 2)
    await _publish(producer, "d3", "text 3")
    await rec.take(again, 2)
    await again.close()
    await producer.close()
    return {
        "description": "a replay of a message already held is dropped, once",
        "rewind": 0,
        "outcomes": [None, ["changed", "duplicate", "changed", "changed"]],
        "expected": [
            {"id": "d1", "text": "text 1", "status": "complete"},
            {"id": "d2", "text": "text 2", "status": "complete"},
            {"id": "d3", "text": "text 3", "status": "complete"},
        ],
    }


SCENARIOS: dict[str, Callable[[Recorder], Awaitable[dict[str, Any]]]] = {
    "stream-and-abort": stream_and_abort,
    "resume": resume,
    "rewind": rewind,
    "duplicates": duplicates,
}


async def _gap() -> dict[str, Any]:
    """A relay restarted with its memory lost: the resume cannot fill the gap, and the
    reply that was in progress ends as lost."""
    first_running, first_relay = await start_relay()
    async with first_relay, AsyncExitStack() as stack:
        rec = Recorder(first_running, stack)
        producer = await rec.producer()
        ws = await rec.connect(_sub("chat"))
        await rec.take(ws, 1)
        await _publish(producer, "g1", "kept")
        await rec.take(ws, 2)
        await _publish(producer, "g2", "cut off", final=False)
        await rec.take(ws, 1)
        await ws.close()
        await producer.close()
    second_running, second_relay = await start_relay()
    async with second_relay, AsyncExitStack() as stack:
        rec.running, rec.stack = second_running, stack
        first = rec.connections[0]["frames"]
        since = {"offset": first[2]["offset"], "epoch": first[2]["epoch"]}
        again = await rec.connect(_sub("chat", since=since, positions={"g2": 7}))
        await rec.take(again, 1)
        producer = await rec.producer()
        await _publish(producer, "g3", "after")
        await rec.take(again, 2)
        await again.close()
        await producer.close()
    return {
        "scenario": "gap",
        "description": "the relay restarted with its memory lost: the gap can't be filled, "
        "the reply in progress ends as lost, and live messages go on",
        "rewind": 0,
        "gap": True,
        "expected": [
            {"id": "g1", "text": "kept", "status": "complete"},
            {"id": "g2", "text": "cut off", "status": "aborted", "reason": "relay_lost"},
            {"id": "g3", "text": "after", "status": "complete"},
        ],
        "connections": rec.connections,
    }


def _normalized(recording: dict[str, Any]) -> dict[str, Any]:
    """Name every epoch by its order of appearance, so two recordings compare equal."""
    names: dict[str, str] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                key: (
                    names.setdefault(item, f"E{len(names) + 1}")
                    if key == "epoch" and isinstance(item, str)
                    else walk(item)
                )
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    normalized: dict[str, Any] = walk(recording)
    return normalized


async def _record(name: str) -> dict[str, Any]:
    if name == "gap":
        return _normalized(await _gap())
    # No grace for a producer that went away: its message aborts at once.
    running, relay = await start_relay(session_grace=0)
    async with relay, AsyncExitStack() as stack:
        rec = Recorder(running, stack)
        meta = await SCENARIOS[name](rec)
    return _normalized({"scenario": name, **meta, "connections": rec.connections})


@pytest.mark.parametrize("name", [*SCENARIOS, "gap"])
async def test_the_js_recordings_are_what_the_relay_sends(name: str) -> None:
    recording = await _record(name)
    path = RECORDINGS / f"{name}.json"
    if os.environ.get("TOKEN_RELAY_RECORD"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(recording, indent=2, ensure_ascii=False) + "\n")
    assert json.loads(path.read_text()) == recording
