"""The protocol reference's example frames, played as printed against a real relay.

Each named block of ``docs/reference/protocol.md`` and ``docs/reference/errors.md`` that shows
frames is sent, or awaited, exactly as printed, over real sockets, in the scenario its prose
describes; what the relay really sends must be what the block shows. The only fields that
differ from run to run are a channel's ``epoch`` and a producer's ``session`` token: each is
first checked against its documented shape, then put in place of the printed one, and the
frames are compared whole, key order included.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from ..conftest import (
    NO_SWEEPS,
    RunningRelay,
    connect,
    recv_json,
    send_json,
    start_relay,
    subscribed_pair,
)
from ..docs.blocks import docs_block
from ..harness.sse import SseReader
from .test_docs_samples import _commands, _substitute

EPOCH = re.compile(r"[A-Za-z0-9_-]{12}")
"""An epoch as every block prints one: 12 characters of URL-safe base64."""
SESSION = re.compile(r"[A-Za-z0-9_-]{32,}")
"""A session token: unguessable, and sent back in a URL (``?session=TOKEN``)."""


def _lines(block: str) -> list[str]:
    """The block's lines that hold something, exactly as printed."""
    return [line for line in block.splitlines() if line.strip()]


def _printed(block: str) -> list[tuple[str, Any]]:
    """The block's JSON values, in order, each as its printed text and as its value (a value
    may span lines)."""
    text, decoder = block, json.JSONDecoder()
    found: list[tuple[str, Any]] = []
    index = 0
    while index < len(text):
        if text[index].isspace():
            index += 1
            continue
        value, end = decoder.raw_decode(text, index)
        found.append((text[index:end], value))
        index = end
    assert found, block
    return found


def _frames(block: str) -> list[Any]:
    """The block's JSON values, in order."""
    return [value for _, value in _printed(block)]


def _exactly(raw: str | bytes, printed: dict[str, Any]) -> dict[str, Any]:
    """Assert that the frame the relay sent is the printed one, key order included."""
    got: dict[str, Any] = json.loads(raw)
    assert list(got.items()) == list(printed.items()), f"sent {got}\nprinted {printed}"
    return got


def _epoch_of(frames: list[Any]) -> str:
    """The one epoch the printed frames show."""
    epochs = {frame["epoch"] for frame in frames if isinstance(frame, dict) and "epoch" in frame}
    (epoch,) = epochs
    assert EPOCH.fullmatch(epoch), epoch
    return str(epoch)


def _with_epoch(frame: dict[str, Any], epoch: str) -> dict[str, Any]:
    """``frame`` with the real ``epoch`` in place of the printed one."""
    return {key: (epoch if key == "epoch" else value) for key, value in frame.items()}


async def _real_epoch(ws: ClientConnection) -> tuple[dict[str, Any], str]:
    """The next frame and its epoch, checked for the documented shape."""
    frame = await recv_json(ws)
    assert EPOCH.fullmatch(frame.get("epoch", "")), frame
    return frame, frame["epoch"]


async def _fill(running: RunningRelay, count: int, name: str = "old") -> None:
    """Complete ``count`` more messages on chat-42 (one batch of one-shot finals)."""
    async with running.connect("/produce?channel=chat-42") as producer:
        await send_json(producer, [{"id": f"{name}-{n}", "final": True} for n in range(count)])
        acks = await recv_json(producer)
        assert len(acks["acks"]) == count, acks


@asynccontextmanager
async def _relay(**settings: Any) -> AsyncIterator[RunningRelay]:
    running, relay = await start_relay(**NO_SWEEPS, **settings)
    async with relay:
        yield running


@pytest.mark.parametrize("path", ["/produce", "/produce?channel=chat-42"])
async def test_producer_events_make_the_message_they_show(path: str) -> None:
    # The block sits under `ws://HOST:PORT/produce[?channel=C]`, its first event naming its
    # channel: played on both forms of the URL, as printed, line by line.
    first, second = _lines(docs_block("producer-events"))
    async with (
        _relay() as running,
        running.connect("/subscribe?channel=chat-42&deltas=1") as sub,
        running.connect(path) as producer,
    ):
        _, epoch = await _real_epoch(sub)
        await producer.send(first)
        await producer.send(second)
        assert await recv_json(producer) == {"type": "ack", "id": "reply-1", "channel": "chat-42"}
        assert [await recv_json(sub) for _ in range(3)] == [
            {"type": "delta", "channel": "chat-42", "id": "reply-1", "delta": "Hel"},
            {"type": "delta", "channel": "chat-42", "id": "reply-1", "delta": "lo"},
            {"type": "message", "channel": "chat-42", "id": "reply-1", "text": "Hello",
             "offset": 1, "epoch": epoch},
        ]  # fmt: skip


