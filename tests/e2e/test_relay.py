"""End to end: the real relay on a free port, driven by real websockets clients."""

from __future__ import annotations

import asyncio
import random

import pytest
from token_relay.edge.frames import MAX_FRAGMENTS
from websockets.exceptions import ConnectionClosedError, InvalidStatus

from ..conftest import (
    RunningRelay,
    assert_silent,
    recv_core,
    recv_json,
    send_json,
    start_relay,
    subscribed_pair,
)
from .conftest import OpenRelay


async def test_interleaved_messages_reach_many_subscribers(relay: RunningRelay) -> None:
    texts = {f"m{i}": f"reply number {i}: " + "word " * (i + 3) for i in range(5)}
    subscribers = [await relay.connect("/subscribe?channel=chat").__aenter__() for _ in range(20)]
    try:
        for ws in subscribers:
            assert await recv_core(ws) == {"type": "subscribed", "channel": "chat"}
        async with relay.connect("/produce?channel=chat") as producer:
            streams = {
                mid: [text[i : i + 3] for i in range(0, len(text), 3)]
                for mid, text in texts.items()
            }
            rng = random.Random(7)
            while streams:
                mid = rng.choice(sorted(streams))
                await send_json(producer, {"id": mid, "delta": streams[mid].pop(0)})
                if not streams[mid]:
                    del streams[mid]
                    await send_json(producer, {"id": mid, "final": True})
                    assert await recv_core(producer) == {
                        "type": "ack",
                        "id": mid,
                        "channel": "chat",
                    }
        for ws in subscribers:
            got = {}
            for _ in texts:
                frame = await recv_core(ws)
                assert frame["type"] == "message" and frame["channel"] == "chat"
                got[frame["id"]] = frame["text"]
            assert got == texts
        # Each subscriber's own 0.05 s of silence, all watched at once.
        await asyncio.gather(*(assert_silent(ws, 0.05) for ws in subscribers))
    finally:
        for ws in subscribers:
            await ws.close()


async def test_channel_isolation(relay: RunningRelay) -> None:
    async with (
        relay.connect("/subscribe?channel=a") as sub_a,
        relay.connect("/subscribe?channel=b") as sub_b,
        relay.connect("/produce") as producer,
    ):
        await recv_core(sub_a)
        await recv_core(sub_b)
        await send_json(producer, {"id": "x", "delta": "for a", "final": True, "channel": "a"})
        await send_json(producer, {"id": "y", "delta": "for b", "final": True, "channel": "b"})
        assert await recv_core(producer) == {"type": "ack", "id": "x", "channel": "a"}
        assert await recv_core(producer) == {"type": "ack", "id": "y", "channel": "b"}
        assert await recv_core(sub_a) == {
            "type": "message",
            "channel": "a",
            "id": "x",
            "text": "for a",
        }
        assert await recv_core(sub_b) == {
            "type": "message",
            "channel": "b",
            "id": "y",
            "text": "for b",
        }
        await asyncio.gather(assert_silent(sub_a, 0.1), assert_silent(sub_b, 0.05))


async def test_subscribe_and_unsubscribe_by_frame(relay: RunningRelay) -> None:
    async with relay.connect("/subscribe") as sub, relay.connect("/produce") as producer:
        await send_json(sub, {"type": "subscribe", "channel": "c1"})
        assert await recv_core(sub) == {"type": "subscribed", "channel": "c1"}
        await send_json(sub, {"type": "subscribe", "channel": "c2"})
        assert await recv_core(sub) == {"type": "subscribed", "channel": "c2"}
        await send_json(producer, {"id": "1", "delta": "one", "final": True, "channel": "c1"})
        await send_json(producer, {"id": "2", "delta": "two", "final": True, "channel": "c2"})
        assert (await recv_core(sub))["id"] == "1"
        assert (await recv_core(sub))["id"] == "2"

        await send_json(sub, {"type": "unsubscribe", "channel": "c1"})
        assert await recv_core(sub) == {"type": "unsubscribed", "channel": "c1"}
        await send_json(producer, {"id": "3", "delta": "gone", "final": True, "channel": "c1"})
        await send_json(producer, {"id": "4", "delta": "kept", "final": True, "channel": "c2"})
        assert await recv_core(sub) == {
            "type": "message",
            "channel": "c2",
            "id": "4",
            "text": "kept",
        }
        await assert_silent(sub, 0.1)


