"""What only the Redis broker does: share channels between processes, and only where listened."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from token_relay.brokers import Broker, open_broker
from token_relay.brokers.redis import RedisBroker, catchup, outbox, writes
from token_relay.brokers.redis.keys import KEY_TTL
from token_relay.core.errors import BrokerUnavailable, ErrorCode, FrameRejected
from token_relay.core.settings import Settings

from ..conftest import recv_json, send_json, start_relay
from ..harness import RedisServer, eventually
from .test_contract import Recorder, message_body, recorder_of, until


@pytest.fixture
async def two_brokers(redis_server: RedisServer) -> AsyncIterator[tuple[Broker, Broker]]:
    brokers = []
    for name in ("alpha", "beta"):
        broker = open_broker(Settings(broker=redis_server.url), name)
        recorder = Recorder()
        await broker.start(recorder)
        broker.recorder = recorder  # type: ignore[attr-defined]
        brokers.append(broker)
    try:
        yield brokers[0], brokers[1]
    finally:
        for broker in brokers:
            await broker.close()


@contextlib.asynccontextmanager
async def _client(url: str) -> AsyncIterator[Redis]:
    """A plain redis-py client of the test's own, to look at what the brokers left."""
    redis = Redis.from_url(url)
    try:
        yield redis
    finally:
        await redis.aclose()


async def _numsub(url: str, topic: str) -> int:
    async with _client(url) as redis:
        counts = await redis.pubsub_numsub(topic)
    return int(counts[0][1])


async def test_only_listening_processes_receive_a_channel(
    two_brokers: tuple[Broker, Broker], redis_server: RedisServer
) -> None:
    alpha, beta = two_brokers
    alpha_seen: Recorder = alpha.recorder  # type: ignore[attr-defined]
    beta_seen: Recorder = beta.recorder  # type: ignore[attr-defined]
    await beta.listen("c", True, False)
    assert await _numsub(redis_server.url, "tr:m:c") == 1
    assert await _numsub(redis_server.url, "tr:d:c") == 0
    alpha.open("c", "alpha.1", "m")
    alpha.delta("c", "alpha.1", "m", "x")
    await alpha.terminal("c", "alpha.1", "m", message_body("c", "m", "x"))
    await until(lambda: beta_seen.frames)
    assert [kind.value for _, kind, _, _ in beta_seen.frames] == ["t"]
    assert alpha_seen.frames == []

    await beta.listen("c", False, False)
    assert await _numsub(redis_server.url, "tr:m:c") == 0
    await alpha.terminal("c", "alpha.1", "n", message_body("c", "n", "y"))
    await beta.listen("d", True, False)  # a round trip on beta's subscription connection
    assert len(beta_seen.frames) == 1


async def test_offsets_stay_increasing_across_processes(two_brokers: tuple[Broker, Broker]) -> None:
    alpha, beta = two_brokers
    frames = []
    for i in range(6):
        broker = alpha if i % 2 else beta
        frames.append(
            await broker.terminal(
                "c", f"{broker.instance}.1", f"m{i}", message_body("c", f"m{i}", "")
            )
        )
    offsets = [int(frame.split('"offset":')[1].split(",")[0]) for frame in frames]
    assert offsets == [1, 2, 3, 4, 5, 6]
    epoch = (await beta.catch_up("c", None, False)).epoch
    cut = await alpha.catch_up("c", (0, epoch), False)
    assert (cut.recovered, cut.frames) == (True, frames)


async def test_a_burst_of_joins_waits_its_turn_and_never_wedges(
    two_brokers: tuple[Broker, Broker],
) -> None:
    alpha, _ = two_brokers
    # Many more joins at once than the pool has connections: each waits, none is refused.
    cuts = await asyncio.gather(*(alpha.catch_up(f"burst-{n}", None, True) for n in range(300)))
    assert len({cut.epoch for cut in cuts}) == 300
    assert alpha.healthy
    await alpha.terminal("burst-0", "alpha.1", "m", message_body("burst-0", "m", "after"))