async def test_a_producer_batch_is_acknowledged_as_printed() -> None:
    batch, acks = _lines(docs_block("producer-batch"))
    (printed_ack,) = _frames(docs_block("producer-batch"))[1:]
    assert json.loads(acks) == printed_ack
    async with (
        _relay() as running,
        running.connect("/subscribe?channel=chat-42&deltas=1") as sub,
        # The batch's events name no channel: the URL names the one its ack shows.
        running.connect("/produce?channel=chat-42") as producer,
    ):
        await recv_json(sub)
        await producer.send(batch)
        _exactly(await producer.recv(), printed_ack)
        got = [await recv_json(sub) for _ in range(4)]
        assert [(f["type"], f["id"], f.get("delta", f.get("text"))) for f in got] == [
            ("delta", "a", "Hel"),
            ("delta", "b", "Wor"),
            ("delta", "a", "lo"),
            ("message", "a", "Hello"),
        ]


async def test_a_producer_first_receives_its_session_as_printed() -> None:
    (printed,) = _frames(docs_block("producer-session"))
    assert printed["session"].endswith("…")  # the block abbreviates the token
    async with _relay() as running, connect(running.url + "/produce") as producer:
        session = json.loads(await asyncio.wait_for(producer.recv(), 5))
        token = session["session"]
        assert SESSION.fullmatch(token), token
        _exactly(json.dumps(session), {**printed, "session": token})
        # The token is the session's: the same URL with ?session= takes it over, resumed.
        async with connect(f"{running.url}/produce?session={token}") as again:
            resumed = json.loads(await asyncio.wait_for(again.recv(), 5))
            _exactly(json.dumps(resumed), {**printed, "session": token, "resumed": True})
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(producer.recv(), 5)
            assert producer.close_code == 1008


async def test_a_repeated_final_is_acked_as_printed() -> None:
    first, second = _frames(docs_block("producer-acks"))
    assert "duplicate" not in first and second == {**first, "duplicate": True}
    async with (
        _relay() as running,
        running.connect("/subscribe?channel=chat-42") as sub,
        running.connect("/produce?channel=chat-42") as producer,
    ):
        await recv_json(sub)
        # `duplicate` marks a final whose seq had already been applied (the Ack model): the
        # reply of producer-events, numbered, then its final sent again.
        await send_json(producer, {"id": "reply-1", "delta": "Hel", "seq": 1})
        final = {"id": "reply-1", "delta": "lo", "final": True, "seq": 2}
        await send_json(producer, final)
        _exactly(await producer.recv(), first)
        await send_json(producer, final)
        _exactly(await producer.recv(), second)
        message = await recv_json(sub)
        assert (message["type"], message["text"]) == ("message", "Hello")
        # Sent once: the next frame the subscriber gets is another message's.
        await send_json(producer, {"id": "next", "final": True})
        await recv_json(producer)
        assert (await recv_json(sub))["id"] == "next"


async def test_a_repeated_final_without_seq_is_acked_with_no_duplicate_mark() -> None:
    # What the prose before producer-acks leaves out: without seq, a repeated final is acked
    # exactly like the first one (no "duplicate"), and still broadcast once.
    first, _ = _frames(docs_block("producer-acks"))
    events = _lines(docs_block("producer-events"))
    async with (
        _relay() as running,
        running.connect("/subscribe?channel=chat-42") as sub,
        running.connect("/produce?channel=chat-42") as producer,
    ):
        await recv_json(sub)
        for line in events:
            await producer.send(line)
        _exactly(await producer.recv(), first)
        await producer.send(events[1])
        _exactly(await producer.recv(), first)
        await send_json(producer, {"id": "next", "final": True})
        await recv_json(producer)
        assert [(await recv_json(sub))["id"] for _ in range(2)] == ["reply-1", "next"]