async def test_repeated_final_is_acked_but_never_rebroadcast(relay: RunningRelay) -> None:
    async with subscribed_pair(relay) as (sub, producer):
        await send_json(producer, {"id": "m", "delta": "hel"})
        await send_json(producer, {"id": "m", "delta": "lo", "final": True})
        await send_json(producer, {"id": "m", "delta": "ignored", "final": True})
        await send_json(producer, {"id": "m", "final": True})
        for _ in range(3):
            assert await recv_core(producer) == {"type": "ack", "id": "m", "channel": "c"}
        assert await recv_core(sub) == {
            "type": "message",
            "channel": "c",
            "id": "m",
            "text": "hello",
        }
        await assert_silent(sub, 0.1)


async def test_empty_and_absent_deltas(relay: RunningRelay) -> None:
    async with subscribed_pair(relay) as (sub, producer):
        await send_json(producer, {"id": "e", "final": True})
        await send_json(producer, {"id": "f", "delta": ""})
        await send_json(producer, {"id": "f", "delta": "x"})
        await send_json(producer, {"id": "f", "delta": "", "final": True})
        assert await recv_core(sub) == {"type": "message", "channel": "c", "id": "e", "text": ""}
        assert await recv_core(sub) == {"type": "message", "channel": "c", "id": "f", "text": "x"}


async def test_same_id_on_two_producers_never_mixes(open_relay: OpenRelay) -> None:
    # Each producer delivers its own text under one id: the second one's events are applied
    # after the first one's message ended (else they would be refused), which only
    # --id-hold 0 lets through.
    async with (
        open_relay(id_hold=0) as (running, sub, p1),
        running.connect("/produce?channel=c") as p2,
    ):
        for i in range(10):
            await send_json(p1, {"id": "same", "delta": f"A{i}"})
            await send_json(p2, {"id": "same", "delta": f"B{i}"})
        await send_json(p1, {"id": "same", "final": True})
        await recv_core(p1)
        await send_json(p2, {"id": "same", "final": True})
        await recv_core(p2)
        texts = [(await recv_core(sub))["text"] for _ in range(2)]
        assert texts == ["".join(f"A{i}" for i in range(10)), "".join(f"B{i}" for i in range(10))]


async def test_producer_close_frees_its_state() -> None:
    # The closed producer's id is taken by the next one: an aborted message holds no id.
    running, server = await start_relay()
    async with server, running.connect("/subscribe?channel=c") as sub:
        await recv_core(sub)
        async with running.connect("/produce?channel=c") as producer:
            await send_json(producer, {"id": "m", "delta": "lost"})
        assert await recv_core(sub) == {
            "type": "aborted",
            "channel": "c",
            "id": "m",
            "text": "lost",
            "reason": "producer_disconnected",
        }
        async with running.connect("/produce?channel=c") as producer:
            await send_json(producer, {"id": "m", "delta": "fresh", "final": True})
            await recv_core(producer)
        assert await recv_core(sub) == {
            "type": "message",
            "channel": "c",
            "id": "m",
            "text": "fresh",
        }


BAD_PRODUCER_FRAMES = [
    ("{not json", "invalid_json", None),
    ("[1, 2]", "invalid_json", None),
    ('"just a string"', "invalid_json", None),
    ('{"delta": "x"}', "invalid_event", None),
    ('{"id": 7, "delta": "x"}', "invalid_event", None),
    ('{"id": "bad", "delta": 5}', "invalid_event", "bad"),
    ('{"id": "bad", "delta": null}', "invalid_event", "bad"),
    ('{"id": "bad", "final": "yes"}', "invalid_event", "bad"),
    ('{"id": "bad", "delta": "x", "colour": "red"}', "invalid_event", "bad"),
    ('{"id": "bad", "channel": ""}', "invalid_event", "bad"),
]


@pytest.mark.parametrize(("raw", "code", "error_id"), BAD_PRODUCER_FRAMES)
async def test_bad_producer_frame_gets_error_and_nothing_is_lost(
    relay: RunningRelay, raw: str, code: str, error_id: str | None
) -> None:
    async with subscribed_pair(relay) as (sub, producer):
        await send_json(producer, {"id": "keep", "delta": "before "})
        await producer.send(raw)
        error = await recv_core(producer)
        assert error["type"] == "error"
        assert error["code"] == code
        assert error["id"] == error_id
        assert isinstance(error["message"], str) and error["message"]
        await send_json(producer, {"id": "keep", "delta": "after", "final": True})
        assert await recv_core(producer) == {"type": "ack", "id": "keep", "channel": "c"}
        assert await recv_core(sub) == {
            "type": "message",
            "channel": "c",
            "id": "keep",
            "text": "before after",
        }
        await assert_silent(sub, 0.05)


