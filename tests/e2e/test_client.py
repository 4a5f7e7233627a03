"""The Python client library against the real relay, through a proxy that cuts connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from token_relay.client import MessageFailed, RelayProducer, RelaySubscriber
from token_relay.core.errors import HandshakeRefused, UsageError
from token_relay.core.protocol import Aborted, DeltaFrame, MessageFrame, ProducerEvent, Subscribed
from websockets.asyncio.client import ClientConnection, connect

from ..conftest import RunningRelay, recv_core, recv_json, send_json, start_relay
from ..harness import Balancer, FrameLimitProxy, Proxy, eventually, relay_process


def _port(running: RunningRelay) -> int:
    return int(running.url.rsplit(":", 1)[1])


@contextlib.asynccontextmanager
async def _behind_proxy(
    session_grace: float, backoff: float, broker: str = "memory://", **settings: Any
) -> AsyncIterator[tuple[Proxy, ClientConnection, RelayProducer]]:
    """A relay keeping producer sessions ``session_grace`` seconds after their connection
    drops (and any other ``settings``), a subscriber of channel ``c`` (past its
    ``subscribed``), and a ``RelayProducer`` behind a proxy, which comes back ``backoff``
    seconds after a cut."""
    running, relay = await start_relay(session_grace=session_grace, broker=broker, **settings)
    async with (
        relay,
        Proxy(_port(running)) as proxy,
        running.connect("/subscribe?channel=c") as sub,
        RelayProducer(proxy.url, channel="c", backoff=(backoff, backoff)) as producer,
    ):
        await recv_json(sub)
        yield proxy, sub, producer


def _lapsing(
    broker: str = "memory://",
) -> contextlib.AbstractAsyncContextManager[tuple[Proxy, ClientConnection, RelayProducer]]:
    """:func:`_behind_proxy` with sessions that lapse 0.2 s after a drop, and a producer
    back 0.6 s after a cut: with a session of its own, another owner."""
    return _behind_proxy(0.2, 0.6, broker)


async def test_producer_survives_cuts_mid_message_with_exact_text_once() -> None:
    running, relay = await start_relay(session_grace=10)
    tokens = [f"tok{n:03d} " for n in range(300)]
    async with (
        relay,
        Proxy(_port(running)) as proxy,
        running.connect("/subscribe?channel=c&deltas=1") as sub,
        RelayProducer(proxy.url, channel="c") as producer,
    ):
        await recv_json(sub)
        first_session = producer.session
        for n, token in enumerate(tokens):
            await producer.send("long", token)
            if n in (50, 120, 200):
                await asyncio.sleep(0.02)
                assert proxy.cut() == 1
            await asyncio.sleep(0.001)
        ack = await asyncio.wait_for(producer.finish("long"), 15)
        assert (ack.id, ack.channel) == ("long", "c")
        assert producer.reconnects >= 3 and producer.session == first_session
        deltas: list[str] = []
        while (frame := await recv_json(sub))["type"] == "delta":
            deltas.append(frame["delta"])
        assert frame["type"] == "message" and frame["text"] == "".join(tokens)
        assert deltas == tokens  # each delta exactly once, in order; no abort


async def test_producer_streams_several_messages_and_hears_cancels(relay: RunningRelay) -> None:
    async with (
        relay.connect("/subscribe?channel=c") as sub,
        RelayProducer(relay.url, channel="c") as producer,
    ):
        await recv_json(sub)
        await producer.send("a", "alpha")
        await producer.send("b", "beta")
        await sub.send('{"type": "cancel", "channel": "c", "id": "b"}')
        cancels = producer.cancellations()
        cancel = await asyncio.wait_for(anext(cancels), 5)
        assert (cancel.channel, cancel.id) == ("c", "b")
        await producer.finish("b")
        await producer.finish("a")
        texts = {(await recv_json(sub))["id"]: None for _ in range(2)}
        assert set(texts) == {"a", "b"}


async def test_producer_sends_chunks_across_cuts_and_the_parts_arrive_exact_once() -> None:
    running, relay = await start_relay(session_grace=10)
    chunks: list[dict[str, Any]] = [
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "r"},
        *({"type": "reasoning-delta", "id": "r", "delta": f"r{n} "} for n in range(40)),
        {"type": "reasoning-end", "id": "r"},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "weather"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"city": "Paris"}'},
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "weather",
         "input": {"city": "Paris"}},
        {"type": "tool-output-available", "toolCallId": "c1", "output": {"celsius": 21}},
    ]  # fmt: skip
    async with (
        relay,
        Proxy(_port(running)) as proxy,
        running.connect("/subscribe?channel=c") as sub,
        RelayProducer(proxy.url, channel="c") as producer,
    ):
        await recv_json(sub)
        for n, chunk in enumerate(chunks):
            await producer.send_chunk("s", chunk)
            if n in (10, 30):
                # Cut the producer's connection, once it has one again.
                await eventually(lambda: proxy.cut() == 1, what="a connection to cut")
        await producer.send("s", "Sunny.")
        await asyncio.wait_for(producer.finish("s"), 15)
        assert producer.reconnects >= 2
        frame = await recv_json(sub)
    assert (frame["type"], frame["text"]) == ("message", "Sunny.")
    assert frame["parts"] == [
        {"type": "step-start"},
        {"type": "reasoning", "id": "r", "text": "".join(f"r{n} " for n in range(40)),
         "state": "done"},
        {"type": "tool-weather", "toolCallId": "c1", "state": "output-available",
         "input": {"city": "Paris"}, "output": {"celsius": 21}},
        {"type": "text", "text": "Sunny.", "state": "done"},
    ]  # fmt: skip


async def test_both_clients_reconnect_after_a_handshake_cut_before_its_answer() -> None:
    running, relay = await start_relay(session_grace=10)
    async with (
        relay,
        Proxy(_port(running)) as proxy,
        running.connect("/subscribe?channel=c") as sub,
        RelayProducer(proxy.url, channel="c", backoff=(0.05, 0.05)) as producer,
        RelaySubscriber(proxy.url, ["c"], backoff=(0.05, 0.05)) as feed,
    ):
        await recv_json(sub)
        frames = aiter(feed)
        assert isinstance(await asyncio.wait_for(anext(frames), 10), Subscribed)
        await producer.send("m", "one ")
        # Every connection's next two handshakes are dropped before the relay answers them.
        proxy.drop_requests = 4
        proxy.cut()
        await producer.send("m", "two")
        ack = await asyncio.wait_for(producer.finish("m"), 15)
        assert ack.id == "m"
        frame = await recv_json(sub)
        assert (frame["type"], frame["text"]) == ("message", "one two")
        while not isinstance(got := await asyncio.wait_for(anext(frames), 15), MessageFrame):
            pass
        assert got.text == "one two"
        assert proxy.drop_requests == 0
        assert producer.reconnects >= 2 and feed.reconnects >= 2


async def test_a_chunk_the_relay_refuses_fails_its_message_by_name(relay: RunningRelay) -> None:
    async with RelayProducer(relay.url, channel="c") as producer:
        await producer.send_chunk("bad", {"type": "text-delta", "id": "nowhere", "delta": "x"})
        with pytest.raises(MessageFailed) as failed:
            await asyncio.wait_for(producer.finish("bad"), 5)
        assert (failed.value.message_id, failed.value.code) == ("bad", "unknown_part")
        # Another message on the same connection is not touched.
        await producer.send_chunk("good", {"type": "start-step"})
        ack = await asyncio.wait_for(producer.finish("good"), 5)
        assert ack.id == "good"


async def test_a_message_whose_session_expired_is_sent_again_whole() -> None:
    # The new session is another owner; the old attempt was aborted, which holds no id, so
    # the message goes again whole under the same id (with the default --id-hold).
    async with _lapsing() as (proxy, sub, producer):
        await producer.send("m", "first half, ")
        await asyncio.sleep(0.05)
        proxy.cut()
        await producer.send("m", "second half")  # queued while the relay forgets us
        ack = await asyncio.wait_for(producer.finish("m"), 10)
        assert ack.id == "m"
        aborted, message = await recv_core(sub), await recv_core(sub)
        assert (aborted["type"], aborted["text"]) == ("aborted", "first half, ")
        # Never the second half alone: the whole message, from its first delta.
        assert (message["type"], message["text"]) == ("message", "first half, second half")


async def test_a_message_the_relay_cannot_take_again_fails_by_name() -> None:
    running, relay = await start_relay(session_grace=0)
    async with (
        relay,
        Proxy(_port(running)) as proxy,
        running.connect("/produce?channel=c") as rival,
        RelayProducer(proxy.url, channel="c", backoff=(0.4, 0.4)) as producer,
    ):
        await producer.send("m", "mine")
        await asyncio.sleep(0.05)
        proxy.cut()
        await asyncio.sleep(0.1)  # no grace: the message is aborted, the id is free...
        await send_json(rival, {"id": "m", "delta": "taken"})  # ...and taken
        with pytest.raises(MessageFailed) as failed:
            await asyncio.wait_for(producer.finish("m"), 10)
        assert (failed.value.message_id, failed.value.code) == ("m", "id_in_use")
        with pytest.raises(MessageFailed):
            await producer.send("m", " and more")  # never sent alone


async def test_a_refused_handshake_raises_at_once() -> None:
    running, relay = await start_relay(secret="a-secret-that-is-long-enough-for-hs256")
    async with relay:
        with pytest.raises(HandshakeRefused) as refused:
            await asyncio.wait_for(RelayProducer(running.url, channel="c").__aenter__(), 5)
        assert refused.value.status == 401
        subscriber = RelaySubscriber(running.url, ["c"])
        with pytest.raises(HandshakeRefused):
            await asyncio.wait_for(subscriber.__aenter__(), 5)
        await subscriber.close()


async def test_a_message_of_the_maximum_size_reaches_the_subscriber_once() -> None:
    running, relay = await start_relay(max_frame_bytes=8 << 20)
    text = '"\\\n' * (1 << 18)  # 1 MiB of characters that JSON escapes: a ~2.5 MiB frame
    async with (
        relay,
        running.connect("/produce?channel=c", max_size=None) as producer,
        RelaySubscriber(running.url, ["c"], deltas=False) as feed,
    ):
        iterator = aiter(feed)
        assert isinstance(await asyncio.wait_for(anext(iterator), 5), Subscribed)
        await producer.send(json.dumps({"id": "big", "delta": text, "final": True}))
        frame = await asyncio.wait_for(anext(iterator), 10)
        assert isinstance(frame, MessageFrame) and frame.text == text
        assert feed.reconnects == 0


async def test_subscriber_resumes_after_a_cut_without_gaps_or_duplicates() -> None:
    running, relay = await start_relay()
    async with (
        relay,
        Proxy(_port(running)) as proxy,
        running.connect("/produce?channel=c") as producer,
        RelaySubscriber(proxy.url, ["c"], backoff=(0.3, 0.3)) as feed,
    ):
        frames: list[Any] = []
        iterator = aiter(feed)

        async def next_frame() -> Any:
            frame = await asyncio.wait_for(anext(iterator), 10)
            frames.append(frame)
            return frame

        assert isinstance(await next_frame(), Subscribed)
        await producer.send('{"id": "m1", "delta": "one", "final": true}')
        assert isinstance(await next_frame(), DeltaFrame)
        assert (await next_frame()).text == "one"
        await producer.send('{"id": "m2", "delta": "two ha"}')
        assert isinstance(await next_frame(), DeltaFrame)
        assert feed.text("c", "m2") == "two ha"
        proxy.cut()
        await producer.send('{"id": "m3", "delta": "three", "final": true}')
        await producer.send('{"id": "m2", "delta": "lf", "final": true}')
        for _ in range(2):
            await recv_json(producer)
        seen: dict[str, str] = {}
        while len(seen) < 2:
            frame = await next_frame()
            if isinstance(frame, MessageFrame):
                assert frame.id not in seen
                seen[frame.id] = frame.text
        assert seen == {"m3": "three", "m2": "two half"}
        assert feed.reconnects >= 1
        resumed = [f for f in frames if isinstance(f, Subscribed)]
        assert resumed[-1].recovered is True
        assert not any(isinstance(f, Aborted) for f in frames)
        assert [f.offset for f in frames if isinstance(f, MessageFrame)] == [1, 2, 3]


async def test_producer_rides_out_the_rate_limit_without_losing_or_doubling_text() -> None:
    running, relay = await start_relay(max_events_per_second=40)
    tokens = [f"t{n} " for n in range(60)]
    async with (
        relay,
        running.connect("/subscribe?channel=c") as sub,
        RelayProducer(running.url, channel="c") as producer,
    ):
        await recv_json(sub)
        for token in tokens:
            await producer.send("m", token)
        ack = await asyncio.wait_for(producer.finish("m"), 20)
        assert ack.id == "m"
        message = await recv_json(sub, 10)
        assert message["text"] == "".join(tokens)
        assert relay.metrics.errors.labels("rate_limited")._value.get() > 0


async def test_leaving_async_with_closes_each_client_with_1000(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="token_relay")
    running, server = await start_relay()
    async with server:
        async with (
            RelaySubscriber(running.url, ["c"]),
            RelayProducer(running.url, channel="c") as producer,
        ):
            await producer.send("m", "hi")

        def closes() -> dict[str, list[object]]:
            found: dict[str, list[object]] = {}
            for record in caplog.records:
                if getattr(record, "event", None) == "close":
                    found.setdefault(str(getattr(record, "role", "")), []).append(
                        getattr(record, "code", None)
                    )
            return found

        await eventually(lambda: len(closes()) == 2, what="both closes logged")
        assert closes() == {"producer": [1000], "subscriber": [1000]}


@pytest.mark.parametrize("on_redis", [False, True], ids=["memory", "redis"])
async def test_a_completed_message_whose_ack_was_lost_with_its_session_is_acked_once(
    request: pytest.FixtureRequest, on_redis: bool
) -> None:
    # The final lands and is published, but its ack is lost, and so is the session (no
    # grace left when the producer is back): the new session, another owner, sends the
    # message again as one whole event, which the relay answers as first published.
    broker = request.getfixturevalue("redis_server").url if on_redis else "memory://"
    async with _lapsing(broker) as (proxy, sub, producer):
        for piece in ("lost ", "", "ack"):
            await producer.send("m", piece)
        proxy.lose_answers = True
        finishing = asyncio.create_task(producer.finish("m"))
        first = await recv_core(sub)
        assert (first["type"], first["id"], first["text"]) == ("message", "m", "lost ack")
        assert not finishing.done()
        proxy.cut()
        proxy.lose_answers = False
        ack = await asyncio.wait_for(finishing, 10)
        assert ack.id == "m" and producer.reconnects >= 1
        await producer.send("n", "next")
        await asyncio.wait_for(producer.finish("n"), 10)
        after = await recv_core(sub)  # nothing of "m" again: the next frame is "n"
        assert (after["type"], after["id"], after["text"]) == ("message", "n", "next")


async def test_a_lost_ack_and_session_across_two_relay_processes_on_redis_is_acked_once(
    redis_server: Any,
) -> None:
    # Behind a balancer, two relay processes on one Redis, the second with --workers 2: the
    # final lands on the first, its ack is lost, the session ends there at once (no grace),
    # and the producer comes back on the second in a new session: acked, delivered once.
    grace = ("--broker", redis_server.url, "--session-grace", "0")
    a, w = relay_process(*grace), relay_process(*grace, "--workers", "2")
    await asyncio.gather(a.start(), w.start())
    try:
        async with (
            Balancer([a.port, w.port]) as balancer,
            connect(f"{a.url}/subscribe?channel=c") as sub,
            RelayProducer(balancer.url, channel="c", backoff=(0.6, 0.6)) as producer,
        ):
            await recv_json(sub)
            for piece in ("across ", "processes"):
                await producer.send("m", piece)
            session = producer.session
            balancer.lose_answers = True
            finishing = asyncio.create_task(producer.finish("m"))
            first = await recv_core(sub, 10)
            assert (first["type"], first["id"], first["text"]) == (
                "message",
                "m",
                "across processes",
            )
            balancer.cut()
            balancer.lose_answers = False
            ack = await asyncio.wait_for(finishing, 15)
            assert ack.id == "m" and producer.session not in (None, session)
            await producer.send("n", "next")
            await asyncio.wait_for(producer.finish("n"), 10)
            after = await recv_core(sub, 10)  # nothing of "m" again: the next frame is "n"
            assert (after["type"], after["id"], after["text"]) == ("message", "n", "next")
    finally:
        await asyncio.gather(a.stop(), w.stop())


@pytest.mark.parametrize(
    ("limit", "deltas", "advertised"),
    [
        # 300 unacknowledged deltas of 4,000 characters, 1.2 MB: sent again in one frame,
        # they would pass the default --max-frame-bytes (1 MiB) and be refused 1009, again
        # at every reconnect.
        (None, 150, True),
        # A relay whose limit is under the client's own bound (256 KiB): the client sends
        # again within the limit its handshake gave...
        (48 * 1024, 20, True),
        # ...and, from a relay that does not give it, learns it from the relay's 1009s
        # (a proxy with a limit of its own is such a relay).
        (48 * 1024, 20, False),
    ],
    ids=["default-limit", "48KiB-limit", "48KiB-limit-unsaid"],
)
async def test_a_resend_past_the_relays_frame_limit_goes_in_several_frames(
    limit: int | None,
    deltas: int,
    advertised: bool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not advertised:  # the client reads no limit from the handshake
        monkeypatch.setattr("token_relay.client.producer.MAX_FRAME_HEADER", "X-Absent")
    texts = {m: [f"{m}{n:03d}".ljust(4000, ".") for n in range(deltas)] for m in ("a", "b")}
    settings = {} if limit is None else {"max_frame_bytes": limit}
    with caplog.at_level(logging.WARNING, logger="token_relay.client"):
        async with _behind_proxy(10, 0.05, **settings) as (proxy, sub, producer):
            for message_id, sent in texts.items():
                for delta in sent:
                    await producer.send(message_id, delta)  # unacknowledged until the final
            proxy.cut()
            acks = await asyncio.wait_for(
                asyncio.gather(*(producer.finish(message_id) for message_id in texts)), 15
            )
            assert [ack.id for ack in acks] == ["a", "b"]
            got = {(frame := await recv_core(sub))["id"]: frame["text"] for _ in texts}
            assert got == {message_id: "".join(sent) for message_id, sent in texts.items()}
            assert producer.reconnects >= 1
    too_big = [r for r in caplog.records if "refused a frame as too big" in r.getMessage()]
    # Within a limit the handshake gave, no frame is ever refused.
    assert bool(too_big) is (limit is not None and not advertised)


async def test_an_event_past_the_relays_frame_limit_is_refused_before_it_is_sent() -> None:
    # The relay's 101 gives its --max-frame-bytes; RelayProducer refuses an event past it
    # at once (the relay would close the connection with 1009, and again at every resend),
    # and the message goes on, its next event numbered as if the refused one never was.
    running, relay = await start_relay(max_frame_bytes=64 * 1024)
    async with (
        relay,
        running.connect("/subscribe?channel=c") as sub,
        RelayProducer(running.url, channel="c") as producer,
    ):
        for path in ("/produce?channel=c", "/ai-sdk/ws"):  # every WebSocket endpoint
            async with running.connect(path) as other:
                assert other.response is not None
                assert other.response.headers["Relay-Max-Frame-Bytes"] == str(64 * 1024)
        assert sub.response is not None
        assert sub.response.headers["Relay-Max-Frame-Bytes"] == str(64 * 1024)
        await recv_json(sub)
        await producer.send("m", "start ")
        with pytest.raises(UsageError, match="max-frame-bytes"):
            await producer.send("m", "\u00e9" * 40_000)  # 80,000 bytes in UTF-8
        await producer.send("m", "end")
        ack = await asyncio.wait_for(producer.finish("m"), 10)
        assert ack.id == "m"
        frame = await recv_core(sub)
        assert (frame["type"], frame["text"]) == ("message", "start end")
        assert producer.reconnects == 0


async def test_a_lone_event_of_the_relays_very_frame_limit_is_sent_again_as_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An event exactly at --max-frame-bytes passes sent live; sent again after a cut it
    # must go as itself: in an array of one, its two brackets would pass the limit (1009),
    # again at every reconnect.
    limit = 64 * 1024
    overhead = len(ProducerEvent(id="m", seq=1, delta="").model_dump_json(exclude_defaults=True))
    delta = "x" * (limit - overhead)
    frame = ProducerEvent(id="m", seq=1, delta=delta).model_dump_json(exclude_defaults=True)
    assert len(frame.encode()) == limit
    with caplog.at_level(logging.WARNING, logger="token_relay.client"):
        async with _behind_proxy(10, 0.05, max_frame_bytes=limit) as (proxy, sub, producer):
            await producer.send("m", delta)  # unacknowledged until the final
            assert proxy.cut() == 1
            ack = await asyncio.wait_for(producer.finish("m"), 10)
            assert ack.id == "m"
            frame_in = await recv_core(sub)
            assert (frame_in["type"], frame_in["text"]) == ("message", delta)
            assert producer.reconnects == 1
    assert not [r for r in caplog.records if "too big" in r.getMessage()]


async def _m_failed_and_n_whole(sub: ClientConnection) -> dict[str, Any]:
    """What a deltas subscriber of ``c`` saw of message ``m`` ("start ", then an event too
    big) and ``n`` ("other ", then "reply"): ``m``'s delta, then ``m`` aborted (reason
    ``error``) with that text, and ``n`` whole. ``m``'s ``aborted`` frame."""
    frames = [await recv_core(sub) for _ in range(5)]
    ended = {f["id"]: f for f in frames if f["type"] in ("message", "aborted")}
    assert ended["m"]["type"] == "aborted" and ended["m"]["reason"] == "error"
    assert ended["m"]["text"] == "start "
    assert (ended["n"]["type"], ended["n"]["text"]) == ("message", "other reply")
    deltas = [(f["id"], f["delta"]) for f in frames if f["type"] == "delta"]
    assert deltas == [("m", "start "), ("n", "other "), ("n", "reply")]
    return ended["m"]


