"""One contract, every broker: the same scenarios against memory:// and a real Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from token_relay.brokers import Broker, CatchUp, FrameKind, LiveMessage, open_broker
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.events import Delta
from token_relay.core.protocol import (
    Aborted,
    AbortReason,
    MessageFrame,
    encode,
    encode_unpositioned,
)
from token_relay.core.settings import Settings

from ..harness import RedisServer


class Recorder:
    """A listener that records what the broker hands it."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, FrameKind, int, str]] = []
        self.cancels: list[tuple[str, str]] = []
        self.texts: dict[tuple[str, str], str] = {}
        self.restored = 0
        self.refused: list[tuple[str, str, str]] = []
        self.moved: list[str] = []
        self.requests: list[tuple[str, str, str]] = []
        self.taking: dict[str, ErrorCode | None] = {}
        """The owners that take chat requests here, and what handing one to each says."""

    def on_frame(self, channel: str, kind: FrameKind, seq: int, payload: str | bytes) -> None:
        text = payload.decode() if isinstance(payload, bytes) else payload
        self.frames.append((channel, kind, seq, text))

    def on_delta(self, channel: str, seq: int, delta: Delta) -> None:
        self.frames.append((channel, FrameKind.DELTA, seq, delta.render().decode()))

    def on_claim_refused(self, channel: str, owner: str, message_id: str) -> None:
        self.refused.append((channel, owner, message_id))

    def on_cancel(self, owner: str, payload: str | bytes) -> None:
        self.cancels.append((owner, payload.decode() if isinstance(payload, bytes) else payload))

    def partial(self, owner: str, message_id: str) -> str | None:
        return self.texts.get((owner, message_id))

    def live_parts(self, owner: str, message_id: str) -> tuple[str, list[dict[str, Any]]] | None:
        return None  # no structured message in progress here

    def wants_deltas(self, channel: str) -> bool:
        return True

    def owned_messages(self) -> list[tuple[str, str, str]]:
        return []

    def on_restored(self) -> None:
        self.restored += 1

    def on_session_moved(self, owner: str) -> None:
        self.moved.append(owner)

    def on_request(self, owner: str, channel: str, payload: str | bytes) -> ErrorCode | None:
        code = self.taking.get(owner, ErrorCode.NO_PRODUCER)
        if code is None:
            text = payload.decode() if isinstance(payload, bytes) else payload
            self.requests.append((owner, channel, text))
        return code


async def until(condition: Callable[[], Any], wait: float = 5.0) -> None:
    """Wait for ``condition`` to hold (events from Redis arrive asynchronously)."""
    async with asyncio.timeout(wait):
        while not condition():  # noqa: ASYNC110 - polls state fed by the broker
            await asyncio.sleep(0.005)


@pytest.fixture(params=["memory", "redis"])
async def broker(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Broker]:
    redis: RedisServer | None = None
    url = "memory://"
    if request.param == "redis":
        redis = RedisServer(tmp_path)
        redis.start()
        url = redis.url
    marker = request.node.get_closest_marker("id_hold")
    hold = Settings().id_hold if marker is None else marker.args[0]
    instance = open_broker(Settings(broker=url, history_size=3, id_hold=hold), "inst")
    recorder = Recorder()
    await instance.start(recorder)
    instance.recorder = recorder  # type: ignore[attr-defined]
    try:
        yield instance
    finally:
        await instance.close()
        if redis is not None:
            redis.kill()


def recorder_of(broker: Broker) -> Recorder:
    recorder: Recorder = broker.recorder  # type: ignore[attr-defined]
    return recorder


def message_body(channel: str, message_id: str, text: str) -> str:
    frame = MessageFrame(channel=channel, id=message_id, text=text, offset=0, epoch="")
    return encode_unpositioned(frame)


