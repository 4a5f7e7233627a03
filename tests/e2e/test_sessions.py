"""End to end: resumable producer sessions and per-message sequence numbers."""

from __future__ import annotations

import asyncio

import pytest
from token_relay.core.grants import Role
from token_relay.tokens import mint
from websockets.exceptions import ConnectionClosed

from ..conftest import (
    RunningRelay,
    assert_silent,
    open_producer,
    recv_json,
    send_json,
    start_relay,
    subscribed_pair,
)
from ..harness import eventually


async def test_seq_duplicates_are_dropped_and_a_duplicate_final_is_acked_as_such(
    relay: RunningRelay,
) -> None:
    async with subscribed_pair(relay, deltas=True) as (sub, producer):
        for seq, delta in [(1, "a"), (2, "b"), (2, "b"), (1, "a"), (3, "c")]:
            await send_json(producer, {"id": "m", "delta": delta, "seq": seq})
        await send_json(producer, {"id": "m", "final": True, "seq": 4})
        assert await recv_json(producer) == {"type": "ack", "id": "m", "channel": "c"}
        await send_json(producer, {"id": "m", "final": True, "seq": 4})
        assert await recv_json(producer) == {
            "type": "ack",
            "id": "m",
            "channel": "c",
            "duplicate": True,
        }
        frames = [await recv_json(sub) for _ in range(4)]
        assert [f.get("delta") for f in frames[:3]] == ["a", "b", "c"]
        assert frames[3]["text"] == "abc"
        await assert_silent(sub, 0.1)


async def test_without_seq_repeats_append_again(relay: RunningRelay) -> None:
    async with subscribed_pair(relay) as (sub, producer):
        for _ in range(2):
            await send_json(producer, {"id": "m", "delta": "ab"})
        await send_json(producer, {"id": "m", "final": True})
        await recv_json(producer)
        assert (await recv_json(sub))["text"] == "abab"


async def test_a_seq_gap_is_refused_with_the_expected_seq_and_changes_nothing(
    relay: RunningRelay,
) -> None:
    async with subscribed_pair(relay) as (sub, producer):
        await send_json(producer, {"id": "m", "delta": "a", "seq": 1})
        await send_json(producer, {"id": "m", "delta": "c", "seq": 3})
        error = await recv_json(producer)
        assert (error["code"], error["id"], error["expected"]) == ("seq_gap", "m", 2)
        await send_json(producer, {"id": "new", "delta": "x", "seq": 2})
        error = await recv_json(producer)
        assert (error["code"], error["expected"]) == ("seq_gap", 1)
        # The producer sends again from the expected seq.
        await send_json(
            producer,
            [
                {"id": "m", "delta": "b", "seq": 2},
                {"id": "m", "delta": "c", "seq": 3},
                {"id": "m", "final": True, "seq": 4},
            ],
        )
        assert await recv_json(producer) == {"type": "acks", "acks": [{"id": "m", "channel": "c"}]}
        assert (await recv_json(sub))["text"] == "abc"


async def test_seq_in_batches_dedupes_and_names_the_gap(relay: RunningRelay) -> None:
    async with subscribed_pair(relay) as (sub, producer):
        first = [{"id": "m", "delta": str(n), "seq": n} for n in range(1, 6)]
        await send_json(producer, first)
        # A gateway unsure what arrived sends it all again, plus more and a gap.
        await send_json(
            producer,
            [
                *first,
                {"id": "m", "delta": "6", "seq": 6},
                {"id": "m", "delta": "9", "seq": 9},
                {"id": "m", "final": True, "seq": 7},
            ],
        )
        error = await recv_json(producer)
        assert (error["code"], error["index"], error["expected"]) == ("seq_gap", 6, 7)
        assert await recv_json(producer) == {"type": "acks", "acks": [{"id": "m", "channel": "c"}]}
        assert (await recv_json(sub))["text"] == "123456"