async def test_an_event_past_a_restarted_relays_lower_frame_limit_fails_its_message_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An event buffered under one limit meets a relay started again with a lower one: sent,
    # it would close the connection with 1009 at every reconnect, and every message of the
    # producer would wait forever. Its message fails by name instead (aborted for its
    # subscribers, with what came before it), and the others go on, exact.
    first, first_relay = await start_relay()
    second, second_relay = await start_relay(max_frame_bytes=64 * 1024)
    big = "y" * (100 * 1024)
    async with (
        first_relay,
        second_relay,
        Proxy(_port(first)) as proxy,
        second.connect("/subscribe?channel=c&deltas=1") as sub,
        RelayProducer(proxy.url, channel="c", backoff=(0.05, 0.05)) as producer,
    ):
        await recv_json(sub)
        await producer.send("m", "start ")
        await producer.send("m", big)  # within the first relay's limit (1 MiB)
        await producer.send("n", "other ")
        proxy.target_port = _port(second)  # the relay, started again with 64 KiB
        with caplog.at_level(logging.WARNING, logger="token_relay.client"):
            assert proxy.cut() == 1
            with pytest.raises(MessageFailed) as failed:
                await asyncio.wait_for(producer.finish("m"), 10)
            assert failed.value.code == "message_too_large"
            with pytest.raises(MessageFailed):
                await producer.send("m", "more")  # a later part is never sent alone
            await producer.send("n", "reply")
            ack = await asyncio.wait_for(producer.finish("n"), 10)
        assert ack.id == "n"
        aborted = await _m_failed_and_n_whole(sub)
        assert "max-frame-bytes" in aborted["meta"]["errorText"]
        assert producer.reconnects == 1
    assert not [r for r in caplog.records if "too big" in r.getMessage()]
    failures = [r for r in caplog.records if "failed: an event of" in r.getMessage()]
    assert len(failures) == 1 and "'m'" in failures[0].getMessage()