async def test_terminal_frames_get_increasing_offsets_in_one_epoch(broker: Broker) -> None:
    text = 'quotes " and \\ backslashes, émoji 🚀, newline\n'
    frames = [
        await broker.terminal("c", "inst.1", f"m{i}", message_body("c", f"m{i}", text))
        for i in range(3)
    ]
    cut = await broker.catch_up("c", None, False)
    assert (cut.offset, cut.recovered) == (3, None)
    for offset, frame in enumerate(frames, start=1):
        expected = MessageFrame(
            channel="c", id=f"m{offset - 1}", text=text, offset=offset, epoch=cut.epoch
        )
        assert frame == encode(expected)


async def test_aborted_frames_share_the_offset_sequence(broker: Broker) -> None:
    await broker.terminal("c", "inst.1", "a", message_body("c", "a", "x"))
    body = encode_unpositioned(
        Aborted(
            channel="c", id="b", text="half", reason=AbortReason.IDLE_TIMEOUT, offset=0, epoch=""
        )
    )
    frame = await broker.terminal("c", "inst.1", "b", body)
    cut = await broker.catch_up("c", None, False)
    assert frame == encode(
        Aborted(
            channel="c",
            id="b",
            text="half",
            reason=AbortReason.IDLE_TIMEOUT,
            offset=2,
            epoch=cut.epoch,
        )
    )


async def test_listened_events_reach_the_listener_in_order(broker: Broker) -> None:
    recorder = recorder_of(broker)
    await broker.listen("c", True, True)
    broker.open("c", "inst.1", "m")
    for delta in ["a", "b", "c"]:
        broker.delta("c", "inst.1", "m", delta)
    await broker.terminal("c", "inst.1", "m", message_body("c", "m", "abc"))
    await until(lambda: any(kind is FrameKind.TERMINAL for _, kind, _, _ in recorder.frames))
    kinds = [(kind, payload) for _, kind, _, payload in recorder.frames]
    # Every delta, in order, before the terminal frame; a broker may join a message's
    # deltas that were written together into fewer frames (Redis does, per write batch).
    deltas = [json.loads(payload) for kind, payload in kinds[:-1]]
    assert all(kind is FrameKind.DELTA for kind, _ in kinds[:-1]) and 1 <= len(deltas) <= 3
    assert all(d == {"type": "delta", "channel": "c", "id": "m", "delta": d["delta"]}
               for d in deltas)  # fmt: skip
    assert "".join(d["delta"] for d in deltas) == "abc"
    assert kinds[-1][0] is FrameKind.TERMINAL and '"text":"abc"' in kinds[-1][1]
    if not broker.shares_sessions:  # in process: each delta is its own frame
        assert [d["delta"] for d in deltas] == ["a", "b", "c"]
    seqs = [seq for _, _, seq, _ in recorder.frames]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(recorder.frames)
    assert {channel for channel, _, _, _ in recorder.frames} == {"c"}


async def test_catch_up_replays_exactly_the_missed_frames(broker: Broker) -> None:
    first = await broker.catch_up("c", None, False)
    frames = [
        await broker.terminal("c", "inst.1", f"m{i}", message_body("c", f"m{i}", "t"))
        for i in range(3)
    ]
    cut = await broker.catch_up("c", (1, first.epoch), False)
    assert (cut.recovered, cut.frames, cut.offset, cut.epoch) == (True, frames[1:], 3, first.epoch)
    current = await broker.catch_up("c", (3, first.epoch), False)
    assert (current.recovered, current.frames) == (True, [])


@pytest.mark.parametrize("since", [(0, "some-other-epoch"), (99, None)])
async def test_catch_up_refuses_a_wrong_epoch_or_a_future_offset(
    broker: Broker, since: tuple[int, str | None]
) -> None:
    await broker.terminal("c", "inst.1", "m", message_body("c", "m", "t"))
    epoch = (await broker.catch_up("c", None, False)).epoch
    cut = await broker.catch_up("c", (since[0], since[1] or epoch), False)
    assert (cut.recovered, cut.frames, cut.offset, cut.epoch) == (False, [], 1, epoch)