async def test_stop_reaches_the_owning_producer_as_printed() -> None:
    (printed,) = _frames(docs_block("producer-cancel"))
    async with (
        _relay() as running,
        subscribed_pair(running, channel="chat-42", deltas=True, producer="/produce") as (
            sub,
            producer,
        ),
    ):
        # The reply of producer-events, in progress (its first event, as printed).
        await producer.send(_lines(docs_block("producer-events"))[0])
        assert (await recv_json(sub))["delta"] == "Hel"
        # The subscriber presses Stop on it.
        await send_json(sub, {"type": "cancel", "channel": "chat-42", "id": "reply-1"})
        _exactly(await producer.recv(), printed)
        # The gateway ends it as cancelled (producer-abort, as printed): the subscriber gets
        # its aborted frame, reason cancelled, with the text so far, and nothing before it.
        await producer.send(_lines(docs_block("producer-abort"))[0])
        aborted = await recv_json(sub)
        assert (aborted["type"], aborted["id"], aborted["text"], aborted["reason"]) == (
            "aborted",
            "reply-1",
            "Hel",
            "cancelled",
        )
        assert aborted["meta"] == {"finishReason": "other"}


async def test_the_subscriber_frames_are_answered_as_documented() -> None:
    sent = [text for text, _ in _printed(docs_block("subscriber-frames"))]
    subscribe, resume, unsubscribe, cancel = _frames(docs_block("subscriber-frames"))
    printed_epoch = resume["since"]["epoch"]
    assert EPOCH.fullmatch(printed_epoch)
    (held,) = resume["positions"].values()
    async with _relay() as running:
        await _fill(running, resume["since"]["offset"])
        async with (
            running.connect("/subscribe?channel=chat-42&deltas=1") as watcher,
            running.connect("/produce?channel=chat-42") as producer,
            running.connect("/subscribe") as sub,
        ):
            _, epoch = await _real_epoch(watcher)
            assert epoch != printed_epoch
            # reply-9 in progress, longer than the position the block says is held.
            await send_json(producer, {"id": "reply-9", "delta": "x" * held + "Hello"})
            assert (await recv_json(watcher))["type"] == "delta"
            offset = resume["since"]["offset"]
            here = {"type": "subscribed", "channel": "chat-42", "offset": offset, "epoch": epoch}
            # The four frames, sent as printed, in order.
            await sub.send(sent[0])
            _exactly(await sub.recv(), here)
            # The printed since names another epoch than this relay's: not recovered, the
            # current position, no replay; then the snapshot of reply-9 past what is held.
            await sub.send(sent[1])
            _exactly(await sub.recv(), {**here, "recovered": False})
            _exactly(
                await sub.recv(),
                {"type": "snapshot", "channel": "chat-42", "id": "reply-9", "text": "Hello",
                 "from": held},
            )  # fmt: skip
            await sub.send(sent[2])
            _exactly(await sub.recv(), {"type": "unsubscribed", "channel": "chat-42"})
            # Played in the printed order, the cancel comes after the unsubscribe: refused.
            await sub.send(sent[3])
            refused = await recv_json(sub)
            assert (refused["type"], refused["code"], refused["channel"], refused["id"]) == (
                "error",
                "not_subscribed",
                "chat-42",
                "reply-9",
            )
            # Subscribed, the same cancel reaches the producer and gets nothing back: the
            # next frame the subscriber gets answers its next frame.
            await sub.send(sent[0])
            _exactly(await sub.recv(), here)
            await sub.send(sent[3])
            assert await recv_json(producer) == {
                "type": "cancel",
                "channel": "chat-42",
                "id": "reply-9",
            }
            await sub.send(sent[2])
            _exactly(await sub.recv(), {"type": "unsubscribed", "channel": "chat-42"})
    assert (subscribe["type"], unsubscribe["type"], cancel["id"]) == (
        "subscribe",
        "unsubscribe",
        "reply-9",
    )


