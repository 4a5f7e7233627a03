"""Channels read as Durable Streams (``/v1/stream/__channel/{channel}``) on a real relay, over
real sockets: with the official ``@durable-streams/client`` in Node, with plain HTTP, across
the relay's other protocols (``since``, SSE ``Last-Event-ID``), and with Redis."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
from token_relay.core.grants import Role
from token_relay.core.resume import decode_positions, encode_positions
from token_relay.tokens import mint

from ..conftest import RunningRelay, connect, recv_json, send_json, start_relay
from ..docs.blocks import docs_block
from ..harness import RedisServer
from ..harness.sse import SseReader

CHANNEL_PATH = "/v1/stream/__channel/"
SECRET = "s" * 32


def _http(running: RunningRelay) -> str:
    return running.url.replace("ws://", "http://")


def _port(running: RunningRelay) -> int:
    return int(running.url.rsplit(":", 1)[1])


async def _produce(producer: Any, message_id: str, pieces: list[str], abort: bool = False) -> None:
    """One reply, piece by piece, then completed (or aborted by its producer)."""
    for piece in pieces[:-1]:
        await send_json(producer, {"id": message_id, "delta": piece})
    last: dict[str, Any] = {"id": message_id, "delta": pieces[-1], "final": True}
    if abort:
        await send_json(producer, {"id": message_id, "delta": pieces[-1]})
        # No ack for an abort: the producer's next reply, acked, comes after it.
        await send_json(producer, {"id": message_id, "abort": "cancelled"})
        return
    await send_json(producer, last)
    assert (await recv_json(producer))["type"] == "ack"


async def _node(folder: Path, *args: str) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        "node",
        "read_channel.mjs",
        *args,
        cwd=folder,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out)
    return result


async def _subscriber_frames(sub: Any, count: int) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while len(frames) < count:
        frame = await recv_json(sub)
        if frame["type"] in ("message", "aborted"):
            frames.append(frame)
    return frames


def _offset(frame: dict[str, Any]) -> str:
    """The stream offset after ``frame``: its epoch, ``_``, its offset in 16 digits."""
    return f"{frame['epoch']}_{frame['offset']:016d}"


async def test_a_channel_reads_as_its_completed_frames_in_order_with_mapped_offsets(
    relay: RunningRelay,
) -> None:
    async with (
        connect(relay.url + "/subscribe?channel=chat") as sub,
        relay.connect("/produce?channel=chat") as producer,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        await _produce(producer, "m1", ["Hel", "lo"])
        await _produce(producer, "m2", ["going"], abort=True)
        await _produce(producer, "m3", ["wörld 👋"])
        frames = await _subscriber_frames(sub, 3)
    assert [f["type"] for f in frames] == ["message", "aborted", "message"]
    base = _http(relay) + CHANNEL_PATH + "chat"
    async with httpx.AsyncClient() as client:
        whole = await client.get(base, params={"offset": "-1"})
        assert whole.status_code == 200
        assert whole.headers["content-type"] == "application/json"
        assert whole.json() == frames
        assert whole.headers["stream-next-offset"] == _offset(frames[2])
        assert whole.headers["stream-up-to-date"] == "true"
        after_first = await client.get(base, params={"offset": _offset(frames[0])})
        assert after_first.json() == frames[1:]
        at_tail = await client.get(base, params={"offset": "now"})
        assert at_tail.json() == []
        assert at_tail.headers["stream-next-offset"] == _offset(frames[2])
        head = await client.head(base)
        assert head.status_code == 200
        assert head.headers["stream-next-offset"] == _offset(frames[2])
        same = await client.get(
            base,
            params={"offset": _offset(frames[0])},
            headers={"If-None-Match": after_first.headers["etag"]},
        )
        assert same.status_code == 304


async def test_writes_are_refused_and_bad_offsets_say_why(relay: RunningRelay) -> None:
    base = _http(relay) + CHANNEL_PATH
    async with httpx.AsyncClient() as client:
        for method in ("PUT", "POST", "DELETE"):
            refused = await client.request(method, base + "chat", content=b"[1]")
            assert refused.status_code == 405, method
            assert refused.json()["code"] == "read_only"
            assert refused.headers["allow"] == "GET, HEAD"
        empty = await client.get(base, params={"offset": "-1"})
        assert (empty.status_code, empty.json()["code"]) == (400, "bad_path")
        bad = await client.get(base + "chat", params={"offset": "0000000000000000_0"})
        assert (bad.status_code, bad.json()["code"]) == (400, "bad_offset")
        tail = (await client.get(base + "chat", params={"offset": "now"})).headers[
            "stream-next-offset"
        ]
        epoch = tail.rpartition("_")[0]
        future = await client.get(base + "chat", params={"offset": f"{epoch}_{5:016d}"})
        assert (future.status_code, future.json()["code"]) == (400, "bad_offset")
        other = await client.get(base + "chat", params={"offset": f"x{epoch}_{0:016d}"})
        assert (other.status_code, other.json()["code"]) == (410, "offset_gone")


async def test_a_read_from_before_the_history_is_gone_and_minus_one_starts_at_what_is_held() -> (
    None
):
    running, server = await start_relay(history_size=2)
    async with server, running.connect("/produce?channel=c") as producer:
        for n in range(4):
            await _produce(producer, f"m{n}", [f"text {n}"])
        base = _http(running) + CHANNEL_PATH + "c"
        async with httpx.AsyncClient() as client:
            held = await client.get(base, params={"offset": "-1"})
            assert [f["id"] for f in held.json()] == ["m2", "m3"]
            epoch = held.json()[0]["epoch"]
            gone = await client.get(base, params={"offset": f"{epoch}_{1:016d}"})
            assert (gone.status_code, gone.json()["code"]) == (410, "offset_gone")
            still = await client.get(base, params={"offset": f"{epoch}_{2:016d}"})
            assert [f["id"] for f in still.json()] == ["m2", "m3"]


async def test_the_official_client_reads_a_channel_live_exactly_once_in_order(
    relay: RunningRelay, ds_clients: Path
) -> None:
    url = _http(relay) + CHANNEL_PATH + "live"
    for live in ("sse", "long-poll"):
        async with (
            connect(relay.url + "/subscribe?channel=live") as sub,
            relay.connect("/produce?channel=live") as producer,
        ):
            assert (await recv_json(sub))["type"] == "subscribed"
            start = (await httpx.AsyncClient().get(url, params={"offset": "now"})).headers[
                "stream-next-offset"
            ]
            reader = asyncio.ensure_future(_node(ds_clients, url, start, live, "6"))
            for n in range(6):
                await _produce(producer, f"{live}-{n}", ["a", "b", "c"], abort=n == 3)
            frames = await _subscriber_frames(sub, 6)
            result = await reader
        assert result["items"] == frames, live
        assert result["offset"] == _offset(frames[-1])


async def test_a_reader_switching_protocols_loses_and_duplicates_nothing(
    relay: RunningRelay, ds_clients: Path
) -> None:
    url = _http(relay) + CHANNEL_PATH + "switch"
    read: list[dict[str, Any]] = []
    async with relay.connect("/produce?channel=switch") as producer:
        # 1. The Durable Streams client reads what there is, from the start.
        for n in range(3):
            await _produce(producer, f"m{n}", [f"reply {n}"], abort=n == 1)
        first = await _node(ds_clients, url, "-1", "false", "3")
        read += first["items"]
        # 2. A WebSocket subscriber resumes with `since` mapped from the stream's offset.
        for n in range(3, 6):
            await _produce(producer, f"m{n}", [f"reply {n}"])
        epoch, _, digits = first["offset"].rpartition("_")
        since = {"offset": int(digits), "epoch": epoch}
        async with connect(relay.url + "/subscribe") as sub:
            await send_json(sub, {"type": "subscribe", "channel": "switch", "since": since})
            confirmation = await recv_json(sub)
            assert (confirmation["recovered"], confirmation["replayed"]) == (True, 3)
            read += await _subscriber_frames(sub, 3)
        # 3. An SSE subscriber resumes by Last-Event-ID from the last frame it got.
        for n in range(6, 9):
            await _produce(producer, f"m{n}", [f"reply {n}"])
        last = read[-1]
        token = encode_positions({"switch": (last["offset"], last["epoch"])})
        last_id = ""
        async with SseReader(
            _port(relay), "/sse?channel=switch", headers=[("Last-Event-ID", token)]
        ) as sse:
            while len(read) < 9:
                event = await sse.next()
                if event.event in ("message", "aborted"):
                    read.append(event.json())
                    last_id = event.id or ""
        # 4. Back to the Durable Streams client, live, from the offset the SSE's last id holds.
        offset, epoch = decode_positions(last_id)["switch"]
        rest = asyncio.ensure_future(_node(ds_clients, url, f"{epoch}_{offset:016d}", "sse", "3"))
        for n in range(9, 12):
            await _produce(producer, f"m{n}", [f"reply {n}"])
        read += (await rest)["items"]
    assert [f["id"] for f in read] == [f"m{n}" for n in range(12)]
    assert [f["offset"] for f in read] == list(range(1, 13))
    whole = await _node(ds_clients, url, "-1", "false", "12")
    assert read == whole["items"]


async def test_with_a_secret_a_channel_stream_is_granted_as_its_channel() -> None:
    running, server = await start_relay(secret=SECRET)
    async with server, httpx.AsyncClient() as client:
        base = _http(running) + CHANNEL_PATH
        reader = mint(SECRET, Role.SUBSCRIBE, channels=["chat"], ttl=60)
        writer = mint(SECRET, Role.PRODUCE, channels=["chat"], ttl=60)
        bearer = {"Authorization": f"Bearer {reader}"}
        assert (await client.get(base + "chat")).status_code == 401
        assert (await client.get(base + "chat", headers=bearer)).status_code == 200
        other = await client.get(base + "other", headers=bearer)
        assert (other.status_code, other.json()["code"]) == (403, "forbidden")
        sse = await client.get(
            base + "other", params={"offset": "-1", "live": "sse"}, headers=bearer
        )
        assert sse.status_code == 403
        # The stream's own name (with the prefix) is not what the token must grant.
        named = mint(SECRET, Role.SUBSCRIBE, channels=["__channel/chat"], ttl=60)
        refused = await client.get(base + "chat", headers={"Authorization": f"Bearer {named}"})
        assert refused.status_code == 403
        write = await client.post(
            base + "chat", content=b"[1]", headers={"Authorization": f"Bearer {writer}"}
        )
        assert (write.status_code, write.json()["code"]) == (405, "read_only")


async def test_with_redis_a_long_poll_on_one_relay_is_woken_by_a_reply_on_another(
    redis_server: RedisServer,
) -> None:
    one, first = await start_relay(broker=redis_server.url)
    two, second = await start_relay(broker=redis_server.url)
    async with first, second, httpx.AsyncClient(timeout=30) as client:
        url = _http(two) + CHANNEL_PATH + "shared"
        async with one.connect("/produce?channel=shared") as producer:
            await _produce(producer, "before", ["held"])
            held = await client.get(url, params={"offset": "-1"})
            assert [f["id"] for f in held.json()] == ["before"]
            poll = asyncio.ensure_future(
                client.get(
                    url,
                    params={
                        "offset": held.headers["stream-next-offset"],
                        "live": "long-poll",
                    },
                )
            )
            # The poll listens to the channel on relay two before the reply is sent.
            while not two.relay.channels.listening("shared"):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            await _produce(producer, "after", ["live"])
            answer = await poll
        assert answer.status_code == 200
        assert [f["id"] for f in answer.json()] == ["after"]
        assert answer.headers["stream-next-offset"] == _offset(answer.json()[0])


async def test_an_ai_sdk_chat_carried_by_the_durable_streams_transport(
    relay: RunningRelay, ds_clients: Path
) -> None:
    """``@durable-streams/aisdk-transport`` with ``ai`` 7: the app's route appends the reply's
    UI message chunks to a stream on the relay; the chat reads them, and reads them again
    from the start when it resumes mid-reply, with no part twice."""
    process = await asyncio.create_subprocess_exec(
        "node",
        "aisdk_chat.mjs",
        _http(relay),
        cwd=ds_clients,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    chat = json.loads(out)
    assert chat["sent"] == {
        "id": "reply-1",
        "role": "assistant",
        "parts": [{"type": "text", "text": "Hello, ", "state": "streaming"}],
    }
    assert chat["resumed"] == {
        "id": "reply-1",
        "role": "assistant",
        "parts": [{"type": "text", "text": "Hello, durable world!", "state": "done"}],
    }
    assert chat["idle"] is None
    # What the relay holds: the reply's chunks, one item each, and the stream closed.
    async with httpx.AsyncClient() as client:
        stored = await client.get(
            _http(relay) + "/v1/stream/chats/chat-1/1", params={"offset": "-1"}
        )
    assert stored.headers["stream-closed"] == "true"
    assert [chunk["type"] for chunk in stored.json()] == [
        "start",
        "text-start",
        *["text-delta"] * 5,
        "text-end",
        "finish",
    ]


async def test_the_documented_recipes_print_what_the_page_shows(
    relay: RunningRelay, ds_clients: Path
) -> None:
    port = str(_port(relay))
    script = re.sub(r"\b8765\b", port, docs_block("durable-channel-curl"))
    process = await asyncio.create_subprocess_exec(
        "bash", "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err
    epoch = json.loads(out.decode().splitlines()[0])[0]["epoch"]
    assert out.decode() == docs_block("durable-channel-curl-output").replace("k3J9xQ2vLm0A", epoch)
    # The client's recipe, as printed: it prints the frame history holds, then the next.
    (ds_clients / "recipe.mjs").write_text(
        re.sub(r"\b8765\b", port, docs_block("durable-channel-client"))
    )
    reader = await asyncio.create_subprocess_exec(
        "node", "recipe.mjs", cwd=ds_clients, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert reader.stdout is not None
        first = await asyncio.wait_for(reader.stdout.readline(), 30)
        assert first.decode() == f"message reply-1 Hello {epoch}_{1:016d}\n"
        async with relay.connect("/produce?channel=chat-42") as producer:
            await _produce(producer, "reply-2", ["Hel", "lo ", "again"])
        second = await asyncio.wait_for(reader.stdout.readline(), 30)
        assert second.decode() == f"message reply-2 Hello again {epoch}_{2:016d}\n"
    finally:
        reader.kill()
        await reader.wait()


async def test_a_reply_with_parts_reads_with_its_parts_as_subscribers_get_it(
    relay: RunningRelay,
) -> None:
    chunks = [
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "r1"},
        {"type": "reasoning-delta", "id": "r1", "delta": "Thinking."},
        {"type": "reasoning-end", "id": "r1"},
        {"type": "text-start", "id": "t1"},
        {"type": "text-delta", "id": "t1", "delta": "It is 21 °C."},
        {"type": "text-end", "id": "t1"},
    ]
    async with (
        connect(relay.url + "/subscribe?channel=parts") as sub,
        relay.connect("/produce?channel=parts") as producer,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        for chunk in chunks:
            await send_json(producer, {"id": "reply-7", "chunk": chunk})
        await send_json(producer, {"id": "reply-7", "final": True})
        assert (await recv_json(producer))["type"] == "ack"
        [frame] = await _subscriber_frames(sub, 1)
    assert [part["type"] for part in frame["parts"]] == ["step-start", "reasoning", "text"]
    async with httpx.AsyncClient() as client:
        read = await client.get(_http(relay) + CHANNEL_PATH + "parts", params={"offset": "-1"})
    assert read.json() == [frame]


async def test_a_shutdown_answers_a_waiting_channel_long_poll_at_once() -> None:
    running, server = await start_relay(long_poll_timeout=300)
    url = _http(running) + CHANNEL_PATH + "c"
    async with httpx.AsyncClient(timeout=60) as client:
        tail = (await client.head(url)).headers["stream-next-offset"]
        poll = asyncio.ensure_future(client.get(url, params={"offset": tail, "live": "long-poll"}))
        while not running.relay.channels.listening("c"):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        await server.stop()
        answer = await poll
    assert answer.status_code == 204
    assert answer.headers["stream-next-offset"] == tail
    assert answer.headers["stream-up-to-date"] == "true"


async def test_a_read_of_more_than_a_mebibyte_comes_in_parts_each_exact(
    relay: RunningRelay,
) -> None:
    replies = [letter * 450_000 for letter in "abc"]  # two fit in 1 MiB of body, not three
    async with (
        connect(relay.url + "/subscribe?channel=big", max_size=None) as sub,
        relay.connect("/produce?channel=big") as producer,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        for index, text in enumerate(replies):
            await _produce(producer, f"m{index}", [text])
        frames = await _subscriber_frames(sub, 3)
    base = _http(relay) + CHANNEL_PATH + "big"
    async with httpx.AsyncClient() as client:
        first = await client.get(base, params={"offset": "-1"})
        assert first.json() == frames[:2]
        assert first.headers["stream-next-offset"] == _offset(frames[1])
        assert "stream-up-to-date" not in first.headers
        rest = await client.get(base, params={"offset": first.headers["stream-next-offset"]})
        assert rest.json() == frames[2:]
        assert rest.headers["stream-up-to-date"] == "true"
        # A live SSE read sends the same frames, in the same parts, then follows on.
        read: list[dict[str, Any]] = []
        controls: list[dict[str, Any]] = []
        async with client.stream("GET", base, params={"offset": "-1", "live": "sse"}) as sse:
            event = ""
            async for line in sse.aiter_lines():
                if line.startswith("event:"):
                    event = line.removeprefix("event:").strip()
                elif line.startswith("data:") and event == "data":
                    read.extend(json.loads(line.removeprefix("data:")))
                elif line.startswith("data:") and event == "control":
                    controls.append(json.loads(line.removeprefix("data:")))
                    if controls[-1]["upToDate"]:
                        break
    assert read == frames
    assert [c["upToDate"] for c in controls] == [False, True]