async def test_catch_up_refuses_a_gap_older_than_history(broker: Broker) -> None:
    epoch = (await broker.catch_up("c", None, False)).epoch
    for i in range(5):  # history_size is 3
        await broker.terminal("c", "inst.1", f"m{i}", message_body("c", f"m{i}", "t"))
    assert (await broker.catch_up("c", (1, epoch), False)).recovered is False
    kept = await broker.catch_up("c", (2, epoch), False)
    assert kept.recovered is True and len(kept.frames) == 3


async def test_catch_up_rewinds_the_last_frames_in_order(broker: Broker) -> None:
    assert (await broker.catch_up("c", None, False, rewind=2)).frames == []
    frames = [
        await broker.terminal("c", "inst.1", f"m{i}", message_body("c", f"m{i}", "t"))
        for i in range(5)  # history_size is 3
    ]
    cut = await broker.catch_up("c", None, False, rewind=2)
    assert (cut.frames, cut.offset, cut.recovered) == (frames[3:], 5, None)
    assert (await broker.catch_up("c", None, False, rewind=10)).frames == frames[2:]
    # since wins over rewind
    since = await broker.catch_up("c", (4, cut.epoch), False, rewind=3)
    assert (since.recovered, since.frames) == (True, frames[4:])


async def test_catch_up_lists_messages_in_progress_with_their_text(broker: Broker) -> None:
    recorder = recorder_of(broker)
    broker.open("c", "inst.1", "m")
    broker.open("c", "inst.2", "k")
    for owner, message_id, delta in [
        ("inst.1", "m", "ab"),
        ("inst.2", "k", "x"),
        ("inst.1", "m", "c"),
    ]:
        key = (owner, message_id)
        recorder.texts[key] = recorder.texts.get(key, "") + delta
        broker.delta("c", owner, message_id, delta)
    broker.open("other", "inst.1", "n")
    recorder.texts[("inst.1", "n")] = ""

    async def live() -> CatchUp:
        return await broker.catch_up("c", None, True)

    await until(lambda: True)
    cut = await _eventually(
        live, lambda cut: len(cut.live) == 2 and {m.text for m in cut.live} == {"abc", "x"}
    )
    assert sorted(cut.live, key=lambda m: m.owner) == [
        LiveMessage("inst.1", "m", "abc"),
        LiveMessage("inst.2", "k", "x"),
    ]
    await broker.terminal("c", "inst.1", "m", message_body("c", "m", "abc"))
    after = await broker.catch_up("c", None, True)
    assert after.live == [LiveMessage("inst.2", "k", "x")]
    assert (await broker.catch_up("c", None, False)).live == []


async def _eventually(
    read: Callable[[], Any], good: Callable[[Any], bool], wait: float = 5.0
) -> Any:
    async with asyncio.timeout(wait):
        while True:
            value = await read()
            if good(value):
                return value
            await asyncio.sleep(0.01)


async def test_catch_up_seq_covers_every_event_already_delivered(broker: Broker) -> None:
    recorder = recorder_of(broker)
    await broker.listen("c", True, True)
    broker.open("c", "inst.1", "m")
    broker.delta("c", "inst.1", "m", "a")
    await broker.terminal("c", "inst.1", "m", message_body("c", "m", "a"))
    await until(lambda: len(recorder.frames) == 2)
    cut = await broker.catch_up("c", None, True)
    assert cut.seq >= max(seq for _, _, seq, _ in recorder.frames)
    broker.open("c", "inst.1", "n")
    broker.delta("c", "inst.1", "n", "b")
    await until(lambda: len(recorder.frames) == 3)
    assert recorder.frames[-1][2] > cut.seq