async def test_an_event_past_a_proxys_own_frame_limit_fails_its_message_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A proxy on the way refuses frames past 16 KiB with 1009, and no handshake says so. An
    # event past it closed the connection at every reconnect, and every message of the
    # producer waited forever. The careful resend after the first 1009 finds the event
    # refused alone: its message fails by name (aborted for subscribers, with what came
    # before it), a later event as big is refused before it is sent, and the others go on.
    running, relay = await start_relay(session_grace=10)
    big = "y" * (32 * 1024)
    async with (
        relay,
        FrameLimitProxy(_port(running), 16 * 1024) as proxy,
        running.connect("/subscribe?channel=c&deltas=1") as sub,
        RelayProducer(proxy.url, channel="c", backoff=(0.05, 0.05)) as producer,
    ):
        await recv_json(sub)
        await producer.send("m", "start ")
        await producer.send("n", "other ")
        with caplog.at_level(logging.WARNING, logger="token_relay.client"):
            await producer.send("m", big)  # the proxy closes the connection: 1009
            with pytest.raises(MessageFailed) as failed:
                await asyncio.wait_for(producer.finish("m"), 10)
            assert failed.value.code == "message_too_large"
            assert "1009" in str(failed.value)
            with pytest.raises(UsageError, match="1009"):
                await producer.send("n", big)  # now known: never sent
            await producer.send("n", "reply")
            ack = await asyncio.wait_for(producer.finish("n"), 10)
        assert ack.id == "n"
        aborted = await _m_failed_and_n_whole(sub)
        assert "1009" in aborted["meta"]["errorText"]
        assert proxy.refused == 2  # the live event, then the same event sent alone
        assert producer.reconnects == 2
    failures = [r for r in caplog.records if "failed: an event of" in r.getMessage()]
    assert len(failures) == 1 and "'m'" in failures[0].getMessage()


