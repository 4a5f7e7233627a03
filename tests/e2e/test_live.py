"""End to end: live deltas, snapshots, offsets and resume, aborted streams and cancel."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import pytest

from ..conftest import (
    RunningRelay,
    assert_silent,
    recv_json,
    send_json,
    start_relay,
    subscribed_pair,
)
from .conftest import OpenRelay


async def _subscribe(ws: Any, channel: str, **fields: Any) -> dict[str, Any]:
    await send_json(ws, {"type": "subscribe", "channel": channel, **fields})
    confirmation = await recv_json(ws)
    assert confirmation["type"] == "subscribed" and confirmation["channel"] == channel
    return confirmation


async def test_deltas_are_forwarded_in_order_and_empty_ones_skipped(relay: RunningRelay) -> None:
    async with (
        relay.connect("/subscribe?channel=c&deltas=1") as live,
        relay.connect("/subscribe?channel=c") as plain,
        relay.connect("/produce?channel=c") as producer,
    ):
        await recv_json(live)
        await recv_json(plain)
        for delta in ["", "Hel", "", "lo", " wor", "ld"]:
            await send_json(producer, {"id": "m", "delta": delta})
        await send_json(producer, {"id": "m", "delta": "!", "final": True})
        await recv_json(producer)
        got = [await recv_json(live) for _ in range(6)]
        assert [f["delta"] for f in got[:5]] == ["Hel", "lo", " wor", "ld", "!"]
        assert all(f["type"] == "delta" and f["channel"] == "c" and f["id"] == "m" for f in got[:5])
        assert got[5]["type"] == "message" and got[5]["text"] == "Hello world!"
        plain_frame = await recv_json(plain)
        assert plain_frame["type"] == "message" and plain_frame["text"] == "Hello world!"
        await assert_silent(live, 0.1)
        await assert_silent(plain, 0.05)


@pytest.mark.parametrize("seed", range(6))
async def test_snapshot_plus_deltas_equals_final_under_random_interleaving(
    relay: RunningRelay, seed: int
) -> None:
    rng = random.Random(seed)
    texts = {
        f"m{i}": "".join(rng.choice(["a", "b", " ", "é", "🚀", "xyz"]) for _ in range(40))
        for i in range(4)
    }
    pieces = {mid: _split(text, rng) for mid, text in texts.items()}
    schedule = [mid for mid, parts in pieces.items() for _ in parts]
    rng.shuffle(schedule)
    join_at = rng.randrange(1, len(schedule))
    async with relay.connect("/produce?channel=c") as producer:
        cursor = dict.fromkeys(pieces, 0)
        late = None
        for step, mid in enumerate(schedule):
            if step == join_at:
                late = await relay.connect("/subscribe").__aenter__()
                await _subscribe(late, "c", deltas=True)
            await send_json(producer, {"id": mid, "delta": pieces[mid][cursor[mid]]})
            cursor[mid] += 1
        for mid in pieces:
            await send_json(producer, {"id": mid, "final": True})
            await recv_json(producer)
        assert late is not None
        seen: dict[str, str] = {}
        finals: dict[str, str] = {}
        while len(finals) < len(texts):
            frame = await recv_json(late)
            if frame["type"] == "snapshot":
                assert frame["id"] not in seen and "from" not in frame
                seen[frame["id"]] = frame["text"]
            elif frame["type"] == "delta":
                seen[frame["id"]] = seen.get(frame["id"], "") + frame["delta"]
            else:
                assert frame["type"] == "message"
                finals[frame["id"]] = frame["text"]
                assert seen.get(frame["id"], "") == frame["text"]
        assert finals == texts
        await late.close()


def _split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), 6))
    return [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]


async def test_positions_make_snapshot_carry_only_the_missing_suffix(relay: RunningRelay) -> None:
    async with relay.connect("/produce?channel=c") as producer, relay.connect("/subscribe") as sub:
        await send_json(producer, {"id": "a", "delta": "héllo 🚀 wor"})
        await send_json(producer, {"id": "b", "delta": "other"})
        await send_json(producer, {"id": "c", "delta": "short"})
        await send_json(producer, {"id": "m", "delta": "done", "final": True})
        await recv_json(producer)
        await _subscribe(sub, "c", deltas=True, positions={"a": 8, "c": 99})
        snapshots = {frame["id"]: frame for frame in [await recv_json(sub) for _ in range(3)]}
        assert snapshots["a"] == {
            "type": "snapshot",
            "channel": "c",
            "id": "a",
            "text": "wor",
            "from": 8,
        }
        assert snapshots["b"] == {"type": "snapshot", "channel": "c", "id": "b", "text": "other"}
        # A position past the text's end can't be trusted: the whole text is sent.
        assert snapshots["c"] == {"type": "snapshot", "channel": "c", "id": "c", "text": "short"}
        await send_json(producer, {"id": "a", "delta": "ld", "final": True})
        assert (await recv_json(sub))["delta"] == "ld"
        assert (await recv_json(sub))["text"] == "héllo 🚀 world"


async def test_plain_subscriber_gets_no_snapshots(relay: RunningRelay) -> None:
    async with relay.connect("/produce?channel=c") as producer, relay.connect("/subscribe") as sub:
        await send_json(producer, {"id": "a", "delta": "partial"})
        await _subscribe(sub, "c")
        await assert_silent(sub, 0.2)


async def test_offsets_increase_and_resume_fills_the_gap_exactly(relay: RunningRelay) -> None:
    async with relay.connect("/produce?channel=c") as producer:
        first = await relay.connect("/subscribe").__aenter__()
        hello = await _subscribe(first, "c")
        assert hello["offset"] == 0
        epoch = hello["epoch"]
        for i in range(3):
            await send_json(producer, {"id": f"m{i}", "delta": f"t{i}", "final": True})
            await recv_json(producer)
        offsets = [(await recv_json(first))["offset"] for _ in range(3)]
        assert offsets == [1, 2, 3]
        await first.close()
        # Missed while away: a message, an aborted stream, and another message.
        await send_json(producer, {"id": "m3", "delta": "t3", "final": True})
        await recv_json(producer)
        async with relay.connect("/produce?channel=c") as doomed:
            await send_json(doomed, {"id": "gone", "delta": "half"})
        await send_json(producer, {"id": "m4", "delta": "t4", "final": True})
        await recv_json(producer)
        async with relay.connect("/subscribe") as again:
            await send_json(
                again, {"type": "subscribe", "channel": "c", "since": {"offset": 3, "epoch": epoch}}
            )
            confirmation = await recv_json(again)
            assert confirmation == {
                "type": "subscribed",
                "channel": "c",
                "offset": 6,
                "epoch": epoch,
                "recovered": True,
                "replayed": 3,
            }
            replayed = [await recv_json(again) for _ in range(3)]
            assert [(f["type"], f["id"], f["offset"]) for f in replayed] == [
                ("message", "m3", 4),
                ("aborted", "gone", 5),
                ("message", "m4", 6),
            ]
            assert replayed[1]["text"] == "half"
            await assert_silent(again, 0.1)
            await send_json(producer, {"id": "m5", "delta": "t5", "final": True})
            live = await recv_json(again)
            assert (live["id"], live["offset"], live["epoch"]) == ("m5", 7, epoch)
            await assert_silent(again, 0.1)


async def test_resume_at_the_current_offset_replays_nothing(relay: RunningRelay) -> None:
    async with relay.connect("/subscribe") as sub:
        hello = await _subscribe(sub, "c")
        await send_json(sub, {"type": "unsubscribe", "channel": "c"})
        await recv_json(sub)
        resumed = await _subscribe(sub, "c", since={"offset": 0, "epoch": hello["epoch"]})
        assert resumed["recovered"] is True and resumed["offset"] == 0
        await assert_silent(sub, 0.1)


@pytest.mark.parametrize(
    "since",
    [{"offset": 0, "epoch": "not-the-epoch"}, {"offset": 99, "epoch": None}],
)
async def test_recovered_false_on_wrong_epoch_or_future_offset(
    relay: RunningRelay, since: dict[str, Any]
) -> None:
    async with relay.connect("/produce?channel=c") as producer, relay.connect("/subscribe") as sub:
        hello = await _subscribe(sub, "c")
        await send_json(producer, {"id": "m", "delta": "x", "final": True})
        await recv_json(producer)
        await recv_json(sub)
        since = {**since, "epoch": since["epoch"] or hello["epoch"]}
        async with relay.connect("/subscribe") as again:
            confirmation = await _subscribe(again, "c", since=since)
            assert confirmation == {
                "type": "subscribed",
                "channel": "c",
                "offset": 1,
                "epoch": hello["epoch"],
                "recovered": False,
            }
            await assert_silent(again, 0.1)


async def test_recovered_false_when_the_gap_is_older_than_history() -> None:
    running, server = await start_relay(history_size=2)
    async with (
        server,
        running.connect("/produce?channel=c") as producer,
        running.connect("/subscribe") as sub,
    ):
        hello = await _subscribe(sub, "c")
        for i in range(3):
            await send_json(producer, {"id": f"m{i}", "final": True})
            await recv_json(producer)
        async with running.connect("/subscribe") as again:
            gap = await _subscribe(again, "c", since={"offset": 0, "epoch": hello["epoch"]})
            assert (gap["recovered"], gap["offset"]) == (False, 3)
            await assert_silent(again, 0.1)
        async with running.connect("/subscribe") as near:
            ok = await _subscribe(near, "c", since={"offset": 1, "epoch": hello["epoch"]})
            assert ok["recovered"] is True
            assert [(await recv_json(near))["offset"] for _ in range(2)] == [2, 3]


async def test_idle_message_is_aborted_and_later_events_for_it_are_refused(
    open_relay: OpenRelay,
) -> None:
    async with open_relay(idle_timeout=0.3, deltas=True) as (_, sub, producer):
        await send_json(producer, {"id": "slow", "delta": "thinking"})
        assert (await recv_json(sub))["delta"] == "thinking"
        aborted = await recv_json(sub, 5)
        assert aborted == {
            "type": "aborted",
            "channel": "c",
            "id": "slow",
            "text": "thinking",
            "reason": "idle_timeout",
            "offset": 1,
            "epoch": aborted["epoch"],
        }
        await send_json(producer, {"id": "slow", "delta": " more", "final": True})
        error = await recv_json(producer)
        assert (error["code"], error["id"]) == ("message_aborted", "slow")
        await send_json(producer, {"id": "next", "delta": "fine", "final": True})
        assert (await recv_json(producer))["type"] == "ack"
        assert (await recv_json(sub))["delta"] == "fine"
        assert (await recv_json(sub))["text"] == "fine"


async def test_active_message_is_not_aborted_by_idle_timeout(open_relay: OpenRelay) -> None:
    async with open_relay(idle_timeout=0.4) as (_, sub, producer):
        for _ in range(8):
            await send_json(producer, {"id": "busy", "delta": "."})
            await asyncio.sleep(0.1)
        await send_json(producer, {"id": "busy", "final": True})
        assert (await recv_json(sub))["text"] == "........"


async def test_cancel_reaches_only_the_owning_producer(relay: RunningRelay) -> None:
    async with (
        subscribed_pair(relay) as (sub, owner),
        relay.connect("/produce?channel=c") as bystander,
        relay.connect("/produce?channel=d") as elsewhere,
    ):
        await send_json(owner, {"id": "mine", "delta": "x"})
        await send_json(bystander, {"id": "theirs", "delta": "y"})
        await send_json(elsewhere, {"id": "mine", "delta": "same id, other channel"})
        await asyncio.sleep(0.05)
        await send_json(sub, {"type": "cancel", "channel": "c", "id": "mine"})
        assert await recv_json(owner) == {"type": "cancel", "channel": "c", "id": "mine"}
        await assert_silent(bystander, 0.1)
        await assert_silent(elsewhere, 0.05)
        # The gateway stops and finalizes what it has.
        await send_json(owner, {"id": "mine", "final": True})
        assert (await recv_json(sub))["text"] == "x"


async def test_cancel_of_unknown_finished_or_unsubscribed_id_is_an_error(
    relay: RunningRelay,
) -> None:
    async with subscribed_pair(relay) as (sub, producer):
        await send_json(sub, {"type": "cancel", "channel": "c", "id": "nope"})
        assert (await recv_json(sub))["code"] == "unknown_message"
        await send_json(producer, {"id": "done", "delta": "d", "final": True})
        await recv_json(producer)
        await recv_json(sub)
        await send_json(sub, {"type": "cancel", "channel": "c", "id": "done"})
        error = await recv_json(sub)
        assert (error["code"], error["id"]) == ("unknown_message", "done")
        await send_json(sub, {"type": "cancel", "channel": "other", "id": "x"})
        assert (await recv_json(sub))["code"] == "not_subscribed"
        await assert_silent(producer, 0.1)


async def test_an_id_in_progress_for_another_producer_is_refused(relay: RunningRelay) -> None:
    async with (
        subscribed_pair(relay, deltas=True) as (sub, first),
        relay.connect("/produce?channel=c") as second,
    ):
        await send_json(first, {"id": "m", "delta": "A0 "})
        await send_json(second, {"id": "m", "delta": "B0 "})
        refused = await recv_json(second)
        assert (refused["code"], refused["id"]) == ("id_in_use", "m")
        await send_json(second, [{"id": "ok", "delta": "x"}, {"id": "m", "final": True}])
        batch_refusal = await recv_json(second)
        assert (batch_refusal["code"], batch_refusal["index"]) == ("id_in_use", 1)
        await send_json(first, {"id": "m", "delta": "A1", "final": True})
        frames = [await recv_json(sub) for _ in range(4)]
        assert [(f["type"], f["id"]) for f in frames] == [
            ("delta", "m"), ("delta", "ok"), ("delta", "m"), ("message", "m"),
        ]  # fmt: skip
        assert frames[3]["text"] == "A0 A1"


async def test_a_cancel_flood_reaches_the_producer_once_and_cuts_nothing_else(
    relay: RunningRelay,
) -> None:
    async with (
        relay.connect("/subscribe?channel=c") as flooder,
        relay.connect("/subscribe?channel=other") as bystander,
        relay.connect("/produce") as producer,
    ):
        await recv_json(flooder)
        await recv_json(bystander)
        await send_json(producer, {"id": "m", "delta": "x", "channel": "c"})
        await send_json(producer, {"id": "elsewhere", "delta": "going ", "channel": "other"})
        await asyncio.sleep(0.05)
        for _ in range(300):
            await send_json(flooder, {"type": "cancel", "channel": "c", "id": "m"})
        answers = []
        with contextlib.suppress(TimeoutError):
            while True:
                answers.append(await recv_json(flooder, 0.3))
        # About a second's worth passed (100, plus what the bucket refilled meanwhile).
        assert {a["code"] for a in answers} == {"rate_limited"}
        assert 150 <= len(answers) <= 200
        assert await recv_json(producer) == {"type": "cancel", "channel": "c", "id": "m"}
        await assert_silent(producer, 0.2)  # once, however many Stop presses
        await send_json(producer, {"id": "elsewhere", "delta": "on", "final": True,
                                   "channel": "other"})  # fmt: skip
        assert (await recv_json(producer))["type"] == "ack"
        assert (await recv_json(bystander))["text"] == "going on"