async def test_cancel_reaches_every_owner_of_the_message(broker: Broker) -> None:
    recorder = recorder_of(broker)
    owner = f"{broker.instance}.7"
    broker.open("c", owner, "m")
    broker.open("c", f"{broker.instance}.8", "other")
    recorder.texts[(owner, "m")] = ""
    recorder.texts[(f"{broker.instance}.8", "other")] = ""
    await _eventually(lambda: broker.catch_up("c", None, True), lambda cut: len(cut.live) == 2)
    assert await broker.cancel("c", "m", '{"type":"cancel"}') == 1
    await until(lambda: recorder.cancels)
    assert recorder.cancels == [(owner, '{"type":"cancel"}')]
    assert await broker.cancel("c", "nope", "{}") == 0
    assert await broker.cancel("elsewhere", "m", "{}") == 0


async def test_broker_is_healthy_and_ready(broker: Broker) -> None:
    assert broker.healthy is True
    assert await broker.ready() is True


@pytest.mark.id_hold(0)
async def test_one_live_owner_per_id_in_a_channel(broker: Broker) -> None:
    recorder = recorder_of(broker)
    await broker.listen("c", True, True)
    assert broker.open("c", "inst.1", "m") is True
    recorder.texts[("inst.1", "m")] = "mine"
    broker.delta("c", "inst.1", "m", "mine")
    claimed = broker.open("c", "inst.2", "m")
    if claimed:  # settled later, in order with the deltas (Redis)
        await until(lambda: recorder.refused == [("c", "inst.2", "m")])
    else:
        assert recorder.refused == []
    broker.delta("c", "inst.2", "m", "theirs")  # dropped: not the holder
    broker.open("d", "inst.2", "m")  # another channel: free
    with pytest.raises(FrameRejected) as refused:
        await broker.terminal("c", "inst.2", "m", message_body("c", "m", "theirs"))
    assert refused.value.code is ErrorCode.ID_IN_USE
    await broker.terminal("c", "inst.1", "m", message_body("c", "m", "mine"))
    await until(lambda: any(kind is FrameKind.TERMINAL for _, kind, _, _ in recorder.frames))
    deltas = [frame for _, kind, _, frame in recorder.frames if kind is FrameKind.DELTA]
    assert [json.loads(frame)["delta"] for frame in deltas] == ["mine"]
    # Released with its terminal frame: the id is free again.
    assert broker.open("c", "inst.2", "m") is True


@pytest.mark.id_hold(0)
async def test_a_refused_claim_publishes_nothing_even_once_the_holder_is_done(
    broker: Broker,
) -> None:
    recorder = recorder_of(broker)
    await broker.listen("c", True, True)
    broker.open("c", "inst.1", "m")
    broker.delta("c", "inst.1", "m", "mine")
    broker.open("c", "inst.2", "m")  # refused (Redis: reported later)
    broker.delta("c", "inst.2", "m", "theirs")
    await broker.terminal("c", "inst.1", "m", message_body("c", "m", "mine"), claimed=True)
    # The holder is done and the id is free, but the refused message never held it: its
    # delta and its final (written before its producer heard of the refusal) are dropped.
    broker.delta("c", "inst.2", "m", " still theirs")
    with pytest.raises(FrameRejected) as refused:
        await broker.terminal("c", "inst.2", "m", message_body("c", "m", "x"), claimed=True)
    assert refused.value.code is ErrorCode.ID_IN_USE
    with pytest.raises(FrameRejected):
        await broker.terminal(
            "c", "inst.2", "m", message_body("c", "m", "x"), aborted=True, claimed=True
        )
    # A one-shot message (it never claimed the id) is published once nobody holds it.
    broker.delta("c", "inst.3", "m", "shot", claimed=False)
    await broker.terminal("c", "inst.3", "m", message_body("c", "m", "shot"))
    await broker.flush()
    await until(lambda: len([f for f in recorder.frames if f[1] is FrameKind.TERMINAL]) == 2)
    texts = [
        json.loads(frame).get("text", json.loads(frame).get("delta"))
        for _, _, _, frame in recorder.frames
    ]
    assert texts == ["mine", "mine", "shot", "shot"]


