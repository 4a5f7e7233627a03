"""Behind a real nginx running ``deploy/nginx.conf``, in front of two relay processes on one
real redis-server: per-client limits, origins, readiness, bodies and a producer that moves."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from token_relay.client import RelayProducer, RelaySubscriber
from token_relay.core.protocol import Aborted, MessageFrame
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from ..conftest import recv_json, send_json
from ..harness import (
    Nginx,
    RedisServer,
    ServiceProcess,
    SseReader,
    eventually,
    relay_process,
)
from .test_ai_sdk import NodeScript
from .test_durable_redis import live_reads_end_with_their_clients

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nginx.conf"
ORIGIN = "https://chat.example"


@contextlib.asynccontextmanager
async def _fleet(
    redis: RedisServer, directory: Path, *flags: str
) -> AsyncIterator[tuple[Nginx, list[ServiceProcess]]]:
    """Two relays on ``redis``, trusting nginx (127.0.0.1), behind the shipped nginx.conf."""
    args = ("--broker", redis.url, "--trusted-proxy", "127.0.0.1", *flags)
    relays = [relay_process(*args, name="relay-a"), relay_process(*args, name="relay-b")]
    await asyncio.gather(*(relay.start() for relay in relays))
    nginx = Nginx(DEPLOY, [relay.port for relay in relays], directory)
    nginx.start()
    try:
        yield nginx, relays
    finally:
        nginx.stop()
        await asyncio.gather(*(relay.stop() for relay in relays))


async def _http(port: int, request: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request.encode())
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    text = data.decode("latin-1")
    return int(text.split()[1]), text


def _get(path: str, *headers: str) -> str:
    return "\r\n".join([f"GET {path} HTTP/1.1", "Host: relay", *headers, "Connection: close"]) + (
        "\r\n\r\n"
    )


async def _subscriber(url: str, source: str) -> ClientConnection | int:
    """A subscriber from ``source`` (a loopback address of its own), or its refusal's status."""
    try:
        ws = await connect(f"{url}/subscribe?channel=crowd", local_addr=(source, 0))
    except InvalidStatus as exc:
        return exc.response.status_code
    assert (await recv_json(ws))["type"] == "subscribed"
    return ws


async def test_600_users_through_nginx_are_each_limited_as_themselves(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async with _fleet(redis_server, tmp_path) as (nginx, relays):
        crowd: list[ClientConnection | int] = []
        sources = [f"127.0.{1 + n // 200}.{1 + n % 200}" for n in range(600)]
        for start in range(0, 600, 50):
            crowd += await asyncio.gather(
                *(_subscriber(nginx.url, s) for s in sources[start : start + 50])
            )
        sockets = [ws for ws in crowd if not isinstance(ws, int)]
        try:
            assert [ws for ws in crowd if isinstance(ws, int)] == []  # no 429 at all
            # Each relay counts and logs the client, not nginx.
            assert "subscriber connected from 127.0.1.7 " in relays[0].log + relays[1].log
            async with connect(f"{nginx.url}/produce?channel=crowd") as producer:
                await recv_json(producer)
                await send_json(producer, {"id": "hello", "delta": "to all 600", "final": True})
                texts = await asyncio.gather(*(recv_json(ws) for ws in sockets))
            assert {frame["text"] for frame in texts} == {"to all 600"}
            # The gateway's own connection was never refused either; one client address
            # past --max-connections-per-ip (256 on each relay) is.
            same: list[ClientConnection | int] = []
            for _ in range(11):
                same += await asyncio.gather(
                    *(_subscriber(nginx.url, "127.0.9.9") for _ in range(50))
                )
            sockets += [ws for ws in same if not isinstance(ws, int)]
            refused = [ws for ws in same if isinstance(ws, int)]
            # nginx spreads them over the two relays, each admitting at most 256.
            assert set(refused) == {429} and len(same) - len(refused) <= 2 * 256
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets))