async def test_health_is_probed_and_comes_back_after_a_redis_restart(
    two_brokers: tuple[Broker, Broker], redis_server: RedisServer
) -> None:
    alpha, beta = two_brokers
    assert alpha.healthy and beta.healthy
    redis_server.kill()
    await until(lambda: not alpha.healthy and not beta.healthy, 5)
    with pytest.raises(BrokerUnavailable):
        await alpha.catch_up("c", None, False)
    redis_server.start()
    # The documented backoff is at most 2 s between tries, plus a probe.
    await until(lambda: alpha.healthy and beta.healthy, 6)
    cut = await alpha.catch_up("c", None, False)
    assert cut.offset == 0


async def test_terminal_frames_deferred_in_an_outage_are_published_in_order_after(
    two_brokers: tuple[Broker, Broker], redis_server: RedisServer
) -> None:
    alpha, beta = two_brokers
    redis_server.kill()
    await until(lambda: not alpha.healthy, 5)
    for n in range(3):
        alpha.defer("c", "alpha.1", f"m{n}", message_body("c", f"m{n}", f"text {n}"))
    assert alpha.outbox == 3  # type: ignore[attr-defined]
    redis_server.start()
    await until(lambda: alpha.healthy and alpha.outbox == 0, 6)  # type: ignore[attr-defined]

    async def published() -> bool:
        # Right after the restart beta's pooled connections may still be the dead ones: a
        # read then fails once with BrokerUnavailable (a joiner gets broker_unavailable and
        # tries again), and the next one uses a fresh connection.
        try:
            cut = await beta.catch_up("c", None, False)
        except BrokerUnavailable:
            return False
        return cut.offset == 3

    await eventually(published, 5)
    epoch = (await beta.catch_up("c", None, False)).epoch
    cut = await beta.catch_up("c", (0, epoch), False)
    assert [json.loads(frame)["id"] for frame in cut.frames] == ["m0", "m1", "m2"]
    assert [json.loads(frame)["offset"] for frame in cut.frames] == [1, 2, 3]