async def _m_failed_in_the_resumed_session(
    producer: RelayProducer, session: str | None, sub: ClientConnection, text: str
) -> dict[str, Any]:
    """Message ``m`` fails by name (``message_too_large``) and ``n`` ("other " so far)
    completes with "reply" in ``session``, resumed. A deltas subscriber of ``c`` (past the
    deltas before) then sees ``n``'s "reply", ``m`` aborted (reason ``error``) with
    ``text``, and ``n`` whole. ``m``'s ``aborted`` frame."""
    with pytest.raises(MessageFailed) as failed:
        await asyncio.wait_for(producer.finish("m"), 15)
    assert failed.value.code == "message_too_large"
    await producer.send("n", "reply")
    ack = await asyncio.wait_for(producer.finish("n"), 15)
    assert ack.id == "n" and producer.session == session  # resumed
    frames = [await recv_core(sub, 10) for _ in range(3)]
    ended = {f["id"]: f for f in frames if f["type"] in ("message", "aborted")}
    assert ended["m"]["type"] == "aborted" and ended["m"]["reason"] == "error"
    assert ended["m"]["text"] == text
    assert (ended["n"]["type"], ended["n"]["text"]) == ("message", "other reply")
    assert [(f["id"], f["delta"]) for f in frames if f["type"] == "delta"] == [("n", "reply")]
    return ended["m"]