async def test_error_message_names_the_offending_field(relay: RunningRelay) -> None:
    async with relay.connect("/produce?channel=c") as producer:
        cases = {
            '{"delta": "x"}': "id",
            '{"id": "m", "delta": 5}': "delta",
            '{"id": "m", "final": 1}': "final",
            '{"id": "m", "surprise": 1}': "surprise",
        }
        for raw, field in cases.items():
            await producer.send(raw)
            assert f"'{field}'" in (await recv_core(producer))["message"]


async def test_binary_frame_is_rejected_and_connection_stays(relay: RunningRelay) -> None:
    async with subscribed_pair(relay) as (sub, producer):
        await producer.send(b'{"id": "m", "delta": "x", "final": true}')
        error = await recv_core(producer)
        assert error["code"] == "binary_not_supported" and error["id"] is None
        await sub.send(b'{"type": "subscribe", "channel": "d"}')
        assert (await recv_core(sub))["code"] == "binary_not_supported"
        await send_json(producer, {"id": "m", "delta": "ok", "final": True})
        assert (await recv_core(sub))["text"] == "ok"


async def test_channel_required_and_channel_mismatch(relay: RunningRelay) -> None:
    async with subscribed_pair(relay, channel="a", producer="/produce") as (sub, producer):
        await send_json(producer, {"id": "m", "delta": "no channel"})
        assert await recv_core(producer) == {
            "type": "error",
            "code": "channel_required",
            "id": "m",
            "message": "'channel' is required: name it in the event or in the URL (?channel=)",
        }
        await send_json(producer, {"id": "m", "delta": "in a ", "channel": "a"})
        await send_json(producer, {"id": "m", "delta": "moved", "channel": "b"})
        error = await recv_core(producer)
        assert (error["code"], error["id"]) == ("channel_mismatch", "m")
        await send_json(producer, {"id": "m", "delta": "still a", "final": True, "channel": "a"})
        assert await recv_core(producer) == {"type": "ack", "id": "m", "channel": "a"}
        assert (await recv_core(sub))["text"] == "in a still a"


async def test_event_channel_overrides_connection_default(relay: RunningRelay) -> None:
    default = "/produce?channel=default"
    async with subscribed_pair(relay, channel="other", producer=default) as (sub, producer):
        await send_json(producer, {"id": "m", "delta": "x", "final": True, "channel": "other"})
        assert await recv_core(producer) == {"type": "ack", "id": "m", "channel": "other"}
        assert (await recv_core(sub))["channel"] == "other"


BAD_SUBSCRIBER_FRAMES = [
    ("{nope", "invalid_json"),
    ("[]", "invalid_json"),
    ('{"type": "dance", "channel": "c"}', "unknown_frame"),
    ('{"channel": "c"}', "unknown_frame"),
    ('{"type": "subscribe"}', "invalid_frame"),
    ('{"type": "subscribe", "channel": 3}', "invalid_frame"),
    ('{"type": "subscribe", "channel": "c", "x": 1}', "invalid_frame"),
]


@pytest.mark.parametrize(("raw", "code"), BAD_SUBSCRIBER_FRAMES)
async def test_bad_subscriber_frame_gets_error_and_subscription_survives(
    relay: RunningRelay, raw: str, code: str
) -> None:
    async with subscribed_pair(relay) as (sub, producer):
        await sub.send(raw)
        error = await recv_core(sub)
        assert (error["type"], error["code"]) == ("error", code)
        await send_json(producer, {"id": "m", "delta": "still here", "final": True})
        assert await recv_core(sub) == {
            "type": "message",
            "channel": "c",
            "id": "m",
            "text": "still here",
        }


async def test_oversized_frame_closes_with_1009() -> None:
    running, server = await start_relay(max_frame_bytes=1024)
    async with server, running.connect("/produce?channel=c") as producer:
        await send_json(producer, {"id": "m", "delta": "x" * 2000})
        with pytest.raises(ConnectionClosedError) as closed:
            await recv_core(producer)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_too_many_unfinished_messages_is_rejected() -> None:
    running, server = await start_relay(max_streaming_per_producer=2)
    async with server, running.connect("/produce?channel=c") as producer:
        await send_json(producer, {"id": "a", "delta": "1"})
        await send_json(producer, {"id": "b", "delta": "2"})
        await send_json(producer, {"id": "c", "delta": "3"})
        error = await recv_core(producer)
        assert (error["code"], error["id"]) == ("too_many_messages", "c")
        await send_json(producer, {"id": "a", "final": True})
        assert (await recv_core(producer))["type"] == "ack"
        await send_json(producer, {"id": "c", "delta": "3", "final": True})
        assert await recv_core(producer) == {"type": "ack", "id": "c", "channel": "c"}


