"""Admission over real sockets: refused handshakes leave nothing behind; a WebSocket exists
only with the grant its handshake earned."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging

import pytest
from token_relay.core.grants import Role
from token_relay.edge.websocket import WebSocket
from token_relay.tokens import mint
from websockets.asyncio.client import connect

from ..conftest import recv_json, start_relay
from ..harness import eventually, relay_process

SECRET = "admission-test-secret-of-at-least-32-bytes"


async def _status(port: int, request: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 10)
        return int(line.split()[1])
    finally:
        writer.close()


def _handshake(token: str, *, origin: str | None, key: bool) -> bytes:
    lines = [
        f"GET /subscribe?channel=c&token={token} HTTP/1.1",
        "Host: relay",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Version: 13",
    ]
    if key:
        lines.append("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")
    if origin:
        lines.append(f"Origin: {origin}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _granted_connections() -> list[WebSocket]:
    gc.collect()
    return [obj for obj in gc.get_objects() if isinstance(obj, WebSocket)]


async def test_a_thousand_refused_handshakes_leave_nothing_behind() -> None:
    running, relay = await start_relay(
        secret=SECRET, allowed_origins=("https://chat.example",), max_connections_per_ip=10
    )
    token = mint(SECRET, Role.SUBSCRIBE, ["c"], 60)
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        before = len(_granted_connections())
        # Both pass the relay's own check (a valid token), then websockets refuses them:
        # a foreign Origin (403), or no Sec-WebSocket-Key (400).
        cases = [_handshake(token, origin="https://evil.example", key=True)] * 500 + [
            _handshake(token, origin=None, key=False)
        ] * 500
        statuses: list[int] = []
        for start in range(0, len(cases), 50):
            statuses += await asyncio.gather(*(_status(port, c) for c in cases[start : start + 50]))
        assert statuses.count(403) == 500 and statuses.count(400) == 500
        assert relay.gate.per_address == {}
        # Each refused connection is freed once websockets has closed its socket.
        await eventually(lambda: len(_granted_connections()) == before, 10, 0.05)
        # The address's limit of 10 is untouched: ten real connections still get in.
        clients = [
            await connect(f"{running.url}/subscribe?channel=c&token={token}", close_timeout=1)
            for _ in range(10)
        ]
        try:
            for client in clients:
                assert (await recv_json(client))["type"] == "subscribed"
            assert relay.gate.per_address == {"127.0.0.1": 10}
        finally:
            for client in clients:
                await client.close()


async def test_behind_a_trusted_proxy_each_forwarded_client_is_counted_apart() -> None:
    trusting, relay = await start_relay(trusted_proxies=("127.0.0.1/32",), max_connections_per_ip=2)
    untrusting, other = await start_relay(max_connections_per_ip=2)
    async with relay, other:

        async def status(url: str, client: str) -> int | object:
            port = int(url.rsplit(":", 1)[1])
            request = _handshake("x", origin=None, key=True).replace(
                b"Host: relay", f"Host: relay\r\nX-Forwarded-For: {client}".encode()
            )
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request.replace(b"&token=x", b""))
            line = await asyncio.wait_for(reader.readline(), 5)
            return int(line.split()[1]), writer

        held = []
        for client in ("1.1.1.1", "1.1.1.1", "2.2.2.2", "3.3.3.3"):
            code, writer = await status(trusting.url, client)  # type: ignore[misc]
            held.append(writer)
            assert code == 101, client
        code, writer = await status(trusting.url, "1.1.1.1")  # type: ignore[misc]
        held.append(writer)
        assert code == 429  # that client's own limit
        await eventually(lambda: relay.gate.per_address.get("1.1.1.1") == 2)
        # Without --trusted-proxy the header is ignored: everyone is 127.0.0.1.
        for expected in (101, 101, 429):
            code, writer = await status(untrusting.url, "9.9.9.9")  # type: ignore[misc]
            held.append(writer)
            assert code == expected
        for writer in held:
            writer.close()


async def test_refusals_log_the_peer_the_path_and_the_reason() -> None:
    secret = SECRET
    relay = await relay_process(
        "--log-format", "json", "--secret", secret, "--max-connections-per-ip", "1"
    ).start()
    try:
        port = relay.port
        sub_token = mint(secret, Role.SUBSCRIBE, ["c"], 60)
        bad = await _status(port, _handshake("not-a-token", origin=None, key=True))
        wrong_role = await _status(
            port,
            _handshake(sub_token, origin=None, key=True).replace(b"/subscribe", b"/produce"),
        )
        async with connect(f"{relay.url}/subscribe?channel=c&token={sub_token}") as held:
            await recv_json(held)
            limited = await _status(port, _handshake(sub_token, origin=None, key=True))
        assert (bad, wrong_role, limited) == (401, 403, 429)
        await eventually(lambda: relay.log.count('"event": "refused"') >= 3, 5)
    finally:
        await relay.terminate()
    refused = [
        json.loads(line)
        for line in relay.log.splitlines()
        if line.startswith("{") and '"refused"' in line
    ]
    assert [(r["status"], r["path"], r["peer"]) for r in refused] == [
        (401, "/subscribe", "127.0.0.1"),
        (403, "/produce", "127.0.0.1"),
        (429, "/subscribe", "127.0.0.1"),
    ]
    assert refused[0]["reason"].startswith("invalid token:")
    assert refused[1]["reason"] == "this token's role is 'subscribe', not 'produce'"
    assert not any("Role." in r["reason"] or "<" in r["reason"] for r in refused)  # no reprs
    assert sub_token not in relay.log and "not-a-token" not in relay.log


async def test_subscribe_churn_is_rate_limited_and_evicts_no_history() -> None:
    running, relay = await start_relay(max_subscribes_per_second=50, max_history_channels=5)
    async with relay:
        async with running.connect("/produce?channel=real") as producer:
            await producer.send(json.dumps({"id": "m", "delta": "kept", "final": True}))
            await recv_json(producer)
        async with running.connect("/subscribe") as churn:
            codes: dict[str, int] = {}
            for n in range(100):
                for kind in ("subscribe", "unsubscribe"):
                    await churn.send(json.dumps({"type": kind, "channel": f"junk-{n}"}))
            for _ in range(200):
                frame = await recv_json(churn)
                key = frame.get("code", frame["type"])
                codes[key] = codes.get(key, 0) + 1
            assert 40 <= codes.get("rate_limited", 0) <= 160
        async with running.connect("/subscribe") as resumer:
            await resumer.send(json.dumps({"type": "subscribe", "channel": "real"}))
            position = await recv_json(resumer)
            assert position["offset"] == 1
        async with running.connect("/subscribe") as again:
            await again.send(
                json.dumps(
                    {"type": "subscribe", "channel": "real",
                     "since": {"offset": 0, "epoch": position["epoch"]}}
                )
            )  # fmt: skip
            confirmed = await recv_json(again)
            assert (confirmed["recovered"], confirmed["epoch"]) == (True, position["epoch"])
            assert (await recv_json(again))["text"] == "kept"


async def test_a_handshake_trickled_too_slowly_is_cut() -> None:
    running, relay = await start_relay(handshake_timeout=0.5)
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /subscribe HTTP/1.1\r\nHost: relay\r\n")  # and then nothing more
        await writer.drain()
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the relay
        assert asyncio.get_running_loop().time() - started < 3
        writer.close()
        async with running.connect("/subscribe?channel=c") as fine:
            assert (await recv_json(fine))["type"] == "subscribed"


async def _refused_for_timeout(port: int) -> float:
    """``relay_sockets_refused_total{reason="handshake timeout"}``, read from ``/metrics``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
    text = (await asyncio.wait_for(reader.read(), 5)).decode()
    writer.close()
    for line in text.splitlines():
        if line.startswith('relay_sockets_refused_total{reason="handshake timeout"}'):
            return float(line.split()[-1])
    return 0.0