async def test_a_vanished_producer_resumes_its_session_with_no_abort() -> None:
    running, relay = await start_relay(session_grace=5)
    async with relay, running.connect("/subscribe?channel=c&deltas=1") as sub:
        await recv_json(sub)
        async with running.connect("/produce?channel=c") as first:
            session = first.session["session"]
            assert first.session["resumed"] is False
            await send_json(first, {"id": "m", "delta": "before ", "seq": 1})
            assert (await recv_json(sub))["delta"] == "before "
            first.transport.abort()  # the network fails: no close frame
        async with running.connect(f"/produce?channel=c&session={session}") as second:
            assert second.session == {"type": "session", "session": session, "resumed": True}
            await send_json(
                second,
                [
                    {"id": "m", "delta": "before ", "seq": 1},
                    {"id": "m", "delta": "after", "seq": 2},
                    {"id": "m", "final": True, "seq": 3},
                ],
            )
            assert (await recv_json(second))["type"] == "acks"
        assert (await recv_json(sub))["delta"] == "after"
        message = await recv_json(sub)
        assert (message["type"], message["text"]) == ("message", "before after")


async def test_session_grace_expiry_aborts_the_messages() -> None:
    running, relay = await start_relay(session_grace=0.3)
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        async with running.connect("/produce?channel=c") as producer:
            session = producer.session["session"]
            await send_json(producer, {"id": "m", "delta": "lost"})
            await asyncio.sleep(0.05)
            producer.transport.abort()
        aborted = await recv_json(sub, 5)
        assert (aborted["type"], aborted["text"], aborted["reason"]) == (
            "aborted",
            "lost",
            "producer_disconnected",
        )
        async with running.connect(f"/produce?channel=c&session={session}") as late:
            assert late.session["resumed"] is False and late.session["session"] != session


async def test_a_clean_close_ends_the_session_at_once() -> None:
    running, relay = await start_relay(session_grace=30)
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        async with running.connect("/produce?channel=c") as producer:
            await send_json(producer, {"id": "m", "delta": "bye"})
        aborted = await recv_json(sub, 5)
        assert (aborted["type"], aborted["reason"]) == ("aborted", "producer_disconnected")


async def test_resuming_takes_over_a_half_open_connection() -> None:
    running, relay = await start_relay(session_grace=5)
    async with relay, running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        async with running.connect("/produce?channel=c") as old:
            await send_json(old, {"id": "m", "delta": "one ", "seq": 1})
            await asyncio.sleep(0.05)
            async with running.connect(
                f"/produce?channel=c&session={old.session['session']}"
            ) as new:
                assert new.session["resumed"] is True
                with pytest.raises(ConnectionClosed) as closed:
                    await recv_json(old, 5)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
                await send_json(new, {"id": "m", "delta": "two", "seq": 2, "final": True})
                assert (await recv_json(new))["type"] == "ack"
        assert (await recv_json(sub))["text"] == "one two"


async def test_a_session_is_bound_to_the_token_identity() -> None:
    secret = "session-binding-secret-0123456789abcdef"
    running, relay = await start_relay(secret=secret, session_grace=5)
    alice = mint(secret, Role.PRODUCE, ["alice-*"], 60)
    mallory = mint(secret, Role.PRODUCE, ["*"], 60)
    async with relay:
        async with running.connect(f"/produce?channel=alice-1&token={alice}") as first:
            session = first.session["session"]
            await send_json(first, {"id": "m", "delta": "private"})
            await asyncio.sleep(0.05)
            first.transport.abort()
        async with running.connect(f"/produce?token={mallory}&session={session}") as thief:
            assert thief.session["resumed"] is False
        async with running.connect(f"/produce?token={alice}&session={session}") as owner:
            assert owner.session["resumed"] is True


async def test_connect_send_vanish_again_and_again_holds_little() -> None:
    running, relay = await start_relay(session_grace=30, max_parked_per_ip=3)
    async with relay:
        for n in range(20):
            async with open_producer(f"{running.url}/produce?channel=c") as producer:
                await send_json(producer, {"id": f"m{n}", "delta": "x" * 10_000})
                await asyncio.sleep(0.01)
                assert producer.transport is not None
                producer.transport.abort()  # vanish: no close frame
            await eventually(lambda n=n: len(relay.sessions.by_owner) <= n + 1)
        await eventually(lambda: len(relay.sessions.parked) == 3)
        assert relay.sessions.parked_chars == 3 * 10_000