async def test_subscriptions_are_confirmed_as_printed() -> None:
    printed = _frames(docs_block("subscriber-confirmations"))
    fresh, recovered, unsubscribed = printed
    printed_epoch = _epoch_of(printed)
    subscribe, _, unsubscribe, _ = _frames(docs_block("subscriber-frames"))
    async with _relay() as running:
        await _fill(running, fresh["offset"])
        async with running.connect("/subscribe") as first:
            await send_json(first, subscribe)
            got, epoch = await _real_epoch(first)
            _exactly(json.dumps(got), _with_epoch(fresh, epoch))
        # The connection is gone; `replayed` more messages complete meanwhile.
        await _fill(running, recovered["replayed"], "new")
        async with running.connect("/subscribe") as again:
            since = {"offset": fresh["offset"], "epoch": epoch}
            await send_json(again, {**subscribe, "since": since})
            _exactly(await again.recv(), _with_epoch(recovered, epoch))
            offsets = [(await recv_json(again))["offset"] for _ in range(recovered["replayed"])]
            assert offsets == list(range(fresh["offset"] + 1, recovered["offset"] + 1))
            await send_json(again, unsubscribe)
            _exactly(await again.recv(), unsubscribed)
    assert printed_epoch == recovered["epoch"]


async def test_a_subscriber_receives_the_printed_frames() -> None:
    printed = _frames(docs_block("subscriber-receives"))
    whole, rest, delta, message, aborted = printed
    _epoch_of(printed)
    assert whole["text"][rest["from"] :] == rest["text"]
    so_far = whole["text"]
    assert message["text"] == so_far + delta["delta"] and aborted["text"] == so_far
    after = message["offset"] - 1
    async with _relay() as running:
        await _fill(running, after)
        async with (
            running.connect("/subscribe?channel=chat-42&deltas=1") as watcher,
            running.connect("/produce?channel=chat-42") as producer,
            running.connect("/subscribe") as joins,
            running.connect("/subscribe") as holds,
        ):
            _, epoch = await _real_epoch(watcher)
            await send_json(producer, {"id": "reply-9", "delta": so_far})
            assert (await recv_json(watcher))["delta"] == so_far
            # A deltas subscriber joining gets the text so far; one that holds the first
            # `from` characters gets the rest.
            await send_json(joins, {"type": "subscribe", "channel": "chat-42", "deltas": True})
            await recv_json(joins)
            _exactly(await joins.recv(), whole)
            await send_json(
                holds,
                {"type": "subscribe", "channel": "chat-42", "deltas": True,
                 "positions": {"reply-9": rest["from"]}},
            )  # fmt: skip
            await recv_json(holds)
            _exactly(await holds.recv(), rest)
            await send_json(producer, {"id": "reply-9", "delta": delta["delta"], "final": True})
            for sub in (joins, holds):
                _exactly(await sub.recv(), delta)
                _exactly(await sub.recv(), _with_epoch(message, epoch))
    # The other ending: the producer goes away with the reply unfinished.
    async with _relay() as running:
        await _fill(running, after)
        async with running.connect("/subscribe?channel=chat-42&deltas=1") as sub:
            _, epoch = await _real_epoch(sub)
            async with running.connect("/produce?channel=chat-42") as producer:
                await send_json(producer, {"id": "reply-9", "delta": so_far})
                assert (await recv_json(sub))["delta"] == so_far
            _exactly(await sub.recv(), _with_epoch(aborted, epoch))


async def test_a_malformed_event_gets_the_printed_error_and_nothing_else() -> None:
    (printed,) = _frames(docs_block("error-frame"))
    async with (
        _relay() as running,
        subscribed_pair(running, channel="chat-42", deltas=True) as (sub, producer),
    ):
        # The event the error names: reply-1, with a delta that is not a string.
        await send_json(producer, {"id": printed["id"], "delta": 5})
        _exactly(await producer.recv(), printed)
        # Nothing else happened: the connection serves its next frame, and reply-1 was not
        # opened by the refused event (its text is only what came after).
        await send_json(producer, {"id": "reply-1", "delta": "ok", "final": True})
        assert await recv_json(producer) == {"type": "ack", "id": "reply-1", "channel": "chat-42"}
        assert (await recv_json(sub))["delta"] == "ok"
        message = await recv_json(sub)
        assert (message["type"], message["text"], message["offset"]) == ("message", "ok", 1)


def _port(running: RunningRelay) -> int:
    return int(running.url.rsplit(":", 1)[1])


async def _curl(command: str, running: RunningRelay) -> asyncio.subprocess.Process:
    """A block's curl command, run against ``running`` (its port in place of the block's)."""
    return await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        "exec " + _substitute(command, {8765: _port(running)}),
        stdout=asyncio.subprocess.PIPE,
    )


