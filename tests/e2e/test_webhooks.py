"""Webhooks over real sockets, to a real HTTP receiver: signed per Standard Webhooks (checked
by the ``standardwebhooks`` verifier), retried with backoff through failures, stalls and
outages with each channel's order kept, bounded, dead letters listed and replayed, drained on
SIGTERM; with Redis, delivered by one process and taken over when it is killed."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from standardwebhooks import Webhook
from token_relay.brokers.memory import MemoryBroker
from token_relay.core.grants import Role
from token_relay.core.webhooks import DeadLetter, webhook_id
from token_relay.tokens import mint, verify

from ..conftest import RunningRelay, connect, recv_json, send_json, start_relay
from ..harness import RedisServer, WebhookReceiver, free_port, relay_process

SECRET = "whsec_" + base64.b64encode(b"a webhook secret of 32 bytes....").decode()
FAST = {"webhook_backoff": 0.05, "webhook_timeout": 1.0, "session_grace": 0}


async def _until(condition: Callable[[], bool], wait: float = 10.0) -> None:
    async with asyncio.timeout(wait):
        while not condition():  # noqa: ASYNC110 - polls a receiver on another thread
            await asyncio.sleep(0.01)


async def _publish(running: RunningRelay, channel: str, count: int, prefix: str = "m") -> None:
    async with running.connect(f"/produce?channel={channel}") as producer:
        for n in range(count):
            await send_json(producer, {"id": f"{prefix}{n}", "delta": f"text {n} ✓"})
            await send_json(producer, {"id": f"{prefix}{n}", "final": True})
            assert (await recv_json(producer))["type"] == "ack"


def _http(running: RunningRelay) -> str:
    return running.url.replace("ws://", "http://")


async def test_each_message_is_posted_once_signed_with_a_stable_id_and_in_order() -> None:
    with WebhookReceiver() as receiver:
        running, relay = await start_relay(webhooks=(receiver.url,), webhook_secret=SECRET, **FAST)
        async with relay:
            async with running.connect("/produce?channel=c") as producer:
                await send_json(producer, {"id": "a", "delta": "Hel", "meta": {"model": "m1"}})
                await send_json(producer, {"id": "a", "delta": "lo 👋", "final": True})
                await recv_json(producer)
                await send_json(producer, {"id": "b", "delta": "half"})
            # The producer went away mid-message: its abort is a webhook too.
            await _until(lambda: len(receiver.received) == 2)
        got = receiver.received
        verifier = Webhook(SECRET)
        payloads = [verifier.verify(r.body, r.headers) for r in got]
        epoch = payloads[0]["epoch"]
        assert payloads == [
            {"type": "message", "channel": "c", "id": "a", "text": "Hello 👋",
             "meta": {"model": "m1"}, "offset": 1, "epoch": epoch},
            {"type": "aborted", "channel": "c", "id": "b", "text": "half", "meta": {},
             "reason": "producer_disconnected", "offset": 2, "epoch": epoch},
        ]  # fmt: skip
        assert [r.headers["webhook-id"] for r in got] == [
            webhook_id("c", epoch, 1),
            webhook_id("c", epoch, 2),
        ]
        assert all(r.headers["content-type"] == "application/json" for r in got)
        assert abs(int(got[0].headers["webhook-timestamp"]) - time.time()) < 60
        # A tampered body fails the verifier: the signature covers it.
        with pytest.raises(Exception, match="signature"):
            verifier.verify(got[0].body.replace(b"Hello", b"Jello"), got[0].headers)


async def test_with_auth_the_producer_identity_is_in_the_payload() -> None:
    secret = "a-relay-secret-for-webhook-tests-32b"
    with WebhookReceiver() as receiver:
        running, relay = await start_relay(webhooks=(receiver.url,), secret=secret, **FAST)
        token = mint(secret, Role.PRODUCE, ["chat-*"], 60)
        async with (
            relay,
            connect(f"{running.url}/produce?channel=chat-1&token={token}") as producer,
        ):
            await recv_json(producer)  # session
            await send_json(producer, {"id": "m", "delta": "x", "final": True})
            await recv_json(producer)
            await _until(lambda: len(receiver.received) == 1)
        assert receiver.delivered()[0]["producer"] == {"role": "produce", "channels": ["chat-*"]}


async def test_a_receiver_failing_its_first_attempts_gets_every_message_once_in_order() -> None:
    failures = {0: 500, 1: 503, 2: 404}
    with WebhookReceiver(lambda n, body: failures.get(n, 200)) as receiver:
        running, relay = await start_relay(webhooks=(receiver.url,), **FAST)
        async with relay:
            await _publish(running, "c", 5)
            await _until(lambda: len(receiver.delivered()) == 5)
            metrics = (await httpx.AsyncClient().get(_http(running) + "/metrics")).text
        assert [p["id"] for p in receiver.delivered()] == [f"m{n}" for n in range(5)]
        assert [r.status for r in receiver.received[:4]] == [500, 503, 404, 200]
        assert 'relay_webhook_attempts_total{outcome="http_error"} 3.0' in metrics
        assert 'relay_webhook_deliveries_total{outcome="delivered"} 5.0' in metrics
        assert "relay_webhook_lag_seconds_count 5.0" in metrics


async def test_a_stalled_receiver_times_out_is_retried_and_never_blocks_the_relay() -> None:
    with WebhookReceiver(lambda n, body: -3.0 if n == 0 else 200) as receiver:
        running, relay = await start_relay(
            webhooks=(receiver.url,), **{**FAST, "webhook_timeout": 1.0}
        )
        async with relay, running.connect("/subscribe?channel=c") as subscriber:
            await recv_json(subscriber)
            started = time.monotonic()
            await _publish(running, "c", 3)
            # Subscribers get every message whatever the webhook is doing: a relay that
            # waited on its POSTs would take a timeout (1 s) per message at least.
            assert [(await recv_json(subscriber))["id"] for _ in range(3)] == ["m0", "m1", "m2"]
            assert time.monotonic() - started < 2.0
            await _until(lambda: len(receiver.delivered()) == 3)
            metrics = (await httpx.AsyncClient().get(_http(running) + "/metrics")).text
        assert [p["id"] for p in receiver.delivered()] == ["m0", "m1", "m2"]
        assert 'relay_webhook_attempts_total{outcome="timeout"} 1.0' in metrics


async def test_an_outage_of_the_receiver_keeps_each_channels_order() -> None:
    recovered_at = time.time() + 1.0
    with WebhookReceiver(lambda n, body: 500 if time.time() < recovered_at else 200) as receiver:
        running, relay = await start_relay(webhooks=(receiver.url,), **FAST)
        async with relay:
            await asyncio.gather(*(_publish(running, channel, 6) for channel in ("a", "b", "c")))
            await _until(lambda: len(receiver.unique()) == 18)
    assert len(receiver.delivered()) == 18  # once each
    for channel in ("a", "b", "c"):
        posts = [
            (r.json()["offset"], r.status)
            for r in receiver.received
            if r.json()["channel"] == channel
        ]
        # Never a later message before an earlier one has succeeded.
        done = 0
        for offset, status in posts:
            assert offset == done + 1, posts
            if status == 200:
                done = offset
        assert done == 6


async def test_a_receiver_that_never_recovers_makes_dead_letters_listed_and_replayed() -> None:
    healthy = False
    with WebhookReceiver(lambda n, body: 200 if healthy else 500) as receiver:
        running, relay = await start_relay(
            webhooks=(receiver.url,), **{**FAST, "webhook_max_age": 0.4}
        )
        async with relay, httpx.AsyncClient(base_url=_http(running)) as http:
            await _publish(running, "c", 2)
            await _until(lambda: "relay_webhook_dead_letters 2.0" in _metrics_now(running))
            dead = (await http.get("/webhooks/dead")).json()["dead"]
            assert [(d["payload"]["id"], d["url"], d["error"]) for d in dead] == [
                ("m1", receiver.url, "http_error 500"),
                ("m0", receiver.url, "http_error 500"),
            ]
            # m1 waited behind m0 (one channel, in order) until both were too old.
            assert dead[1]["attempts"] >= 2 and dead[0]["attempts"] >= 1
            healthy = True
            replay = await http.post("/webhooks/dead")
            assert replay.status_code == 200 and replay.json() == {"revived": 2}
            await _until(lambda: len(receiver.delivered()) == 2)
            assert [p["id"] for p in receiver.delivered()] == ["m0", "m1"]
            assert (await http.get("/webhooks/dead")).json() == {"dead": []}
            metrics = (await http.get("/metrics")).text
        assert 'relay_webhook_deliveries_total{outcome="dead"} 2.0' in metrics


def _metrics_now(running: RunningRelay) -> str:
    return running.relay.metrics.render().decode()


async def test_dead_letters_need_an_admin_token_or_loopback() -> None:
    secret = "a-relay-secret-for-webhook-tests-32b"
    with WebhookReceiver() as receiver:
        running, relay = await start_relay(webhooks=(receiver.url,), secret=secret, **FAST)
        async with relay, httpx.AsyncClient(base_url=_http(running)) as http:
            assert (await http.get("/webhooks/dead")).status_code == 401
            reader = mint(secret, Role.SUBSCRIBE, ["c"], 60)
            refused = await http.get(
                "/webhooks/dead", headers={"Authorization": f"Bearer {reader}"}
            )
            assert refused.status_code == 403
            admin = mint(secret, Role.ADMIN, [], 60)
            ok = await http.get("/webhooks/dead", headers={"Authorization": f"Bearer {admin}"})
            assert ok.status_code == 200 and ok.json() == {"dead": []}
            assert (await http.put("/webhooks/dead")).status_code == 405
    # Without --secret only loopback may ask; without --webhook there is nothing to list.
    running, relay = await start_relay()
    async with relay, httpx.AsyncClient(base_url=_http(running)) as http:
        assert (await http.get("/webhooks/dead")).status_code == 404


async def test_a_full_outbox_still_delivers_to_subscribers_and_counts_what_it_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = time.time() + 1.0
    with WebhookReceiver(lambda n, body: -0.05 if time.time() < release else 200) as receiver:
        running, relay = await start_relay(
            webhooks=(receiver.url,), webhook_max_pending=2, **{**FAST, "webhook_timeout": 5.0}
        )
        async with relay, running.connect("/subscribe?channel=c") as subscriber:
            await recv_json(subscriber)
            await _publish(running, "c", 6)
            assert [(await recv_json(subscriber))["id"] for _ in range(6)] == [
                f"m{n}" for n in range(6)
            ]
            await _until(lambda: "relay_webhook_not_queued_total 4.0" in _metrics_now(running))
            await _until(lambda: len(receiver.unique()) == 2)
        assert [p["id"] for p in receiver.unique()] == ["m0", "m1"]
    assert "webhook outbox full: message 'm2' on 'c' not queued" in caplog.text


async def test_only_the_channels_of_webhook_channel_are_sent() -> None:
    with WebhookReceiver() as receiver:
        running, relay = await start_relay(
            webhooks=(receiver.url,), webhook_channels=("chat-*", "lobby"), **FAST
        )
        async with relay:
            for channel in ("chat-1", "other", "lobby", "chatter"):
                await _publish(running, channel, 1, prefix=channel)
            await _until(lambda: len(receiver.delivered()) == 2)
            await asyncio.sleep(0.2)
        assert sorted(p["channel"] for p in receiver.delivered()) == ["chat-1", "lobby"]


async def test_every_url_gets_every_message_each_at_its_own_pace() -> None:
    with (
        WebhookReceiver() as fast,
        WebhookReceiver(lambda n, body: 500 if n < 3 else 200) as flaky,
    ):
        running, relay = await start_relay(webhooks=(fast.url, flaky.url), **FAST)
        async with relay:
            await _publish(running, "c", 3)
            await _until(lambda: len(fast.delivered()) == 3 and len(flaky.delivered()) == 3)
        assert [p["id"] for p in fast.delivered()] == [p["id"] for p in flaky.delivered()]


async def test_sigterm_delivers_the_outbox_before_the_process_exits(tmp_path: Path) -> None:
    # Every message fails once first, so the outbox is still busy when SIGTERM comes.
    with WebhookReceiver(lambda n, body: 200 if n % 2 else 503) as receiver:
        relay = relay_process(
            "--webhook", receiver.url, "--webhook-backoff", "0.05", "--session-grace", "0"
        )
        await relay.start()
        try:
            async with connect(f"{relay.url}/produce?channel=c") as producer:
                await recv_json(producer)
                for n in range(5):
                    await send_json(producer, {"id": f"m{n}", "delta": "x", "final": True})
                    await recv_json(producer)
                await send_json(producer, {"id": "cut", "delta": "by the shutdown"})
                await asyncio.sleep(0.05)
                assert await relay.terminate(15) == 0
        finally:
            await relay.stop()
    ids = [p["id"] for p in receiver.unique()]
    assert ids == ["m0", "m1", "m2", "m3", "m4", "cut"], ids
    assert receiver.unique()[-1]["reason"] == "shutdown"


# ---------------------------------------------------------------- with Redis


async def _produce_to(url: str, channel: str, ids: list[str]) -> None:
    async with connect(f"{url}/produce?channel={channel}") as producer:
        await recv_json(producer)  # session
        for message_id in ids:
            await send_json(producer, {"id": message_id, "delta": f"text of {message_id}"})
            await send_json(producer, {"id": message_id, "final": True})
            assert (await recv_json(producer))["type"] == "ack"


def _deliverer(relays: list[Any]) -> Any:
    """The process that logged taking the outbox last."""
    marks = [(r.log.rfind("delivers the webhook outbox now"), r) for r in relays if r.alive]
    position, relay = max(marks, key=lambda mark: mark[0])
    assert position >= 0
    return relay


async def test_on_redis_one_process_delivers_and_a_kill_9_mid_post_loses_nothing(
    redis_server: RedisServer,
) -> None:
    # The first POST stalls, so the delivering process dies with it in flight.
    with WebhookReceiver(lambda n, body: -2.0 if n == 0 else 200) as receiver:
        args = (
            "--broker", redis_server.url, "--webhook", receiver.url, "--lease-seconds", "1",
            "--webhook-timeout", "5", "--webhook-backoff", "0.05",
        )  # fmt: skip
        relays = [relay_process(*args, name="relay-a"), relay_process(*args, name="relay-b")]
        await asyncio.gather(*(relay.start() for relay in relays))
        try:
            await _until(lambda: any("delivers the webhook outbox" in r.log for r in relays))
            delivering = _deliverer(relays)
            other = relays[1] if delivering is relays[0] else relays[0]
            # Messages complete on both processes, on two channels.
            await asyncio.gather(
                _produce_to(relays[0].url, "x", [f"x{n}" for n in range(4)]),
                _produce_to(relays[1].url, "y", [f"y{n}" for n in range(4)]),
            )
            await _until(lambda: receiver.posts >= 1)
            await delivering.kill()
            await _produce_to(other.url, "x", ["x4"])
            await _until(lambda: len(receiver.unique()) == 9, wait=20)
            assert "delivers the webhook outbox now" in other.log
            # A process that stops gives the lease up at once.
            redis = Redis.from_url(redis_server.url)
            assert await redis.get("tr:wh:lease") is not None
            assert await other.terminate(10) == 0
            assert await redis.get("tr:wh:lease") is None
            await redis.aclose()
        finally:
            await asyncio.gather(*(relay.stop() for relay in relays))
    unique = receiver.unique()
    for channel, count in (("x", 5), ("y", 4)):
        assert [p["id"] for p in unique if p["channel"] == channel] == [
            f"{channel}{n}" for n in range(count)
        ]
    assert all(p["text"] == f"text of {p['id']}" for p in unique)
    # At least once: what was in flight when the process died (one POST per channel's lane
    # at most) may come twice; nothing else does, so one process delivered at a time.
    assert len(receiver.delivered()) <= 9 + 2


async def test_a_redis_restart_loses_nothing_completed_after_it_or_during_it(
    redis_server: RedisServer,
) -> None:
    with WebhookReceiver() as receiver:
        relay = relay_process(
            "--broker", redis_server.url, "--webhook", receiver.url, "--lease-seconds", "1",
            "--webhook-backoff", "0.05", "--session-grace", "0",
        )  # fmt: skip
        await relay.start()
        try:
            await _produce_to(relay.url, "c", ["before"])
            await _until(lambda: len(receiver.unique()) == 1)
            async with connect(f"{relay.url}/produce?channel=c") as producer:
                await recv_json(producer)
                await send_json(producer, {"id": "cut", "delta": "aborted while Redis is down"})
                redis_server.kill()
                await _until_http(relay, "/readyz", 503)
            # The producer is gone while Redis is: its abort waits in the relay's outbox.
            redis_server.start()
            await _until_http(relay, "/readyz", 200)
            await _produce_to(relay.url, "c", ["after"])
            await _until(lambda: len(receiver.unique()) == 3, wait=20)
        finally:
            await relay.stop()
    assert [(p["id"], p["type"]) for p in receiver.unique()] == [
        ("before", "message"),
        ("cut", "aborted"),
        ("after", "message"),
    ]


async def _until_http(relay: Any, path: str, status: int) -> None:
    for _ in range(500):
        if await relay.http_status(path) == status:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never answered {status}")


def test_an_admin_token_is_minted_without_channels() -> None:
    secret = "a-relay-secret-for-webhook-tests-32b"
    done = subprocess.run(
        [sys.executable, "-m", "token_relay", "token", "--role", "admin", "--secret", secret],
        capture_output=True,
        text=True,
        check=True,
    )
    assert verify(done.stdout.strip(), secret).role is Role.ADMIN
    refused = subprocess.run(
        [sys.executable, "-m", "token_relay", "token", "--role", "produce", "--secret", secret],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "needs at least one --channel" in refused.stderr


async def test_with_workers_2_on_redis_every_message_is_posted_once_in_order(
    redis_server: RedisServer,
) -> None:
    with WebhookReceiver() as receiver:
        relay = relay_process(
            "--workers", "2", "--broker", redis_server.url, "--webhook", receiver.url,
            "--lease-seconds", "1", "--webhook-backoff", "0.05",
        )  # fmt: skip
        await relay.start()
        try:
            # Producers land on either worker (one port, SO_REUSEPORT).
            await asyncio.gather(
                *(
                    _produce_to(relay.url, f"w{c}", [f"w{c}-{n}" for n in range(5)])
                    for c in range(4)
                )
            )
            await _until(lambda: len(receiver.unique()) == 20, wait=20)
            await asyncio.sleep(0.3)
        finally:
            await relay.stop()
    assert len(receiver.delivered()) == 20  # one worker delivers: nothing twice
    for c in range(4):
        ids = [p["id"] for p in receiver.unique() if p["channel"] == f"w{c}"]
        assert ids == [f"w{c}-{n}" for n in range(5)]


# ---------------------------------------------------------------- receivers under attack


class FloodingReceiver:
    """A raw HTTP server that answers each POST with 200 and then a body without end: the
    first one chunked, the next ones with a ``Content-Length`` of 256 MiB it never reaches.
    It writes until the relay drops the connection, and counts what it wrote."""

    def __init__(self) -> None:
        self.written: list[int] = []
        """Bytes of answer body written on each connection before the relay dropped it."""
        self.drops = 0
        """Connections the relay dropped while the answer was being written."""
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/hook"

    async def __aenter__(self) -> FloodingReceiver:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        chunked = not self.written
        self.written.append(0)
        if chunked:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 268435456\r\n\r\n")
        block = b"x" * 65536
        chunk = b"10000\r\n" + block + b"\r\n" if chunked else block
        try:
            while self.written[-1] < 256 * 1024 * 1024:
                writer.write(chunk)
                await writer.drain()
                self.written[-1] += len(block)
        except ConnectionError:
            self.drops += 1
        writer.close()


async def test_a_receivers_endless_answer_is_read_up_to_a_bound_and_its_connection_dropped() -> (
    None
):
    async with FloodingReceiver() as receiver:
        # A timeout far longer than the test waits: only the bound can end these answers.
        running, relay = await start_relay(
            webhooks=(receiver.url,), **{**FAST, "webhook_timeout": 60.0}
        )
        async with relay:
            await _publish(running, "c", 2)
            await _until(
                lambda: (
                    'relay_webhook_deliveries_total{outcome="delivered"} 2.0'
                    in _metrics_now(running)
                )
            )
            await _until(lambda: receiver.drops == 2)
    # The status was the answer; the relay read a few KiB of each body, and the socket
    # buffers took the rest the receiver wrote before it saw the connection dropped.
    assert len(receiver.written) == 2
    assert all(written < 32 * 1024 * 1024 for written in receiver.written), receiver.written


async def test_webhook_urls_are_logged_without_their_query_or_userinfo() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")  # aiohttp's error names the URL it asked
        await writer.drain()
        writer.close()

    refused = free_port()
    garbled = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = garbled.sockets[0].getsockname()[1]
    with WebhookReceiver(lambda n, body: 500) as failing:
        urls = [
            failing.url.replace("http://", "http://user:SECRET-pw@") + "?key=SECRET-1",
            f"http://127.0.0.1:{port}/hook?key=SECRET-2&x=1#SECRET-3",
            f"http://127.0.0.1:{refused}/hook?key=SECRET-4",
        ]
        relay = relay_process(
            *(arg for url in urls for arg in ("--webhook", url)),
            "--webhook-backoff", "0.05", "--webhook-max-age", "0.5", "--session-grace", "0",
        )  # fmt: skip
        await relay.start()
        try:
            await _produce_to(relay.url, "c", ["m0"])
            await _until(lambda: relay.log.count("is a dead letter") == 3)
            assert await relay.terminate(10) == 0
        finally:
            await relay.stop()
            garbled.close()
    log = relay.log
    assert log.count("failed (") >= 3  # every receiver's failures were logged
    assert "SECRET" not in log, log
    # Each receiver is still named: by scheme, host, port and path.
    for url in (failing.url, f"http://127.0.0.1:{port}/hook", f"http://127.0.0.1:{refused}/hook"):
        assert f"to {url} is a dead letter" in log


def test_a_refused_webhook_url_is_named_without_its_query() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "token_relay", "--webhook", "ftp://u:SECRET@host/x?key=SECRET"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "'ftp://host/x' is not an http:// or https:// URL" in done.stderr
    assert "SECRET" not in done.stderr


async def test_dead_letters_are_bounded_and_count_in_the_relays_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = "y" * 20_000
    with WebhookReceiver(lambda n, body: 500) as receiver:
        running, relay = await start_relay(
            webhooks=(receiver.url,), history_size=1, webhook_max_dead=3,
            webhook_max_dead_bytes=100_000, max_memory_bytes=50_000,
            **{**FAST, "webhook_max_age": 0.2},
        )  # fmt: skip
        async with relay, httpx.AsyncClient(base_url=_http(running)) as http:
            async with running.connect("/produce?channel=c") as producer:
                for n in range(5):
                    await send_json(producer, {"id": f"m{n}", "delta": text, "final": True})
                    assert (await recv_json(producer))["type"] == "ack"
            await _until(
                lambda: (
                    'relay_webhook_deliveries_total{outcome="dead"} 5.0' in _metrics_now(running)
                ),
            )
            # Three kept (the newest), two dropped, counted and logged.
            listed = (await http.get("/webhooks/dead")).json()["dead"]
            dead = [DeadLetter.model_validate(letter) for letter in listed]
            assert [letter.payload.id for letter in dead] == ["m4", "m3", "m2"]
            held = sum(len(letter.model_dump_json()) for letter in dead)
            metrics = _metrics_now(running)
            assert "relay_webhook_dead_letters_dropped_total 2.0" in metrics
            assert f"relay_webhook_dead_letter_bytes {float(held)}" in metrics
            # With the producer gone, the relay holds its history (one message) and the
            # dead letters, and counts both.
            producers = running.relay.producers
            await _until(lambda: producers.sessions.text_chars() == 0)
            broker = running.relay.broker
            assert isinstance(broker, MemoryBroker)
            assert producers.memory_in_use() == broker.history.bytes + held
            assert f"relay_memory_bytes {float(broker.history.bytes + held)}" in _metrics_now(
                running
            )
            # The dead letters alone take it over --max-memory-bytes: a new message is refused.
            assert broker.history.bytes < 50_000 < broker.history.bytes + held
            await _until(lambda: producers.overloaded(time.monotonic()))
            async with running.connect("/produce?channel=c") as producer:
                await send_json(producer, {"id": "next", "delta": "x"})
                refused = await recv_json(producer)
                assert (refused["type"], refused["code"]) == ("error", "overloaded"), refused
    assert "dead letters full (--webhook-max-dead 3" in caplog.text


async def test_on_redis_dead_letters_are_bounded_in_count_and_bytes(
    redis_server: RedisServer,
) -> None:
    text = "y" * 20_000
    with WebhookReceiver(lambda n, body: 500) as receiver:
        relay = relay_process(
            "--broker", redis_server.url, "--webhook", receiver.url, "--lease-seconds", "1",
            "--webhook-backoff", "0.05", "--webhook-max-age", "0.2",
            "--webhook-max-dead", "3", "--webhook-max-dead-bytes", "50000",
        )  # fmt: skip
        await relay.start()
        redis = Redis.from_url(redis_server.url)
        try:
            async with connect(f"{relay.url}/produce?channel=c") as producer:
                await recv_json(producer)  # session
                for n in range(5):
                    await send_json(producer, {"id": f"m{n}", "delta": text, "final": True})
                    assert (await recv_json(producer))["type"] == "ack"
                # One alone over the bytes: dropped at once.
                await send_json(producer, {"id": "huge", "delta": text * 3, "final": True})
                assert (await recv_json(producer))["type"] == "ack"
            await _until(lambda: relay.log.count("is a dead letter") == 6, wait=20)
            kept = await redis.lrange("tr:wh:dead", 0, -1)
            letters = [DeadLetter.model_validate_json(item) for item in kept]
            # Two of 20,000 characters fit in 50,000 bytes: the newest.
            assert [letter.payload.id for letter in letters] == ["m4", "m3"]
            held = sum(len(item) for item in kept)
            assert int(await redis.get("tr:wh:dead:bytes") or 0) == held
            async with httpx.AsyncClient(base_url=relay.url.replace("ws://", "http://")) as http:
                await _until_metric(http, f"relay_webhook_dead_letter_bytes {float(held)}")
                metrics = (await http.get("/metrics")).text
            assert "relay_webhook_dead_letters_dropped_total 4.0" in metrics
            assert "relay_webhook_dead_letters 2.0" in metrics
            assert "dead letters full (--webhook-max-dead 3" in relay.log
        finally:
            await redis.aclose()
            await relay.stop()


async def _until_metric(http: httpx.AsyncClient, line: str) -> None:
    for _ in range(500):
        if line in (await http.get("/metrics")).text:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"/metrics never had {line!r}")


async def test_a_receiver_stalling_its_answers_body_times_out_and_is_retried() -> None:
    answered: list[bool] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        if not answered:  # the first: a status, then 10 of 100 body bytes, then nothing
            answered.append(False)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
            await writer.drain()
            await reader.read()  # until the relay drops the connection
        else:
            answered.append(True)
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    running, relay = await start_relay(webhooks=(url,), **{**FAST, "webhook_timeout": 0.5})
    async with relay:
        await _publish(running, "c", 1)
        await _until(
            lambda: (
                'relay_webhook_deliveries_total{outcome="delivered"} 1.0' in _metrics_now(running)
            )
        )
        metrics = _metrics_now(running)
    server.close()
    assert answered == [False, True]
    assert 'relay_webhook_attempts_total{outcome="timeout"} 1.0' in metrics


async def test_dropped_dead_letters_are_logged_ten_times_then_once_in_a_thousand(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = free_port()
    running, relay = await start_relay(
        webhooks=(f"http://127.0.0.1:{refused}/hook",), webhook_max_dead=1,
        **{**FAST, "webhook_max_age": 0.2},
    )  # fmt: skip
    async with relay:
        await _publish(running, "c", 1012)
        await _until(
            lambda: "relay_webhook_dead_letters_dropped_total 1011.0" in _metrics_now(running),
            wait=60,
        )
    lines = [r.getMessage() for r in caplog.records if "dead letters full" in r.getMessage()]
    assert [line.rsplit("(", 1)[1] for line in lines] == [
        *(f"{n} so far)" for n in range(1, 11)),
        "1000 so far)",
    ]