async def test_a_proxys_frame_limit_is_learned_across_two_relay_processes_on_redis(
    redis_server: Any,
) -> None:
    # The proxy with a 16 KiB limit of its own sends the producer's connections to one
    # relay process, then (a rolling restart) to another with --workers 2 on the same
    # Redis. The session resumes there; its careful resend finds the event the proxy
    # refuses, and the message fails by name, aborted with what came before it, while the
    # other message completes exact, once.
    big = "y" * (32 * 1024)
    first = relay_process("--broker", redis_server.url, "--session-grace", "10")
    second = relay_process("--broker", redis_server.url, "--session-grace", "10", "--workers", "2")
    await asyncio.gather(first.start(), second.start())
    try:
        async with (
            FrameLimitProxy(first.port, 16 * 1024) as proxy,
            connect(f"{first.url}/subscribe?channel=c&deltas=1") as sub,
            RelayProducer(proxy.url, channel="c", backoff=(0.05, 0.05)) as producer,
        ):
            await recv_json(sub)
            await producer.send("m", "start ")
            await producer.send("n", "other ")
            live: dict[str, str] = {"m": "", "n": ""}
            while live != {"m": "start ", "n": "other "}:  # through Redis, in any order
                frame = await recv_core(sub, 10)
                assert frame["type"] == "delta"
                live[frame["id"]] += frame["delta"]
            session = producer.session
            proxy.target_port = second.port  # from the next connection on
            await producer.send("m", big)  # the proxy closes the connection: 1009
            aborted = await _m_failed_in_the_resumed_session(producer, session, sub, "start ")
            assert "1009" in aborted["meta"]["errorText"]
            assert proxy.refused == 2 and producer.reconnects == 2
    finally:
        await asyncio.gather(first.stop(), second.stop())