def terminal_texts(recorder: Recorder) -> list[tuple[str, str, str]]:
    """(channel, id, text or abort reason) of every terminal frame the listener got."""
    frames = [json.loads(f) for _, kind, _, f in recorder.frames if kind is FrameKind.TERMINAL]
    return [(f["channel"], f["id"], f.get("reason", f["text"])) for f in frames]


async def test_an_ended_id_is_held_for_its_owner(broker: Broker) -> None:
    """Within --id-hold after a message under an id completed, another owner's message under
    it is refused whole; its owner's and another channel's are not, nor an aborted id."""
    recorder = recorder_of(broker)
    for channel in ("c", "d"):
        await broker.listen(channel, True, True)
    broker.open("c", "inst.1", "m")
    broker.delta("c", "inst.1", "m", "mine")
    await broker.terminal("c", "inst.1", "m", message_body("c", "m", "mine"), claimed=True)
    # Another owner opens the id after the end: refused, and nothing of its message lands.
    if broker.open("c", "inst.2", "m"):  # settled later, in order with the deltas (Redis)
        await until(lambda: recorder.refused == [("c", "inst.2", "m")])
    broker.delta("c", "inst.2", "m", "theirs")
    with pytest.raises(FrameRejected) as refused:
        await broker.terminal("c", "inst.2", "m", message_body("c", "m", "theirs"), claimed=True)
    assert refused.value.code is ErrorCode.ID_IN_USE
    # A one-shot message of a third owner (its delta and final at once): refused too.
    broker.delta("c", "inst.3", "m", "shot", claimed=False)
    with pytest.raises(FrameRejected) as refused:
        await broker.terminal("c", "inst.3", "m", message_body("c", "m", "shot"))
    assert refused.value.code is ErrorCode.ID_IN_USE
    # The same id on another channel is another message.
    assert broker.open("d", "inst.2", "m") is True
    await broker.terminal("d", "inst.2", "m", message_body("d", "m", "other"), claimed=True)
    # An aborted message's id is not held: another owner may send it again whole.
    broker.open("c", "inst.1", "n")
    abort = encode_unpositioned(
        Aborted(channel="c", id="n", reason=AbortReason.IDLE_TIMEOUT, text="", offset=0, epoch="")
    )
    await broker.terminal("c", "inst.1", "n", abort, aborted=True, claimed=True)
    assert broker.open("c", "inst.2", "n") is True
    sent = await broker.terminal("c", "inst.2", "n", message_body("c", "n", "sent"), claimed=True)
    assert json.loads(sent)["text"] == "sent"
    # Its owner may use the id again: nothing of its own is refused.
    assert broker.open("c", "inst.1", "m") is True
    broker.delta("c", "inst.1", "m", "again")
    await broker.terminal("c", "inst.1", "m", message_body("c", "m", "again"), claimed=True)
    await broker.flush()
    await until(lambda: len(terminal_texts(recorder)) == 5)
    assert terminal_texts(recorder) == [
        ("c", "m", "mine"),
        ("d", "m", "other"),
        ("c", "n", "idle_timeout"),
        ("c", "n", "sent"),
        ("c", "m", "again"),
    ]
    deltas = [json.loads(f) for _, kind, _, f in recorder.frames if kind is FrameKind.DELTA]
    assert [(d["channel"], d["delta"]) for d in deltas] == [("c", "mine"), ("c", "again")]
    # Redis reports the refusal; memory answers at once.
    assert recorder.refused in ([], [("c", "inst.2", "m")])


