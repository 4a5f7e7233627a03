"""End to end: tokens, origins, limits, slow subscribers, metrics, logs and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time

import jwt
import pytest
from token_relay.core.grants import Role
from token_relay.tokens import mint
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.uri import parse_uri

from ..conftest import (
    RunningRelay,
    assert_silent,
    connect,
    open_producer,
    recv_json,
    send_json,
    start_relay,
)
from ..harness import relay_process
from .conftest import OpenRelay

SECRET = "test-secret-of-some-length-0123456789"


def token(role: Role, *channels: str, ttl: float = 60) -> str:
    return mint(SECRET, role, list(channels), ttl)


async def refused(running: RunningRelay, path: str, **kwargs: object) -> int:
    with pytest.raises(InvalidStatus) as refusal:
        async with running.connect(path, **kwargs):
            pass
    status: int = refusal.value.response.status_code
    return status


# ---------------------------------------------------------------- authentication


async def test_handshake_refuses_missing_bad_expired_and_wrong_role_tokens() -> None:
    running, relay = await start_relay(secret=SECRET)
    async with relay:
        expired = jwt.encode(
            {"role": "subscribe", "channels": ["*"], "exp": int(time.time()) - 5},
            SECRET,
            algorithm="HS256",
        )
        forged = mint("another-secret-entirely-0123456789", Role.SUBSCRIBE, ["*"], 60)
        assert await refused(running, "/subscribe?channel=c") == 401
        assert await refused(running, "/subscribe?channel=c&token=garbage") == 401
        assert await refused(running, f"/subscribe?channel=c&token={expired}") == 401
        assert await refused(running, f"/subscribe?channel=c&token={forged}") == 401
        produce_token = token(Role.PRODUCE, "*")
        assert await refused(running, f"/subscribe?token={produce_token}") == 403
        narrow = token(Role.PRODUCE, "chat-*")
        assert await refused(running, f"/produce?channel=other&token={narrow}") == 403


async def test_tokens_grant_exact_and_glob_channels_and_forbid_the_rest() -> None:
    running, relay = await start_relay(secret=SECRET)
    async with relay:
        sub_token = token(Role.SUBSCRIBE, "chat-*", "lobby")
        pub_token = token(Role.PRODUCE, "chat-*")
        async with (
            running.connect(f"/subscribe?channel=chat-1&token={sub_token}") as sub,
            running.connect(
                "/produce?channel=chat-1",
                additional_headers={"Authorization": f"Bearer {pub_token}"},
            ) as producer,
        ):
            assert (await recv_json(sub))["type"] == "subscribed"
            await send_json(sub, {"type": "subscribe", "channel": "lobby"})
            assert (await recv_json(sub))["channel"] == "lobby"
            await send_json(sub, {"type": "subscribe", "channel": "secret-room"})
            error = await recv_json(sub)
            assert (error["type"], error["code"]) == ("error", "forbidden")
            await send_json(sub, {"type": "cancel", "channel": "secret-room", "id": "x"})
            assert (await recv_json(sub))["code"] == "forbidden"

            await send_json(producer, {"id": "m", "delta": "x", "channel": "lobby"})
            error = await recv_json(producer)
            assert (error["code"], error["id"]) == ("forbidden", "m")
            await send_json(producer, {"id": "ok", "delta": "allowed", "final": True})
            assert (await recv_json(producer))["type"] == "ack"
            assert (await recv_json(sub))["text"] == "allowed"


async def test_token_command_mints_a_token_the_relay_accepts() -> None:
    result = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "token_relay",
            "token",
            "--role",
            "subscribe",
            "--channel",
            "chat-*",
            "--ttl",
            "3600",
            "--secret",
            SECRET,
        ],
        capture_output=True,
        check=True,
        timeout=30,
    )
    minted = result.stdout.decode().strip()
    claims = jwt.decode(minted, SECRET, algorithms=["HS256"])
    assert claims["role"] == "subscribe" and claims["channels"] == ["chat-*"]
    assert 3500 < claims["exp"] - time.time() <= 3600
    running, relay = await start_relay(secret=SECRET)
    async with relay, running.connect(f"/subscribe?channel=chat-9&token={minted}") as sub:
        assert (await recv_json(sub))["type"] == "subscribed"


def test_open_relay_on_a_public_address_refuses_to_start() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "token_relay", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert b"without a secret" in result.stderr


# ---------------------------------------------------------------- origins and limits


async def test_origins_are_checked_for_browsers_only() -> None:
    running, relay = await start_relay(allowed_origins=("https://chat.example",))
    async with relay:
        status = await refused(running, "/subscribe?channel=c", origin="https://evil.example")
        assert status == 403
        async with running.connect("/subscribe?channel=c", origin="https://chat.example") as ok:
            assert (await recv_json(ok))["type"] == "subscribed"
        async with running.connect("/subscribe?channel=c") as gateway_like:
            assert (await recv_json(gateway_like))["type"] == "subscribed"


async def test_connections_per_address_are_limited() -> None:
    running, relay = await start_relay(max_connections_per_ip=2)
    async with relay, running.connect("/subscribe") as one, running.connect("/produce") as two:
        assert await refused(running, "/subscribe") == 429
        await one.close()
        await asyncio.sleep(0.05)
        async with running.connect("/subscribe"):
            pass
        assert two.state.name == "OPEN"


async def test_event_rate_is_limited_and_refused_events_are_not_applied(
    open_relay: OpenRelay,
) -> None:
    async with open_relay(max_events_per_second=5) as (_, sub, producer):
        for i in range(10):
            await send_json(producer, {"id": "m", "delta": str(i)})
        errors = [await recv_json(producer) for _ in range(5)]
        assert {(e["code"], e["id"]) for e in errors} == {("rate_limited", "m")}
        await assert_silent(producer, 0.1)
        await asyncio.sleep(0.25)
        await send_json(producer, {"id": "m", "final": True})
        assert (await recv_json(producer))["type"] == "ack"
        assert (await recv_json(sub))["text"] == "01234"


async def test_a_message_over_the_size_limit_is_aborted(open_relay: OpenRelay) -> None:
    async with open_relay(max_message_chars=10) as (_, sub, producer):
        await send_json(producer, {"id": "big", "delta": "123456"})
        await send_json(producer, {"id": "small", "delta": "fine"})
        await send_json(producer, {"id": "big", "delta": "78901"})
        error = await recv_json(producer)
        assert (error["code"], error["id"]) == ("message_too_large", "big")
        aborted = await recv_json(sub)
        assert (aborted["type"], aborted["id"], aborted["text"], aborted["reason"]) == (
            "aborted",
            "big",
            "123456",
            "message_too_large",
        )
        await send_json(producer, {"id": "small", "final": True})
        assert (await recv_json(sub))["text"] == "fine"


# ---------------------------------------------------------------- slow subscribers


async def test_slow_subscriber_gets_merged_deltas_and_the_exact_text() -> None:
    running, relay = await start_relay(
        subscriber_high_water_bytes=4096,
        max_subscriber_buffer_bytes=64 * 1024 * 1024,
        max_message_chars=16 * 1024 * 1024,
    )
    async with (
        relay,
        running.connect("/subscribe?channel=c&deltas=1", max_size=None) as fast,
        running.connect("/subscribe?channel=c&deltas=1", max_size=None) as slow,
        running.connect("/produce?channel=c") as producer,
    ):
        await recv_json(fast)
        await recv_json(slow)
        slow.transport.pause_reading()
        tokens = [f"token{i:05d} " + "x" * 4000 for i in range(2000)]

        async def read_fast() -> list[str]:
            deltas = []
            while (frame := await recv_json(fast))["type"] == "delta":
                deltas.append(frame["delta"])
            return deltas

        fast_reader = asyncio.create_task(read_fast())
        for piece in tokens:
            await send_json(producer, {"id": "m", "delta": piece})
        await send_json(producer, {"id": "m", "final": True})
        assert (await recv_json(producer))["type"] == "ack"
        fast_deltas = await fast_reader
        assert "".join(fast_deltas) == "".join(tokens)
        slow.transport.resume_reading()
        received, frames = "", 0
        while True:
            frame = await recv_json(slow, 10)
            if frame["type"] == "message":
                break
            assert frame["type"] == "delta"
            received += frame["delta"]
            frames += 1
        assert received == "".join(tokens) == frame["text"]
        # The socket buffers take the first few megabytes; past them, 16 tokens go per frame.
        assert frames < len(tokens) * 3 / 4
        coalesced = relay.metrics.deltas_coalesced.value
        assert coalesced == 2 * len(tokens) - frames - len(fast_deltas)


async def test_metrics_endpoint_reports_the_relay(open_relay: OpenRelay) -> None:
    async with open_relay(deltas=True) as (running, _, producer):
        await send_json(producer, {"id": "m", "delta": "a"})
        await send_json(producer, {"id": "m", "delta": "b", "final": True})
        await send_json(producer, "not an event")
        await recv_json(producer)
        await recv_json(producer)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", int(running.url.rsplit(":", 1)[1])
        )
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: relay\r\n\r\n")
        await writer.drain()
        text = (await asyncio.wait_for(reader.read(1 << 20), 5)).decode()
        writer.close()
    assert text.startswith("HTTP/1.1 200")
    lines = set(text.splitlines())
    assert 'relay_connections{role="producer"} 1.0' in lines
    assert 'relay_connections{role="subscriber"} 1.0' in lines
    assert 'relay_messages_total{outcome="completed"} 1.0' in lines
    assert 'relay_errors_total{code="invalid_json"} 1.0' in lines
    assert 'relay_frames_in_total{role="producer"} 3.0' in lines
    assert "relay_time_to_first_delta_seconds_count 1.0" in lines
    assert "relay_delta_gap_seconds_count 1.0" in lines
    assert "relay_final_to_delivery_seconds_count 1.0" in lines


# ---------------------------------------------------------------- shutdown and logs


async def test_shutdown_aborts_messages_in_flight_before_closing_with_1001() -> None:
    running, relay = await start_relay()
    async with running.connect("/subscribe?channel=c") as sub:
        await recv_json(sub)
        async with running.connect("/produce?channel=c") as producer:
            await send_json(producer, {"id": "m", "delta": "half a thought"})
            await asyncio.sleep(0.05)
            await relay.stop()
            aborted = await recv_json(sub)
            assert (aborted["type"], aborted["text"], aborted["reason"]) == (
                "aborted",
                "half a thought",
                "shutdown",
            )
            with pytest.raises(ConnectionClosed) as closed:
                await recv_json(sub)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
            with pytest.raises(ConnectionClosed):
                await recv_json(producer)


async def test_sigterm_during_traffic_aborts_and_exits_cleanly_with_json_logs() -> None:
    relay = await relay_process(
        "--log-format", "json", "--secret", SECRET, "--shutdown-timeout", "1"
    ).start()
    sub_token = token(Role.SUBSCRIBE, "c")
    timings: list[float] = []
    try:
        async with (
            connect(f"{relay.url}/subscribe?channel=c&token={sub_token}") as sub,
            # By the time this producer closes, the relay has exited: nobody is left to
            # answer its close handshake, so it need not wait for one.
            open_producer(
                f"{relay.url}/produce?channel=c&token={token(Role.PRODUCE, 'c')}",
                close_timeout=0.1,
            ) as producer,
        ):
            await recv_json(sub)
            for i in range(20):
                await send_json(producer, {"id": f"done{i}", "delta": "ok", "final": True})
            await send_json(producer, {"id": "open", "delta": "cut short"})
            for i in range(20):
                assert (await recv_json(sub))["id"] == f"done{i}"
            assert relay.process is not None
            started = time.monotonic()
            relay.process.terminate()
            exited = asyncio.ensure_future(relay.process.wait())
            exited.add_done_callback(lambda _: timings.append(time.monotonic() - started))
            aborted = await recv_json(sub, 5)
            assert (aborted["id"], aborted["reason"]) == ("open", "shutdown")
            with pytest.raises(ConnectionClosed) as closed:
                await recv_json(sub, 5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
            assert await asyncio.wait_for(exited, 10) == 0
        # The producer never reads its acks, so it never answers the close handshake
        # either; the relay still exits, soon after --shutdown-timeout.
        assert timings[0] < 8
        await relay.wait()
        log = relay.log
    finally:
        await relay.stop()
    assert SECRET not in log and sub_token not in log
    entries = [json.loads(line) for line in log.splitlines() if line.strip()]
    events = [(e.get("event"), e.get("role")) for e in entries]
    assert events.count(("open", "subscriber")) == 1 and events.count(("close", "subscriber")) == 1
    assert events.count(("open", "producer")) == 1 and events.count(("close", "producer")) == 1
    assert all({"time", "level", "message"} <= set(e) for e in entries)


async def test_a_batch_over_the_rate_is_refused_whole(open_relay: OpenRelay) -> None:
    async with open_relay(max_events_per_second=10) as (_, sub, producer):
        await send_json(producer, [{"id": "m", "delta": str(i)} for i in range(11)])
        error = await recv_json(producer)
        assert (error["code"], error["id"]) == ("rate_limited", None)
        assert "none of this batch's 11 events" in error["message"]
        await send_json(producer, [{"id": "m", "delta": "ok"}, {"id": "m", "final": True}])
        assert (await recv_json(producer))["type"] == "acks"
        assert (await recv_json(sub))["text"] == "ok"


async def test_a_peer_that_pings_without_reading_is_cut_and_others_go_on() -> None:
    running, relay = await start_relay(max_subscriber_buffer_bytes=256 * 1024)
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that won't
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/subscribe"))
        protocol.send_request(protocol.connect())
        writer.write(b"".join(protocol.data_to_send()))
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101")
        ping = bytes([0x89, 0x80 | 125]) + b"\0\0\0\0" + b"p" * 125  # masked with zeros
        cut = False
        with contextlib.suppress(ConnectionError, OSError):
            for _ in range(2000):  # up to ~25 MB of pongs owed, never read
                writer.write(ping * 100)
                await writer.drain()
        with contextlib.suppress(ConnectionError, OSError):
            await asyncio.wait_for(reader.read(), 5)  # EOF or reset once cut
        cut = writer.transport.is_closing() or reader.at_eof()
        assert cut
        writer.close()
        assert relay.gate.per_address == {}
        async with running.connect("/subscribe?channel=ok") as fine:
            assert (await recv_json(fine))["type"] == "subscribed"