async def test_a_resumed_session_on_another_process_with_a_lower_limit_ends_the_message(
    redis_server: Any,
) -> None:
    # A rolling restart lowers --max-frame-bytes: two relay processes on one Redis, the
    # second (with --workers 2) at 64 KiB. The producer's 100 KB event was applied by the
    # first; the session resumes on the second, which holds the message with that event.
    # The message fails by name and is aborted there with all of its text; the other
    # message goes on, exact, and nothing loops on 1009.
    big = "y" * (100 * 1024)
    first = relay_process("--broker", redis_server.url)
    second = relay_process(
        "--broker", redis_server.url, "--max-frame-bytes", str(64 * 1024), "--workers", "2"
    )
    await asyncio.gather(first.start(), second.start())
    try:
        async with (
            Proxy(first.port) as proxy,
            connect(f"{first.url}/subscribe?channel=c&deltas=1") as sub,
            RelayProducer(proxy.url, channel="c", backoff=(0.05, 0.05)) as producer,
        ):
            await recv_json(sub)
            await producer.send("m", "start ")
            await producer.send("m", big)
            await producer.send("n", "other ")
            live: dict[str, str] = {"m": "", "n": ""}
            while live["n"] != "other ":  # through Redis, a message's deltas may come merged
                frame = await recv_core(sub, 10)
                assert frame["type"] == "delta"
                live[frame["id"]] += frame["delta"]
            assert live == {"m": "start " + big, "n": "other "}
            session = producer.session
            proxy.target_port = second.port
            assert proxy.cut() == 1
            await _m_failed_in_the_resumed_session(producer, session, sub, "start " + big)
            assert producer.reconnects == 1
    finally:
        await asyncio.gather(first.stop(), second.stop())