async def test_a_whole_message_is_published_as_its_delta_and_final(broker: Broker) -> None:
    """A one-shot message (``whole``): its text as one delta, then its terminal frame, in
    order with the channel's other events; an empty text has no delta. It is refused
    (``id_in_use``, nothing of it published) while another owner's message holds the id,
    and its id is then held for its owner as any completed message's."""
    recorder = recorder_of(broker)
    await broker.listen("c", True, True)
    published = broker.whole("c", "inst.1", "m", "hi", message_body("c", "m", "hi"))
    assert published is not None
    frame = await published
    assert json.loads(frame)["text"] == "hi" and json.loads(frame)["offset"] == 1
    empty = broker.whole("c", "inst.2", "e", "", message_body("c", "e", ""))
    assert empty is not None and json.loads(await empty)["text"] == ""
    # Another owner's message in progress holds "n": the one-shot one is refused whole.
    assert broker.open("c", "inst.3", "n") is True
    broker.delta("c", "inst.3", "n", "x")
    refused = broker.whole("c", "inst.4", "n", "shot", message_body("c", "n", "shot"))
    assert refused is not None
    with pytest.raises(FrameRejected) as rejected:
        await refused
    assert rejected.value.code is ErrorCode.ID_IN_USE
    # "m" is held for its owner: another owner's one-shot message under it is refused.
    again = broker.whole("c", "inst.5", "m", "late", message_body("c", "m", "late"))
    assert again is not None
    with pytest.raises(FrameRejected):
        await again
    await broker.terminal("c", "inst.3", "n", message_body("c", "n", "x"), claimed=True)
    await broker.flush()
    await until(lambda: len(terminal_texts(recorder)) == 3)
    assert terminal_texts(recorder) == [("c", "m", "hi"), ("c", "e", ""), ("c", "n", "x")]
    events = [(kind, json.loads(f)) for _, kind, _, f in recorder.frames]
    assert [(k, f.get("delta", f.get("text"))) for k, f in events] == [
        (FrameKind.DELTA, "hi"),
        (FrameKind.TERMINAL, "hi"),
        (FrameKind.TERMINAL, ""),
        (FrameKind.DELTA, "x"),
        (FrameKind.TERMINAL, "x"),
    ]
    seqs = [seq for _, _, seq, _ in recorder.frames]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_a_whole_message_sent_again_by_another_owner_is_answered_as_the_first(
    broker: Broker,
) -> None:
    """Within the hold, the same whole message under an id from another owner (a one-shot
    post retried after its answer was lost: a new producer) is answered with the frame as it
    was published, and nothing of it is published again; other text is refused, and so is
    the same text from a message that opened (claimed, also with its open and deltas handed
    over with its final), or while the id is in progress."""
    recorder = recorder_of(broker)
    await broker.listen("c", True, True)
    body = message_body("c", "m", "hi")
    first = broker.whole("c", "inst.1", "m", "hi", body)
    assert first is not None
    frame = await first
    copy = broker.whole("c", "inst.2", "m", "hi", body)
    assert copy is not None
    assert await copy == frame
    # The general path's one-shot: a final that opened its message, nothing claimed.
    assert await broker.terminal("c", "inst.3", "m", body) == frame
    for text, claimed in (("hI", False), ("hi", True)):
        with pytest.raises(FrameRejected) as refused:
            await broker.terminal("c", "inst.4", "m", message_body("c", "m", text), claimed=claimed)
        assert refused.value.code is ErrorCode.ID_IN_USE
    # The same text from a message that opened with a delta of its own, its open, delta
    # and final handed over together (on Redis, one script): refused too.
    if broker.open("c", "inst.6", "m"):  # Redis: the claim is settled with the final
        broker.delta("c", "inst.6", "m", "hi")
        with pytest.raises(FrameRejected) as refused:
            await broker.terminal("c", "inst.6", "m", body, claimed=True)
        assert refused.value.code is ErrorCode.ID_IN_USE
    else:  # memory: refused at once
        assert broker.shares_sessions is False
    # Its owner opens the id again: while that message is in progress, no copy is taken.
    assert broker.open("c", "inst.1", "m") is True
    held = broker.whole("c", "inst.5", "m", "hi", body)
    assert held is not None
    with pytest.raises(FrameRejected) as refused:
        await held
    assert refused.value.code is ErrorCode.ID_IN_USE
    await broker.terminal("c", "inst.1", "m", message_body("c", "m", "two"), claimed=True)
    await broker.flush()
    await until(lambda: len(terminal_texts(recorder)) == 2)
    events = [(kind, json.loads(f)) for _, kind, _, f in recorder.frames]
    assert [(k, f.get("delta", f.get("text"))) for k, f in events] == [
        (FrameKind.DELTA, "hi"),
        (FrameKind.TERMINAL, "hi"),
        (FrameKind.TERMINAL, "two"),
    ]
    cut = await broker.catch_up("c", None, live=False, rewind=10)
    assert [json.loads(f)["text"] for f in cut.frames] == ["hi", "two"]
    assert cut.frames[0] == frame


