"""A producer's finals are published while it goes on: replies keep the order of its frames.

On Redis a final's message is published in a round trip; the relay applies the producer's
next events meanwhile, and holds each reply back until the ones before it are sent. These
tests play bursts of frames (messages, bad frames, repeated finals, batches) written all at
once against a relay in memory and one on a real redis-server, and against Redis killed
in the middle of a burst.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from token_relay.edge.producers import MAX_PENDING_REPLIES
from token_relay.testing import RedisServer, ServiceProcess, relay_process
from websockets.asyncio.client import ClientConnection, connect

MESSAGES = 300


def _script(count: int) -> tuple[list[Any], dict[str, str], int]:
    """Frames to send, the texts they complete, and how many replies they call for."""
    frames: list[Any] = []
    texts: dict[str, str] = {}
    replies = 0
    for n in range(count):
        message_id = f"m{n}"
        pieces = [f"#{n} ", "ça ", "va 🚀", ""]
        frames += [{"id": message_id, "delta": piece} for piece in pieces]
        frames.append({"id": message_id, "final": True})
        texts[message_id] = "".join(pieces)
        replies += 1
        if n % 17 == 5:
            frames.append({"id": 5})  # refused as it is read: an error frame, in its place
            replies += 1
        if n % 19 == 3:
            frames.append({"id": f"gap{n}", "seq": 3})  # refused by the rules, in its place
            replies += 1
        if n % 23 == 7:
            frames.append({"id": f"m{n - 3}", "final": True})  # repeated: acked again
            replies += 1
        if n % 31 == 11:
            first, second = f"b{n}a", f"b{n}b"
            frames.append(
                [
                    {"id": first, "delta": "one "},
                    {"id": second, "delta": "two", "final": True},
                    {"id": first, "delta": "done", "final": True},
                ]
            )
            texts[second], texts[first] = "two", "one done"
            replies += 1
    return frames, texts, replies


def _shape(reply: dict[str, Any]) -> Any:
    """A reply without what differs between runs (the error's words are kept)."""
    return json.dumps(reply, sort_keys=True)


@asynccontextmanager
async def _relay(*flags: str) -> AsyncIterator[ServiceProcess]:
    relay = relay_process("--max-events-per-second", "1000000", *flags)
    await relay.start()
    try:
        yield relay
    finally:
        await relay.stop()


async def _burst(
    relay: ServiceProcess, channel: str, frames: list[Any], replies: int
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Write every frame at once; the producer's replies, and what a subscriber got."""
    async with (
        connect(f"{relay.url}/subscribe?channel={channel}") as sub,
        connect(f"{relay.url}/produce?channel={channel}") as producer,
    ):
        assert json.loads(await sub.recv())["type"] == "subscribed"
        assert json.loads(await producer.recv())["type"] == "session"
        await asyncio.gather(*(producer.send(json.dumps(frame)) for frame in frames))
        got = [json.loads(await asyncio.wait_for(producer.recv(), 20)) for _ in range(replies)]
        received = await _messages(sub, len(_acked(got)))
    return got, received


def _acked(replies: list[dict[str, Any]]) -> set[str]:
    """The ids the replies acknowledge."""
    ids: set[str] = set()
    for reply in replies:
        if reply["type"] == "ack":
            ids.add(reply["id"])
        elif reply["type"] == "acks":
            ids.update(ack["id"] for ack in reply["acks"])
    return ids


async def _messages(sub: ClientConnection, count: int) -> dict[str, str]:
    received: dict[str, str] = {}
    offsets: list[int] = []
    while len(received) < count:
        frame = json.loads(await asyncio.wait_for(sub.recv(), 20))
        assert frame["type"] == "message", frame
        assert frame["id"] not in received, f"{frame['id']} delivered twice"
        received[frame["id"]] = frame["text"]
        offsets.append(frame["offset"])
    assert offsets == list(range(1, count + 1))
    return received


async def test_replies_on_redis_are_those_in_memory_in_the_same_order(
    redis_server: RedisServer,
) -> None:
    frames, texts, replies = _script(MESSAGES)
    async with _relay() as memory, _relay("--broker", redis_server.url) as shared:
        for _ in range(2):  # twice: the second burst meets a warm relay
            channel = f"burst-{uuid.uuid4().hex[:8]}"
            in_memory, delivered_memory = await _burst(memory, channel, frames, replies)
            on_redis, delivered_redis = await _burst(shared, channel, frames, replies)
            assert [_shape(r) for r in on_redis] == [_shape(r) for r in in_memory]
            kinds = {r["type"] for r in on_redis}
            assert kinds == {"ack", "acks", "error"}
            assert delivered_redis == delivered_memory == texts


async def test_redis_killed_mid_burst_every_final_is_answered_once_in_order(
    redis_server: RedisServer,
) -> None:
    frames = []
    for n in range(MESSAGES):
        frames += [{"id": f"k{n}", "delta": f"text {n}"}, {"id": f"k{n}", "final": True}]
    async with (
        _relay("--broker", redis_server.url) as relay,
        connect(f"{relay.url}/produce?channel=killed") as producer,
    ):
        assert json.loads(await producer.recv())["type"] == "session"
        # Half the burst, then Redis dies under the first reply, while that half is being
        # published; the other half follows into a relay whose broker is gone.
        half = len(frames) // 2
        sending = asyncio.gather(*(producer.send(json.dumps(f)) for f in frames[:half]))
        first = json.loads(await asyncio.wait_for(producer.recv(), 20))
        redis_server.kill()
        await sending
        for frame in frames[half:]:
            await producer.send(json.dumps(frame))
        got = [first]
        got += [
            json.loads(await asyncio.wait_for(producer.recv(), 30)) for _ in range(MESSAGES - 1)
        ]
        ids = [reply["id"] for reply in got]
        assert ids == [f"k{n}" for n in range(MESSAGES)]  # one reply per final, in order
        refused = [r["id"] for r in got if r["type"] == "error"]
        assert {r["code"] for r in got if r["type"] == "error"} <= {"broker_unavailable"}
        assert refused, "Redis died mid-burst, yet every final was acked"
        redis_server.start()
        # A final refused while Redis was away is acked once it is back (the text was kept).
        for message_id in refused[:20]:
            for _ in range(100):
                await producer.send(json.dumps({"id": message_id, "final": True}))
                reply = json.loads(await asyncio.wait_for(producer.recv(), 30))
                if reply["type"] == "ack":
                    break
                assert reply["code"] == "broker_unavailable"
                await asyncio.sleep(0.1)
            assert reply == {"type": "ack", "id": message_id, "channel": "killed"}


async def _frames_in(relay: ServiceProcess) -> int:
    """The producer frames the relay has taken in (handled), from its /metrics."""
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
    body = (await reader.read()).decode()
    writer.close()
    line = next(
        x for x in body.splitlines() if x.startswith('relay_frames_in_total{role="producer"}')
    )
    return int(float(line.split()[-1]))


async def test_a_stalled_redis_holds_at_most_the_reply_limit_then_every_final_is_answered(
    redis_server: RedisServer,
) -> None:
    count = 3 * MAX_PENDING_REPLIES
    filler = "x" * 16_000  # enough bytes that a producer the relay stops reading backs up
    frames = [{"id": f"s{n}", "delta": filler, "final": True} for n in range(count)]
    async with (
        _relay("--broker", redis_server.url) as relay,
        connect(f"{relay.url}/produce?channel=stalled", max_queue=None) as producer,
    ):
        assert json.loads(await producer.recv())["type"] == "session"
        before = await _frames_in(relay)
        assert redis_server.process is not None
        redis_server.process.send_signal(signal.SIGSTOP)  # alive, but answers nothing
        try:
            sending = asyncio.ensure_future(
                asyncio.gather(*(producer.send(json.dumps(frame)) for frame in frames))
            )
            await asyncio.sleep(1.5)
            taken = await _frames_in(relay) - before
            # The replies waiting for Redis stop the reading: a queue's worth more at most.
            assert MAX_PENDING_REPLIES < taken <= MAX_PENDING_REPLIES + 64, taken
            assert not sending.done()
        finally:
            redis_server.process.send_signal(signal.SIGCONT)
        await asyncio.wait_for(sending, 30)
        got = [json.loads(await asyncio.wait_for(producer.recv(), 30)) for _ in range(count)]
    assert [reply["id"] for reply in got] == [f"s{n}" for n in range(count)]
    assert {r["type"] for r in got} <= {"ack", "error"}
    assert {r["code"] for r in got if r["type"] == "error"} <= {"broker_unavailable"}
    assert sum(r["type"] == "ack" for r in got) >= MAX_PENDING_REPLIES


async def test_a_final_written_to_a_redis_that_stops_answering_fails_by_its_deadline(
    redis_server: RedisServer,
) -> None:
    """The writer times each pipeline as a whole: a final whose write Redis never answers
    is refused (broker_unavailable) once the deadline passes, not left waiting. When Redis
    answers again, the retried final lands, once, with the whole text."""
    async with (
        _relay("--broker", redis_server.url) as relay,
        connect(f"{relay.url}/subscribe?channel=hung") as sub,
        connect(f"{relay.url}/produce?channel=hung") as producer,
    ):
        assert json.loads(await sub.recv())["type"] == "subscribed"
        assert json.loads(await producer.recv())["type"] == "session"
        await producer.send(json.dumps({"id": "h", "delta": "all of "}))
        await producer.send(json.dumps({"id": "h", "delta": "it"}))
        await asyncio.sleep(0.3)  # the deltas are in Redis
        assert redis_server.process is not None
        redis_server.process.send_signal(signal.SIGSTOP)  # alive, but answers nothing
        try:
            started = asyncio.get_running_loop().time()
            await producer.send(json.dumps({"id": "h", "final": True}))
            reply = json.loads(await asyncio.wait_for(producer.recv(), 15))
            waited = asyncio.get_running_loop().time() - started
        finally:
            redis_server.process.send_signal(signal.SIGCONT)
        assert (reply["type"], reply.get("code"), reply.get("id")) == (
            "error",
            "broker_unavailable",
            "h",
        )
        assert waited < 10, waited  # the deadline (5 s), not a wait without end
        for _ in range(100):
            if await relay.http_status("/readyz") == 200:
                break
            await asyncio.sleep(0.1)
        await producer.send(json.dumps({"id": "h", "final": True}))
        assert json.loads(await asyncio.wait_for(producer.recv(), 10)) == {
            "type": "ack",
            "id": "h",
            "channel": "hung",
        }
        texts = []
        while True:
            frame = json.loads(await asyncio.wait_for(sub.recv(), 10))
            if frame["type"] == "message":
                texts.append(frame["text"])
                break
    assert texts == ["all of it"]