async def test_the_ai_sdk_stream_is_printed_whole() -> None:
    printed = docs_block("ai-sdk-output")
    (command,) = _commands(docs_block("ai-sdk-curl"))
    async with (
        _relay() as running,
        subscribed_pair(running, channel="chat-42", deltas=True) as (watcher, producer),
    ):
        # reply-1 in progress with "Hello, wo" when the stream is asked for, then "rld".
        await send_json(producer, {"id": "reply-1", "delta": "Hello, wo"})
        assert (await recv_json(watcher))["delta"] == "Hello, wo"
        curl = await _curl(command, running)
        assert curl.stdout is not None
        head = await asyncio.wait_for(curl.stdout.readuntil(b'"delta":"Hello, wo"}\n\n'), 10)
        await send_json(producer, {"id": "reply-1", "delta": "rld", "final": True})
        rest, _ = await asyncio.wait_for(curl.communicate(), 10)
    assert curl.returncode == 0
    # Every event ends with a blank line; the block's last one ends at the closing fence.
    assert (head + rest).decode() == printed + "\n"


def _with_epoch_in_ids(text: str, printed: str, real: str) -> str:
    """The SSE text with the real epoch in its data and in its ids' positions."""

    def reencoded(match: re.Match[str]) -> str:
        token = match.group(1)
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        swapped = raw.replace(printed, real).encode()
        return "id: " + base64.urlsafe_b64encode(swapped).rstrip(b"=").decode()

    text = re.sub(r"^id: (\S+)$", reencoded, text, flags=re.M)
    return text.replace(f'"epoch":"{printed}"', f'"epoch":"{real}"')


async def test_the_sse_stream_is_printed_whole_ids_included() -> None:
    printed = docs_block("sse-output")
    (command,) = _commands(docs_block("sse-curl"))
    (printed_epoch,) = set(re.findall(r'"epoch":"([^"]+)"', printed))
    assert EPOCH.fullmatch(printed_epoch)
    async with _relay() as running:
        curl = await _curl(command, running)
        assert curl.stdout is not None
        try:
            seen = await asyncio.wait_for(curl.stdout.readuntil(b"event: subscribed\n"), 10)
            seen += await asyncio.wait_for(curl.stdout.readuntil(b"\n\n"), 10)
            async with running.connect("/produce?channel=chat-42") as producer:
                await send_json(producer, {"id": "m", "delta": "Hel"})
                await send_json(producer, {"id": "m", "delta": "lo", "final": True})
                await recv_json(producer)
            seen += await asyncio.wait_for(curl.stdout.readuntil(b"event: message\n"), 10)
            seen += await asyncio.wait_for(curl.stdout.readuntil(b"\n\n"), 10)
        finally:
            curl.terminate()
            await curl.communicate()
        got = seen.decode()
        (epoch,) = set(re.findall(r'"epoch":"([^"]+)"', got))
        assert EPOCH.fullmatch(epoch), epoch
        # The whole text: `retry:` included, and each id the very token the block shows for
        # that position (base64url of {"chat-42": [offset, epoch]}), with this run's epoch.
        # Every event ends with a blank line; the block's last one ends at the closing fence.
        assert got == _with_epoch_in_ids(printed, printed_epoch, epoch) + "\n"
        # The ids are resume tokens: sent back as Last-Event-ID, the subscribed event's id
        # replays the message, and the message's id resumes after it, with nothing replayed.
        subscribed_id, message_id = re.findall(r"^id: (\S+)$", got, flags=re.M)
        replay = await _resumed(running, subscribed_id)
        assert [(e["type"], e.get("recovered"), e.get("replayed")) for e in replay] == [
            ("subscribed", True, 1),
            ("message", None, None),
        ]
        assert replay[1]["text"] == "Hello"
        again = await _resumed(running, message_id)
        assert [(e["type"], e.get("recovered"), e.get("replayed")) for e in again] == [
            ("subscribed", True, None)
        ]


async def _resumed(running: RunningRelay, last_event_id: str) -> list[dict[str, Any]]:
    """The first events of an SSE stream of chat-42 resumed at ``last_event_id``: its
    ``subscribed`` event and the messages it says it replays."""
    got: list[dict[str, Any]] = []
    async with SseReader(
        _port(running), "/sse?channel=chat-42", [("Last-Event-ID", last_event_id)]
    ) as stream:
        assert stream.status == 200
        first = (await stream.next()).json()
        got.append(first)
        for _ in range(first.get("replayed", 0)):
            got.append((await stream.next()).json())
    return got