@pytest.mark.id_hold(0.2)
async def test_a_held_id_is_free_once_the_hold_ends(broker: Broker) -> None:
    recorder = recorder_of(broker)
    await broker.listen("c", True, True)
    await broker.terminal("c", "inst.1", "m", message_body("c", "m", "first"))
    await asyncio.sleep(0.3)  # the rule under test is a time: the hold has ended
    assert broker.open("c", "inst.2", "m") is True
    await broker.terminal("c", "inst.2", "m", message_body("c", "m", "second"), claimed=True)
    await until(lambda: len(terminal_texts(recorder)) == 2)
    assert terminal_texts(recorder) == [("c", "m", "first"), ("c", "m", "second")]
    assert recorder.refused == []


async def test_subscribing_creates_no_durable_channel_state(broker: Broker) -> None:
    await broker.terminal("real", "inst.1", "m", message_body("real", "m", "t"))
    epoch = (await broker.catch_up("real", None, False)).epoch
    for n in range(300):
        cut = await broker.catch_up(f"junk-{n}", None, True)
        assert cut.offset == 0
    history = getattr(broker, "history", None)
    if history is not None:  # memory: one log, the real channel's
        assert len(history) == 1
    else:  # Redis: a junk channel's reserved epoch expires soon, and has no key of its own
        redis = broker._connections.client()  # type: ignore[attr-defined]
        assert [key async for key in redis.scan_iter("tr:*junk-*")] == []
        assert await redis.hlen("tr:reserved") == 300
        assert 0 < await redis.ttl("tr:reserved") <= 600
    cut = await broker.catch_up("real", (1, epoch), False)
    assert (cut.recovered, cut.epoch) == (True, epoch)


async def test_a_chat_request_goes_to_the_newest_producer_that_takes_the_channel(
    broker: Broker,
) -> None:
    recorder = recorder_of(broker)
    older, newer = f"{broker.instance}.1", f"{broker.instance}.2"
    assert await broker.hand_request("chat", '{"n":0}') is ErrorCode.NO_PRODUCER
    recorder.taking.update({older: None, newer: None})
    await broker.take_requests("chat", older, True)
    await broker.take_requests("chat", newer, True)
    await broker.take_requests("other", f"{broker.instance}.3", True)
    assert await broker.hand_request("chat", '{"n":1}') is None
    await broker.take_requests("chat", newer, False)
    assert await broker.hand_request("chat", '{"n":2}') is None
    assert recorder.requests == [(newer, "chat", '{"n":1}'), (older, "chat", '{"n":2}')]
    # Registered again, it is the newest again.
    await broker.take_requests("chat", newer, True)
    recorder.taking[newer] = ErrorCode.PRODUCER_BUSY
    assert await broker.hand_request("chat", '{"n":3}') is ErrorCode.PRODUCER_BUSY
    # One that is registered but gone (it disconnected meanwhile) is passed over.
    del recorder.taking[newer]
    assert await broker.hand_request("chat", '{"n":4}') is None
    assert recorder.requests[-1] == (older, "chat", '{"n":4}')
    await broker.take_requests("chat", older, False)
    await broker.take_requests("chat", newer, False)
    assert await broker.hand_request("chat", '{"n":5}') is ErrorCode.NO_PRODUCER