async def test_an_idle_kept_alive_connection_is_closed_quietly_and_a_slow_next_head_is_cut(
    caplog: pytest.LogCaptureFixture,
) -> None:
    running, relay = await start_relay(handshake_timeout=0.5)
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        with caplog.at_level(logging.DEBUG, logger="token_relay"):
            idle = await asyncio.open_connection("127.0.0.1", port)
            slow = await asyncio.open_connection("127.0.0.1", port)
            for reader, writer in (idle, slow):
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
            slow[1].write(b"GET /healthz HTTP/1.1\r\nHo")  # a next head, and then nothing
            started = asyncio.get_running_loop().time()
            # Both are closed past the timeout: the idle one with a FIN, the slow one cut.
            assert await asyncio.wait_for(idle[0].read(), 5) == b""
            with contextlib.suppress(ConnectionResetError):
                assert await asyncio.wait_for(slow[0].read(), 5) == b""
            assert asyncio.get_running_loop().time() - started < 3
            for _, writer in (idle, slow):
                writer.close()
        refusals = [r for r in caplog.records if "refused a socket" in r.getMessage()]
        assert len(refusals) == 1  # the slow head's, not the idle connection's
        assert await _refused_for_timeout(port) == 1


async def test_a_clean_close_is_logged_as_1000_and_a_vanished_peer_as_1006(
    caplog: pytest.LogCaptureFixture,
) -> None:
    running, relay = await start_relay()
    async with relay:
        with caplog.at_level(logging.INFO, logger="token_relay"):
            async with running.connect("/subscribe?channel=c") as clean:
                await recv_json(clean)
            vanishing = await connect(f"{running.url}/subscribe?channel=c")
            await recv_json(vanishing)
            assert vanishing.transport is not None
            vanishing.transport.abort()
            await eventually(
                lambda: len([r for r in caplog.records if getattr(r, "event", "") == "close"]) == 2,
                5,
            )
        codes = [r.code for r in caplog.records if getattr(r, "event", "") == "close"]  # type: ignore[attr-defined]
        assert codes == [1000, 1006]