async def test_too_many_channels_is_rejected() -> None:
    running, server = await start_relay(max_channels_per_subscriber=2)
    async with server, running.connect("/subscribe?channel=a&channel=b") as sub:
        assert await recv_core(sub) == {"type": "subscribed", "channel": "a"}
        assert await recv_core(sub) == {"type": "subscribed", "channel": "b"}
        await send_json(sub, {"type": "subscribe", "channel": "c"})
        assert (await recv_core(sub))["code"] == "too_many_channels"
        await send_json(sub, {"type": "unsubscribe", "channel": "a"})
        assert (await recv_core(sub))["type"] == "unsubscribed"
        await send_json(sub, {"type": "subscribe", "channel": "c"})
        assert await recv_core(sub) == {"type": "subscribed", "channel": "c"}


@pytest.mark.parametrize(
    ("path", "status"),
    [("/nowhere", 404), ("/subscribe?channel=", 400), ("/produce?channel=a&channel=b", 400)],
)
async def test_bad_handshakes_are_refused(relay: RunningRelay, path: str, status: int) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with relay.connect(path):
            pass
    assert refused.value.response.status_code == status


async def test_slow_subscriber_is_closed_and_others_keep_receiving() -> None:
    running, server = await start_relay(max_subscriber_buffer_bytes=64 * 1024)
    async with (
        server,
        running.connect("/subscribe?channel=c", max_size=None) as fast,
        running.connect("/subscribe?channel=c", max_size=None) as slow,
        running.connect("/produce?channel=c") as producer,
    ):
        await recv_core(fast)
        await recv_core(slow)
        # The slow client stops reading: pause its transport so bytes pile up at the relay.
        slow.transport.pause_reading()
        text = "y" * 200_000
        for i in range(40):
            await send_json(producer, {"id": f"m{i}", "delta": text, "final": True})
            await recv_core(producer)
            assert (await recv_core(fast))["id"] == f"m{i}"
        slow.transport.resume_reading()
        with pytest.raises(ConnectionClosedError) as closed:
            while True:
                await asyncio.wait_for(slow.recv(), 5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013


async def test_an_emoji_split_across_deltas_arrives_whole(relay: RunningRelay) -> None:
    async with subscribed_pair(relay, deltas=True) as (sub, producer):
        # As a gateway slicing a JavaScript string sends it: UTF-16 halves, JSON-escaped.
        await producer.send('{"id": "m", "delta": "A\\ud83d"}')
        await producer.send('{"id": "m", "delta": "\\ude00B", "final": true}')
        frames = [await recv_core(sub) for _ in range(3)]
        assert frames == [
            {"type": "delta", "channel": "c", "id": "m", "delta": "A"},
            {"type": "delta", "channel": "c", "id": "m", "delta": "\U0001f600B"},
            {"type": "message", "channel": "c", "id": "m", "text": "A\U0001f600B"},
        ]
        assert (await recv_json(producer))["type"] == "ack"


async def test_invalid_utf8_closes_with_1007(relay: RunningRelay) -> None:
    async with relay.connect("/produce?channel=c") as producer:
        # websockets' client would refuse to send it: write the frame to the socket raw.
        payload = b'{"id": "m", "delta": "\xff"}'
        header = bytes([0x81, 0x80 | len(payload)]) + b"\0\0\0\0"  # FIN, text, zero mask
        transport = producer.transport
        assert transport is not None
        transport.write(header + payload)
        with pytest.raises(ConnectionClosedError) as closed:
            await recv_json(producer)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007


def _raw_frame(first: int, payload: bytes) -> bytes:
    """A client's frame of under 126 bytes, written raw: ``first`` is FIN and the opcode;
    a zero mask, so the payload goes as it is."""
    return bytes([first, 0x80 | len(payload)]) + b"\0\0\0\0" + payload


async def test_a_message_in_too_many_frames_closes_with_1009_and_others_go_on(
    relay: RunningRelay,
) -> None:
    """A message may come in fragments, up to MAX_FRAGMENTS frames; a peer sending empty
    continuation frames past that is closed (1009), holding nothing for them meanwhile,
    and the channel's other producers go on."""
    async with relay.connect("/subscribe?channel=frag") as sub:
        await recv_core(sub)
        async with (
            relay.connect("/produce?channel=frag") as fragmented,
            relay.connect("/produce?channel=frag") as flooding,
            relay.connect("/produce?channel=frag") as other,
        ):
            # Within the limit: one character a frame, and empty frames between them.
            text = b'{"id": "f", "delta": "in pieces", "final": true}'
            frames = [_raw_frame(0x01, text[:1])]
            for n in range(1, len(text)):
                frames += [_raw_frame(0x00, b"")] * 100
                frames.append(_raw_frame(0x80 if n == len(text) - 1 else 0x00, text[n : n + 1]))
            assert len(frames) <= MAX_FRAGMENTS
            assert fragmented.transport is not None
            fragmented.transport.write(b"".join(frames))
            assert await recv_core(sub) == {
                "type": "message",
                "channel": "frag",
                "id": "f",
                "text": "in pieces",
            }
            # Past it: the frame after the limit fails the connection.
            flood = [_raw_frame(0x01, b'{"id": "x", ')]
            flood += [_raw_frame(0x00, b"")] * MAX_FRAGMENTS
            assert flooding.transport is not None
            flooding.transport.write(b"".join(flood))
            with pytest.raises(ConnectionClosedError) as closed:
                while True:
                    await recv_json(flooding)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
            assert closed.value.rcvd.reason == f"message in more than {MAX_FRAGMENTS} frames"
            await send_json(other, {"id": "o", "delta": "still here", "final": True})
            assert (await recv_core(sub))["text"] == "still here"


async def test_meta_rides_on_the_message_and_on_an_abort(relay: RunningRelay) -> None:
    async with relay.connect("/subscribe?channel=meta") as sub:
        await recv_core(sub)
        async with relay.connect("/produce?channel=meta") as producer:
            await send_json(producer, {"id": "m", "delta": "hi", "meta": {"model": "x"}})
            await send_json(producer, {"id": "m", "final": True, "meta": {"finish_reason": "stop"}})
            await recv_json(producer)
            message = await recv_json(sub)
            assert message["meta"] == {"model": "x", "finish_reason": "stop"}
            await send_json(producer, {"id": "n", "delta": "cut", "meta": {"usage": {"out": 1}}})
            await send_json(producer, {"id": "bad", "meta": {"k": "v" * 5000}})
            refused = await recv_json(producer)
            assert (refused["code"], refused["id"]) == ("invalid_event", "bad")
        aborted = await recv_json(sub)
        assert (aborted["type"], aborted["meta"]) == ("aborted", {"usage": {"out": 1}})


async def test_rewind_replays_the_last_messages_then_goes_live(relay: RunningRelay) -> None:
    async with relay.connect("/produce?channel=rw") as producer:
        for n in range(4):
            await send_json(producer, {"id": f"m{n}", "delta": f"t{n}", "final": True})
            await recv_json(producer)
        async with relay.connect("/subscribe") as sub:
            await send_json(sub, {"type": "subscribe", "channel": "rw", "rewind": 2})
            confirmation = await recv_json(sub)
            assert (confirmation["type"], confirmation["offset"]) == ("subscribed", 4)
            assert [(await recv_json(sub))["id"] for _ in range(2)] == ["m2", "m3"]
            await send_json(producer, {"id": "m4", "delta": "t4", "final": True})
            assert (await recv_json(sub))["id"] == "m4"
        async with relay.connect("/subscribe?channel=rw&rewind=1") as by_url:
            assert (await recv_json(by_url))["type"] == "subscribed"
            assert (await recv_json(by_url))["id"] == "m4"
        with pytest.raises(InvalidStatus) as refused:
            async with relay.connect("/subscribe?channel=rw&rewind=0"):
                pass
        assert refused.value.response.status_code == 400


async def test_stop_ends_when_the_sweeper_swallows_its_cancel() -> None:
    """A cancel that lands while a Redis client's own timeout fires can be swallowed by it:
    the relay's sweep of idle messages must end with the relay all the same, not sweep on
    (a process would never exit: its loop waits for every task at the end)."""
    _, relay = await start_relay(idle_timeout=0.2)
    swallowed = swept_after = 0
    sweeping = asyncio.Event()

    async def expire_idle(before: float) -> None:
        nonlocal swallowed, swept_after
        sweeping.set()
        swept_after += swallowed
        try:
            await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed += 1  # as a library's timeout can: this cancel goes no further

    relay.producers.expire_idle = expire_idle  # type: ignore[method-assign]
    await asyncio.wait_for(sweeping.wait(), 5)
    await asyncio.wait_for(relay.stop(), 10)
    assert swallowed == 1
    assert swept_after == 0  # the sweep ended once the relay stopped