async def test_origins_readiness_and_bodies_through_nginx(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async with _fleet(redis_server, tmp_path, "--allowed-origin", ORIGIN) as (nginx, _):
        with pytest.raises(InvalidStatus) as refused:
            await connect(f"{nginx.url}/subscribe?channel=c", origin="https://evil.example")  # type: ignore[arg-type]
        assert refused.value.response.status_code == 403
        async with connect(f"{nginx.url}/subscribe?channel=c", origin=ORIGIN) as ws:  # type: ignore[arg-type]
            assert (await recv_json(ws))["type"] == "subscribed"
        # Requests with bodies get real answers, and nobody's WebSocket suffers for them.
        for _ in range(5):
            status, _ = await _http(
                nginx.port,
                "POST /produce HTTP/1.1\r\nHost: relay\r\nContent-Length: 1\r\n"
                "Connection: close\r\n\r\nx",
            )
            assert status == 400  # an HTTP producer whose body is not JSON
        status, _ = await _http(nginx.port, _get("/produce"))
        assert status == 426
        async with connect(f"{nginx.url}/subscribe?channel=c", origin=ORIGIN) as ws:  # type: ignore[arg-type]
            assert (await recv_json(ws))["type"] == "subscribed"
        assert "prematurely closed" not in nginx.errors
        # /readyz follows Redis, through nginx.
        assert (await _http(nginx.port, _get("/readyz")))[0] == 200
        redis_server.kill()

        async def status_is(expected: int) -> bool:
            return (await _http(nginx.port, _get("/readyz")))[0] == expected

        await eventually(lambda: status_is(503), 15)
        redis_server.start()
        await eventually(lambda: status_is(200), 15)


async def _producers_on(relay: ServiceProcess) -> float:
    status, text = await _http(relay.port, _get("/metrics"))
    assert status == 200
    for line in text.splitlines():
        if line.startswith('relay_connections{role="producer"}'):
            return float(line.split()[-1])
    return 0.0


async def test_a_producer_reconnects_through_nginx_and_lands_on_the_other_process(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    flags = ("--session-grace", "15")
    async with _fleet(redis_server, tmp_path, *flags) as (nginx, relays):
        received: list[MessageFrame] = []
        aborted: list[Aborted] = []
        async with (
            RelaySubscriber(nginx.url, ["moving"], deltas=False) as feed,
            RelayProducer(nginx.url, channel="moving", backoff=(0.05, 0.5)) as producer,
        ):

            async def watch() -> None:
                async for frame in feed:
                    if isinstance(frame, MessageFrame):
                        received.append(frame)
                    elif isinstance(frame, Aborted):
                        aborted.append(frame)

            watcher = asyncio.create_task(watch())
            tokens = [f"t{n} " for n in range(40)]
            for token in tokens[:20]:
                await producer.send("m", token)
            counts = [await _producers_on(relay) for relay in relays]
            assert sorted(counts) == [0.0, 1.0]
            holder, other = (relays[0], relays[1]) if counts[0] else (relays[1], relays[0])
            assert await holder.terminate(10) == 0  # a rolling restart of its process
            for token in tokens[20:]:
                await producer.send("m", token)
                await asyncio.sleep(0.005)
            ack = await asyncio.wait_for(producer.finish("m"), 30)
            assert ack.id == "m"
            assert await _producers_on(other) == 1.0
            await eventually(lambda: len(received) >= 1, 15)
            await asyncio.sleep(0.3)
            watcher.cancel()
        assert [frame.text for frame in received] == ["".join(tokens)]
        assert aborted == []
        assert json.loads(json.dumps(ack.id)) == "m"


async def test_sse_streams_through_nginx_unbuffered_and_resume_on_the_other_process(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async with _fleet(redis_server, tmp_path) as (nginx, relays):
        async with (
            SseReader(nginx.port, "/sse?channel=live&deltas=1") as via_nginx,
            SseReader(relays[0].port, "/sse?channel=live&deltas=1") as direct,
            connect(f"{relays[1].url}/produce?channel=live") as producer,
        ):
            assert via_nginx.response_headers["content-type"].startswith("text/event-stream")
            await via_nginx.next()
            await direct.next()
            await recv_json(producer)
            lags = []
            for n in range(20):
                sent = time.perf_counter()
                await send_json(producer, {"id": "m", "delta": f"{n} "})
                # Each delta comes through before the next is sent: nothing is buffered.
                assert (await direct.next(2)).json()["delta"] == f"{n} "
                reached_direct = time.perf_counter()
                assert (await via_nginx.next(2)).json()["delta"] == f"{n} "
                lags.append((time.perf_counter() - sent) - (reached_direct - sent))
            await send_json(producer, {"id": "m", "final": True})
            message = await via_nginx.next()
            assert message.event == "message" and message.id is not None
            print(f"nginx adds {statistics.median(lags) * 1000:.2f} ms per delta (median)")
        # The stream resumes from its last id through nginx, on whichever relay it lands.
        async with connect(f"{relays[0].url}/produce?channel=live") as producer:
            await recv_json(producer)
            await send_json(producer, {"id": "after", "delta": "missed", "final": True})
            await recv_json(producer)
        for _ in range(2):  # nginx alternates: both relays serve the resume
            resume = [("Last-Event-ID", message.id)]
            async with SseReader(nginx.port, "/sse?channel=live", resume) as again:
                assert (await again.next()).json()["recovered"] is True
                missed = (await again.next()).json()
                assert (missed["id"], missed["text"]) == ("after", "missed")


async def _in_progress(relay: ServiceProcess, channel: str, text: str) -> bool:
    """Whether a deltas subscriber joining ``channel`` on ``relay`` gets a snapshot of
    ``text``: the relay holds the message in progress."""
    async with connect(f"{relay.url}/subscribe?channel={channel}&deltas=1") as probe:
        await recv_json(probe)  # subscribed
        try:
            snapshot = await recv_json(probe, 1.0)
        except TimeoutError:
            return False
    return snapshot.get("text") == text


async def test_the_ai_sdk_resumes_through_nginx(
    redis_server: RedisServer, tmp_path: Path, js_clients: Path
) -> None:
    async with _fleet(redis_server, tmp_path) as (nginx, relays):
        async with connect(f"{relays[0].url}/produce?channel=chat-n") as producer:
            await recv_json(producer)
            await send_json(producer, {"id": "r", "delta": "through "})
            # Either relay nginx picks holds the reply in progress (the other through Redis).
            for relay in relays:
                await eventually(
                    functools.partial(_in_progress, relay, "chat-n", "through "),
                    15,
                    what=f"{relay.name} holds the reply so far",
                )
            base = nginx.url.replace("ws://", "http://")

            async def the_rest() -> None:
                await send_json(producer, {"id": "r", "delta": "nginx", "final": True})

            # The relay answers the stream once it joined the channel: the rest comes live.
            resume = NodeScript(js_clients / "ai_sdk_resume.mjs", "ai")
            out = await resume.run_live(the_rest, base, "chat-n")
        got = json.loads(out)
        assert (got["id"], got["text"], got["states"]) == ("r", "through nginx", ["done"])


async def test_a_client_forging_forwarded_headers_through_nginx_is_seen_as_itself(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """nginx overwrites both headers with the address it saw: eight subscribers from one
    client, each claiming another address in both headers, share that client's limit."""
    async with _fleet(redis_server, tmp_path, "--max-connections-per-ip", "1") as (nginx, relays):
        outcomes: list[ClientConnection | int] = []
        for n in range(8):
            forged = {"Forwarded": f"for=10.0.0.{n}", "X-Forwarded-For": f"10.0.1.{n}"}
            try:
                ws = await connect(
                    f"{nginx.url}/subscribe?channel=c",
                    additional_headers=forged,
                    local_addr=("127.0.0.7", 0),
                )
                assert (await recv_json(ws))["type"] == "subscribed"
                outcomes.append(ws)
            except InvalidStatus as exc:
                outcomes.append(exc.response.status_code)
        sockets = [ws for ws in outcomes if not isinstance(ws, int)]
        try:
            # One per relay at most (nginx spreads them over two): the rest get 429.
            assert 1 <= len(sockets) <= 2 and set(outcomes) - set(sockets) == {429}
            log = relays[0].log + relays[1].log
            assert "subscriber connected from 127.0.0.7 " in log
            assert "10.0.0." not in log and "10.0.1." not in log
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets))


async def test_behind_nginx_a_half_closed_post_is_ended_by_nginx_unanswered(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """nginx (the shipped config) ends a request whose client closes its side, before the
    relay's answer comes: the half-close the relay answers directly gets nothing here, so a
    client behind nginx keeps its side open until the answer. With its side open, the same
    request is answered."""
    async with _fleet(redis_server, tmp_path) as (nginx, _):
        port = int(nginx.url.rsplit(":", 1)[1])
        for half_close in (True, False):
            body = json.dumps({"id": f"h{half_close}", "delta": "hi", "final": True})
            request = (
                "POST /produce?channel=h HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
            )
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(request.encode())
                if half_close:
                    writer.write_eof()
                data = await asyncio.wait_for(reader.read(), 10)
            finally:
                writer.close()
            if half_close:
                assert data == b""
            else:
                assert data.startswith(b"HTTP/1.1 200 ") and b'"acks":[{"type":"ack"' in data


async def test_live_reads_whose_clients_go_end_on_the_relays_behind_nginx(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Long-polls and SSE reads through nginx whose clients go away: nginx closes its
    sockets to the relays, and each read ends then on its relay, not at its timeout (30 s
    for a long-poll, 60 s for an SSE response), on a user stream and a channel's alike."""
    async with _fleet(redis_server, tmp_path) as (nginx, relays):
        await live_reads_end_with_their_clients(nginx.port, relays)


_TIME_WAIT, _LISTEN = "06", "0A"


def _sockets_on(ports: set[int]) -> dict[tuple[str, str], str]:
    """This host's TCP sockets whose local port is one of ``ports`` (listening ones left
    out): each one's local and remote address, and its state (``/proc/net/tcp``'s codes)."""
    found = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if int(local.rsplit(":", 1)[1], 16) in ports and state != _LISTEN:
            found[local, remote] = state
    return found


async def test_nginx_reuses_its_connections_to_the_relays_and_closes_them_first(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The shipped config keeps its connections to the relays alive for the next HTTP
    requests: 60 one-shot posts through nginx take a few connections, not 60. Idle, nginx
    closes each one itself (its keepalive_timeout, under the relay's --handshake-timeout),
    so the relay never closes one that nginx may be sending a request on: no relay socket
    is left in TIME_WAIT, the state of the side that closed first."""
    async with _fleet(redis_server, tmp_path) as (nginx, relays):
        ports = {relay.port for relay in relays}
        before = set(_sockets_on(ports))
        for n in range(60):
            body = json.dumps({"id": f"k{n}", "delta": "hi", "final": True})
            status, text = await _http(
                nginx.port,
                "POST /produce?channel=k HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}",
            )
            assert status == 200 and f'"id":"k{n}"' in text, text
        used = set(_sockets_on(ports)) - before
        # One per nginx worker and relay at most (the machine's cores, two relays).
        assert 0 < len(used) <= 2 * (os.cpu_count() or 1), len(used)

        def closed() -> bool:
            states = _sockets_on(ports)
            return all(states.get(pair) in (None, _TIME_WAIT) for pair in used)

        await eventually(closed, 15, what="nginx's idle connections closed")
        states = _sockets_on(ports)
        assert [pair for pair in used if states.get(pair) == _TIME_WAIT] == []