async def test_the_outbox_is_bounded_and_drops_the_oldest(
    two_brokers: tuple[Broker, Broker],
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alpha, _ = two_brokers
    monkeypatch.setattr(outbox, "MAX_OUTBOX", 2)
    redis_server.kill()
    await until(lambda: not alpha.healthy, 5)
    for n in range(3):
        alpha.defer("c", "alpha.1", f"m{n}", message_body("c", f"m{n}", "t"))
    assert alpha.outbox == 2  # type: ignore[attr-defined]
    assert [entry.message_id for entry in alpha._outbox] == ["m1", "m2"]  # type: ignore[attr-defined]


def _scripts_run(broker: Broker) -> list[str]:
    """The scripts the broker's writer runs from now on, in order."""
    assert isinstance(broker, RedisBroker)
    seen: list[str] = []
    pipeline = broker._pipeline
    execute = pipeline.execute

    async def counted(batch: list[writes.Write]) -> list[object]:
        seen.extend(write.script for write in batch)
        return await execute(batch)

    pipeline.execute = counted  # type: ignore[method-assign]
    return seen


async def _watched(brokers: tuple[Broker, Broker]) -> tuple[Broker, Recorder, list[str]]:
    """Alpha, what beta (listening to ``c``, with deltas) receives, and the scripts alpha's
    writer runs from now on."""
    alpha, beta = brokers
    await beta.listen("c", True, True)
    return alpha, beta.recorder, _scripts_run(alpha)  # type: ignore[attr-defined]


async def _state(url: str, channel: str, owner: str, message_id: str) -> dict[str, object]:
    """What Redis holds of a message besides its frame: in progress, its text and claim, the
    owner's session's note of it, and its fate there."""
    async with _client(url) as redis:
        done = await redis.hget(f"tr:done:{owner}", message_id)
        return {
            "live": await redis.smembers(f"tr:live:{channel}"),
            "text": await redis.exists(f"tr:text:{owner}|{message_id}"),
            "claim": await redis.hget(f"tr:own:{channel}", message_id),
            "noted": await redis.hget(f"tr:msg:{owner}", message_id),
            "fate": done.split(b"|")[0] if done else None,
        }


async def test_a_message_still_queued_whole_goes_as_one_script_to_the_same_end(
    two_brokers: tuple[Broker, Broker], redis_server: RedisServer
) -> None:
    alpha, beta_seen, scripts = await _watched(two_brokers)
    # Nothing awaited in between: the open and its deltas are still queued at the final.
    alpha.open("c", "alpha.1", "m")
    alpha.delta("c", "alpha.1", "m", "hel")
    alpha.delta("c", "alpha.1", "m", "lo")
    whole = await alpha.terminal("c", "alpha.1", "m", message_body("c", "m", "hello"))
    assert scripts == ["whole"]
    # The same message in steps: the open reaches Redis before the final is queued.
    alpha.open("c", "alpha.1", "n")
    alpha.delta("c", "alpha.1", "n", "hello")
    await alpha.flush_writes()
    stepped = await alpha.terminal("c", "alpha.1", "n", message_body("c", "n", "hello"))
    assert scripts[1:] == ["open", "progress", "terminal"]
    await until(lambda: len(beta_seen.frames) == 4)
    kinds = [(kind.value, json.loads(text).get("id")) for _, kind, _, text in beta_seen.frames]
    assert kinds == [("d", "m"), ("t", "m"), ("d", "n"), ("t", "n")]
    assert json.loads(beta_seen.frames[0][3])["delta"] == "hello"  # its deltas, joined once
    assert json.loads(whole)["offset"] == 1 and json.loads(stepped)["offset"] == 2
    seqs = [seq for _, _, seq, _ in beta_seen.frames]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4
    ends = [await _state(redis_server.url, "c", "alpha.1", name) for name in ("m", "n")]
    assert (
        ends[0]
        == ends[1]
        == {
            "live": set(),
            "text": 0,
            "claim": None,
            "noted": None,
            "fate": b"m",
        }
    )
    epoch = (await alpha.catch_up("c", None, False)).epoch
    cut = await alpha.catch_up("c", (0, epoch), False)
    assert [json.loads(frame)["id"] for frame in cut.frames] == ["m", "n"]


async def test_a_whole_message_whose_id_another_producer_holds_is_refused(
    two_brokers: tuple[Broker, Broker],
) -> None:
    alpha, beta = two_brokers
    alpha_seen: Recorder = alpha.recorder  # type: ignore[attr-defined]
    beta_seen: Recorder = beta.recorder  # type: ignore[attr-defined]
    await beta.listen("c", True, True)
    beta.open("c", "beta.1", "m")
    await beta.flush_writes()
    scripts = _scripts_run(alpha)
    alpha.open("c", "alpha.1", "m")
    alpha.delta("c", "alpha.1", "m", "not yours")
    with pytest.raises(FrameRejected) as refused:
        await alpha.terminal("c", "alpha.1", "m", message_body("c", "m", "not yours"))
    assert refused.value.code is ErrorCode.ID_IN_USE
    assert scripts == ["whole"]
    assert alpha_seen.refused == [("c", "alpha.1", "m")]
    await beta.listen("d", True, False)  # a round trip on beta's subscription connection
    assert beta_seen.frames == []  # neither its delta nor a frame was published


async def test_a_final_after_other_writes_were_queued_waits_its_turn(
    two_brokers: tuple[Broker, Broker],
) -> None:
    alpha, beta_seen, scripts = await _watched(two_brokers)
    alpha.open("c", "alpha.1", "n")
    alpha.open("c", "alpha.1", "m")
    alpha.delta("c", "alpha.1", "n", "late")  # queued after m's open: m's final may not pass it
    m_done = alpha.terminal("c", "alpha.1", "m", message_body("c", "m", ""))
    n_done = alpha.terminal("c", "alpha.1", "n", message_body("c", "n", "late"))
    frames = [json.loads(await done) for done in (m_done, n_done)]
    assert scripts == ["open", "open", "delta", "terminal", "terminal"]
    assert [(frame["id"], frame["offset"]) for frame in frames] == [("m", 1), ("n", 2)]
    await until(lambda: len(beta_seen.frames) == 3)
    kinds = [(kind.value, json.loads(text)["id"]) for _, kind, _, text in beta_seen.frames]
    assert kinds == [("d", "n"), ("t", "m"), ("t", "n")]


async def test_only_a_refused_claim_keeps_a_message_that_opened_from_being_published(
    two_brokers: tuple[Broker, Broker], redis_server: RedisServer
) -> None:
    alpha, beta = two_brokers
    # A claim that never reached Redis (its write failed in an outage) refuses nothing.
    frame = await alpha.terminal("c", "alpha.1", "m", message_body("c", "m", "x"), claimed=True)
    assert json.loads(frame)["text"] == "x"
    # A refused one is noted, for as long as a message's text lives, and refuses the rest.
    beta.open("c", "beta.1", "k")
    await beta.flush_writes()
    alpha.open("c", "alpha.1", "k")
    await alpha.flush_writes()
    async with _client(redis_server.url) as redis:
        ttl = await redis.ttl("tr:refused:alpha.1|k")
    assert 0 < ttl <= int(Settings().idle_timeout * 2)
    await beta.terminal("c", "beta.1", "k", message_body("c", "k", "beta's"), claimed=True)
    with pytest.raises(FrameRejected) as refused:
        await alpha.terminal("c", "alpha.1", "k", message_body("c", "k", "no"), claimed=True)
    assert refused.value.code is ErrorCode.ID_IN_USE


async def test_junk_subscribe_churn_over_a_real_socket_creates_no_key_per_channel(
    redis_server: RedisServer,
) -> None:
    running, relay = await start_relay(broker=redis_server.url, max_subscribes_per_second=1000)
    async with relay, _client(redis_server.url) as redis:
        async with running.connect("/subscribe?channel=early") as early:
            first = await recv_json(early)
            keys_before = {key async for key in redis.scan_iter("tr:*")}
            async with running.connect("/subscribe") as junk:
                for n in range(100):
                    await send_json(junk, {"type": "subscribe", "channel": f"junk-{n}"})
                    assert (await recv_json(junk))["type"] == "subscribed"
                    await send_json(junk, {"type": "unsubscribe", "channel": f"junk-{n}"})
                    assert (await recv_json(junk))["type"] == "unsubscribed"
            keys_after = {key async for key in redis.scan_iter("tr:*")}
            # No key per junk channel: their reserved epochs share one bounded hash.
            assert {key for key in keys_after - keys_before if b"junk" in key} == set()
            assert len(keys_after) <= len(keys_before) + 2
            assert await redis.hlen("tr:reserved") == 101
            # The epoch reserved for a channel before its first message is the one it keeps.
            async with running.connect("/produce?channel=early") as producer:
                await send_json(producer, {"id": "m", "delta": "hi", "final": True})
                assert (await recv_json(producer))["type"] == "ack"
            message = await recv_json(early)
            assert (message["epoch"], message["offset"]) == (first["epoch"], 1)
            assert await redis.hlen("tr:reserved") == 100
        # A subscriber that joined before it resumes with nothing missed.
        async with running.connect("/subscribe") as again:
            since = {"offset": 0, "epoch": first["epoch"]}
            await send_json(again, {"type": "subscribe", "channel": "early", "since": since})
            resumed = await recv_json(again)
            assert resumed["recovered"] is True
            assert (await recv_json(again))["text"] == "hi"


async def test_reserved_epochs_are_bounded_and_the_least_recently_subscribed_goes_first(
    two_brokers: tuple[Broker, Broker], redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    alpha, _ = two_brokers
    monkeypatch.setattr(catchup, "MAX_RESERVED_EPOCHS", 5)
    epochs = {n: (await alpha.catch_up(f"junk-{n}", None, False)).epoch for n in range(5)}
    await alpha.catch_up("junk-0", None, False)  # junk-0 is the most recent now
    for n in range(5, 8):
        await alpha.catch_up(f"junk-{n}", None, False)
    async with _client(redis_server.url) as redis:
        kept = sorted(key.decode() for key in await redis.hkeys("tr:reserved"))
        assert kept == ["junk-0", "junk-4", "junk-5", "junk-6", "junk-7"]
        order = [key.decode() for key in await redis.zrange("tr:reserved:at", 0, -1)]
        assert order == ["junk-4", "junk-0", "junk-5", "junk-6", "junk-7"]
    assert (await alpha.catch_up("junk-0", None, False)).epoch == epochs[0]
    assert (await alpha.catch_up("junk-1", None, False)).epoch != epochs[1]  # a new one


async def _channel_keys(redis: Redis) -> dict[str, set[str]]:
    """Each channel's epoch, offset, event number, history and held ids' keys in Redis."""
    kept: dict[str, set[str]] = {}
    for kind in ("epoch", "offset", "seq", "history", "held", "published"):
        async for name in redis.scan_iter(f"tr:{kind}:*"):
            kept.setdefault(name.decode().split(":", 2)[2], set()).add(kind)
    return kept


async def test_channels_past_max_history_channels_drop_the_least_recently_used(
    redis_server: RedisServer,
) -> None:
    broker = open_broker(Settings(broker=redis_server.url, max_history_channels=3), "alpha")
    await broker.start(Recorder())
    every = {"epoch", "offset", "seq", "history", "held", "published"}
    try:
        async with _client(redis_server.url) as redis:
            epochs = {}
            for channel in ("c0", "c1", "c2", "c0"):  # c0 is used again: c1 is the oldest
                frame = await broker.terminal(
                    channel,
                    "alpha.1",
                    f"m-{channel}-{len(epochs)}",
                    message_body(channel, "m", "t"),
                )
                epochs[channel] = json.loads(frame)["epoch"]
            assert await _channel_keys(redis) == {"c0": every, "c1": every, "c2": every}
            await broker.terminal("c3", "alpha.1", "m", message_body("c3", "m", "t"))
            assert await _channel_keys(redis) == {"c0": every, "c2": every, "c3": every}
            order = [name.decode() for name in await redis.zrange("tr:channels", 0, -1)]
            assert order == ["c2", "c0", "c3"]
            assert 0 < await redis.ttl("tr:channels") <= KEY_TTL
            # A channel with a subscriber on some process is passed over (c2 is the oldest),
            # and so is one with a message in progress (c0, the next).
            await broker.listen("c2", True, False)
            assert broker.open("c0", "alpha.1", "open")
            broker.delta("c0", "alpha.1", "open", "so far")
            await broker.flush_writes()  # type: ignore[attr-defined]
            await broker.terminal("c4", "alpha.1", "m", message_body("c4", "m", "t"))
            assert set(await _channel_keys(redis)) == {"c0", "c2", "c4"}
            order = [name.decode() for name in await redis.zrange("tr:channels", 0, -1)]
            assert order[-1] == "c4" and sorted(order) == ["c0", "c2", "c4"]
            # A dropped channel that comes back starts a new epoch, its offsets from 1.
            frame = json.loads(
                await broker.terminal("c1", "alpha.1", "again", message_body("c1", "again", "t"))
            )
            assert frame["epoch"] != epochs["c1"] and frame["offset"] == 1
            cut = await broker.catch_up("c1", (1, epochs["c1"]), False)
            assert cut.recovered is False
            # Churn through many channels: Redis keeps at most the bound, beyond the busy.
            for n in range(50):
                await broker.terminal(f"churn-{n}", "alpha.1", "m", message_body("x", "m", "t"))
            kept = await _channel_keys(redis)
            assert len(kept) <= 3 + 2 and {"c0", "c2"} <= set(kept)
            assert await redis.zcard("tr:channels") <= 3 + 2
            assert "churn-49" in kept and "churn-0" not in kept
    finally:
        await broker.close()


async def test_a_channel_subscribed_on_another_process_is_never_dropped(
    redis_server: RedisServer,
) -> None:
    settings = Settings(broker=redis_server.url, max_history_channels=2)
    alpha, beta = open_broker(settings, "alpha"), open_broker(settings, "beta")
    for broker in (alpha, beta):
        await broker.start(Recorder())
    try:
        await alpha.terminal("watched", "alpha.1", "m", message_body("watched", "m", "t"))
        await beta.listen("watched", True, False)  # a subscriber there, on the other process
        for n in range(6):
            await alpha.terminal(f"other-{n}", "alpha.1", "m", message_body("x", "m", "t"))
        async with _client(redis_server.url) as redis:
            kept = await _channel_keys(redis)
        assert "watched" in kept and "other-5" in kept and len(kept) <= 3
        # Once nobody listens there, it ages as any channel: passed over last as used then,
        # it goes within the next two new channels.
        await beta.listen("watched", False, False)
        for n in (6, 7):
            await alpha.terminal(f"other-{n}", "alpha.1", "m", message_body("x", "m", "t"))
        async with _client(redis_server.url) as redis:
            assert "watched" not in await _channel_keys(redis)
    finally:
        for broker in (alpha, beta):
            await broker.close()


async def test_a_producer_spraying_channel_names_leaves_redis_only_the_bound(
    redis_server: RedisServer,
) -> None:
    running, relay = await start_relay(broker=redis_server.url, max_history_channels=5)
    async with relay, _client(redis_server.url) as redis:
        async with (
            running.connect("/subscribe?channel=watched") as watched,
            running.connect("/produce?channel=watched") as producer,
        ):
            epoch = (await recv_json(watched))["epoch"]
            await send_json(producer, {"id": "w", "delta": "kept", "final": True})
            assert (await recv_json(producer))["type"] == "ack"
            assert (await recv_json(watched))["text"] == "kept"
            async with running.connect("/subscribe?channel=gone") as gone:
                gone_epoch = (await recv_json(gone))["epoch"]
                final = {"id": "g", "channel": "gone", "delta": "x", "final": True}
                await send_json(producer, final)
                assert (await recv_json(producer))["type"] == "ack"
                assert (await recv_json(gone))["offset"] == 1

            async def unheard() -> bool:
                return await _numsub(redis_server.url, "tr:m:gone") == 0

            await eventually(unheard, what="the process stopped listening to 'gone'")
            for n in range(40):
                event = {"id": f"s{n}", "channel": f"spray-{n}", "delta": "x", "final": True}
                await send_json(producer, event)
                assert (await recv_json(producer))["type"] == "ack"
            kept = await _channel_keys(redis)
            assert "watched" in kept and "gone" not in kept and len(kept) <= 5
        # The subscribed channel kept its history; the dropped one tells a resuming client.
        async with running.connect("/subscribe") as again:
            since = {"offset": 0, "epoch": epoch}
            await send_json(again, {"type": "subscribe", "channel": "watched", "since": since})
            assert (await recv_json(again))["recovered"] is True
            assert (await recv_json(again))["text"] == "kept"
            since = {"offset": 1, "epoch": gone_epoch}
            await send_json(again, {"type": "subscribe", "channel": "gone", "since": since})
            resumed = await recv_json(again)
            assert resumed["recovered"] is False and resumed["epoch"] != gone_epoch


async def test_held_ids_are_one_hash_per_channel_bounded_in_count_and_time(
    two_brokers: tuple[Broker, Broker], redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    alpha, beta = two_brokers
    monkeypatch.setattr(writes, "MAX_HELD_PER_CHANNEL", 3)
    for message_id in ("w", "x", "y"):
        await alpha.terminal("c", "alpha.1", message_id, message_body("c", message_id, ""))
    async with _client(redis_server.url) as redis:
        held = await redis.hgetall("tr:held:c")
        ttl = await redis.pttl("tr:held:c")
        assert sorted(held) == [b"w", b"x", b"y"]
        assert {value.partition(b"|")[2] for value in held.values()} == {b"alpha.1"}
        assert 0 < ttl <= Settings().id_hold * 1000
        # Where each was published, for its owner's script sent again: bounded alike.
        published = await redis.hgetall("tr:published:c")
        digest = {i: hashlib.sha1(message_body("c", i, "").encode()).hexdigest() for i in "wxyz"}
        assert published == {
            i.encode(): f"{n}|alpha.1|{digest[i]}".encode() for n, i in enumerate("wxy", 1)
        }
        assert 0 < await redis.pttl("tr:published:c") <= Settings().id_hold * 1000
        # A fourth id: past the cap, the channel's holds start again.
        await alpha.terminal("c", "alpha.1", "z", message_body("c", "z", ""))
        assert sorted(await redis.hkeys("tr:held:c")) == [b"z"]
        assert await redis.hgetall("tr:published:c") == {b"z": f"4|alpha.1|{digest['z']}".encode()}
    frame = await beta.terminal("c", "beta.1", "w", message_body("c", "w", "free"))
    assert json.loads(frame)["text"] == "free"
    with pytest.raises(FrameRejected):
        await beta.terminal("c", "beta.1", "z", message_body("c", "z", "held"))


async def test_an_owners_completed_ids_are_the_last_max_completed_per_producer(
    redis_server: RedisServer,
) -> None:
    broker = open_broker(Settings(broker=redis_server.url, max_completed_per_producer=3), "a")
    await broker.start(Recorder())
    try:
        for n in range(7):
            # m4 completed twice (another text, so published again): listed once more.
            message_id, text = ("m4", "again") if n == 5 else (f"m{n}", "")
            broker.open("c", "a.1", message_id)
            await broker.terminal("c", "a.1", message_id, message_body("c", message_id, text))
        async with _client(redis_server.url) as redis:
            assert await redis.lrange("tr:dl:a.1", 0, -1) == [b"m6", b"m4", b"m4"]
            assert sorted(await redis.hkeys("tr:done:a.1")) == [b"m4", b"m6"]
            assert await redis.ttl("tr:dl:a.1") > 0 and await redis.ttl("tr:done:a.1") > 0
    finally:
        await broker.close()


async def test_a_session_taken_over_keeps_the_holds_of_the_ids_it_ended(
    two_brokers: tuple[Broker, Broker],
) -> None:
    alpha, beta = two_brokers
    await alpha.save_session("token", "alpha.1", "grant")
    first = await alpha.terminal("c", "alpha.1", "m", message_body("c", "m", "mine"))
    assert await beta.take_session("token", "grant", "beta.1") is not None
    # Its final sent again through the new owner (the reply to the old one lost on its way):
    # the frame as published, and nothing published again.
    assert await beta.terminal("c", "beta.1", "m", message_body("c", "m", "mine")) == first
    # The session's new owner may use its id; another owner may not.
    frame = await beta.terminal("c", "beta.1", "m", message_body("c", "m", "again"))
    assert json.loads(frame)["text"] == "again"
    assert json.loads(frame)["offset"] == json.loads(first)["offset"] + 1
    with pytest.raises(FrameRejected):
        await alpha.terminal("c", "alpha.2", "m", message_body("c", "m", "not yours"))


async def test_a_chat_request_reaches_the_producer_on_another_process(
    two_brokers: tuple[Broker, Broker],
) -> None:
    alpha, beta = two_brokers
    taker = recorder_of(alpha)
    taker.taking["alpha.1"] = None
    await alpha.take_requests("chat", "alpha.1", True)
    frame = json.dumps({"type": "request", "channel": "chat|odd 🚀", "id": "r"})
    assert await beta.hand_request("chat", frame) is None
    assert taker.requests == [("alpha.1", "chat", frame)]
    # What the other process says comes back: not reading, or gone meanwhile.
    taker.taking["alpha.1"] = ErrorCode.PRODUCER_BUSY
    assert await beta.hand_request("chat", frame) is ErrorCode.PRODUCER_BUSY
    del taker.taking["alpha.1"]
    assert await beta.hand_request("chat", frame) is ErrorCode.NO_PRODUCER
    # A channel name holding the note's separators reaches the right channel.
    taker.taking["alpha.2"] = None
    await alpha.take_requests("a|b|3|c", "alpha.2", True)
    assert await beta.hand_request("a|b|3|c", "{}") is None
    assert taker.requests[-1] == ("alpha.2", "a|b|3|c", "{}")


async def test_a_gone_process_is_passed_over_and_its_registrations_reaped(
    redis_server: RedisServer,
) -> None:
    settings = Settings(broker=redis_server.url, lease_seconds=0.3, session_grace=0.2)
    brokers = {name: open_broker(settings, name) for name in ("alpha", "beta", "gamma")}
    recorders = {name: Recorder() for name in brokers}
    for name, broker in brokers.items():
        await broker.start(recorders[name])
    alpha, beta, gamma = brokers.values()
    try:
        recorders["alpha"].taking["alpha.1"] = None
        await alpha.take_requests("chat", "alpha.1", True)
        await gamma.take_requests("chat", "gamma.1", True)  # the newest
        await gamma.take_requests("elsewhere", "gamma.2", True)
        await gamma.close()  # gone without a word: its inbox has no reader
        assert await beta.hand_request("chat", "{}") is None
        assert recorders["alpha"].requests == [("alpha.1", "chat", "{}")]
        async with _client(redis_server.url) as redis:
            assert await redis.zrange("tr:q:chat", 0, -1) == [b"alpha.1"]
            # Once its lease has lapsed, another process removes what it registered.
            await eventually(lambda: _gone(redis, "tr:q:elsewhere", "tr:qc:gamma"), 10)
            assert await redis.smembers("tr:qc:alpha") == {b"chat"}
    finally:
        for name in ("alpha", "beta"):
            await brokers[name].close()


async def _gone(redis: Redis, *keys: str) -> bool:
    return not await redis.exists(*keys)


async def test_registrations_are_made_again_after_redis_restarts_empty(
    two_brokers: tuple[Broker, Broker], redis_server: RedisServer
) -> None:
    alpha, beta = two_brokers
    recorder_of(alpha).taking["alpha.1"] = None
    await alpha.take_requests("chat", "alpha.1", True)
    redis_server.kill()
    await until(lambda: not alpha.healthy and not beta.healthy, 5)
    with pytest.raises(BrokerUnavailable):
        await beta.hand_request("chat", "{}")
    redis_server.start()  # empty: it keeps nothing on disk
    await until(lambda: alpha.healthy and beta.healthy, 6)

    async def handed() -> bool:
        with contextlib.suppress(BrokerUnavailable):
            return await beta.hand_request("chat", "{}") is None
        return False

    await eventually(handed, 10)
    assert recorder_of(alpha).requests[-1] == ("alpha.1", "chat", "{}")
