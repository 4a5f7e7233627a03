"""The HTTP/1.1 edge over real sockets: every plain request gets a real response and a clean
close, keep-alive works, and handshakes in flight are bounded so a slowloris shuts nobody out."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import resource
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from token_relay.edge.server import FD_RESERVE, SWEEP_SLICES
from token_relay.edge.web import MAX_FILE_BYTES, MAX_FILES, StaticFiles
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.frames import Frame, Opcode
from websockets.protocol import CLIENT, Protocol

from ..conftest import recv_json, send_json, start_relay, subscribed_pair
from ..harness import relay_process
from .conftest import OpenRelay

HTTP_PARSERS = ("fast", "h11")
"""Every test runs under both request parsers (see ``tests/conftest.py``)."""


async def _exchange(
    port: int, request: bytes, *, source: str = "127.0.0.1"
) -> tuple[int, dict[str, str], bytes, bool]:
    """Send ``request``; read the response to the end of the connection.

    Returns the status, the headers, the body and whether the relay closed the socket
    cleanly (an EOF rather than a reset).
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        writer.write(request)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        try:
            rest = await asyncio.wait_for(reader.read(), 5)
            clean = True
        except ConnectionResetError:
            rest, clean = b"", False
        return status, headers, rest, clean
    finally:
        writer.close()


def _request(method: str, path: str, *headers: str, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: relay", *headers]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body  # a byte a character


async def test_every_plain_request_gets_a_response_and_a_clean_close() -> None:
    running, relay = await start_relay(max_body_bytes=1000)
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        status, headers, body, clean = await _exchange(port, _request("GET", "/produce"))
        assert (status, headers["upgrade"], clean) == (426, "websocket", True)
        assert headers["connection"].lower() == "close"
        assert b"WebSocket" in body
        # curl -d x .../produce: a POST with a body.
        # curl -d x .../produce: an HTTP producer whose body is not JSON.
        status, headers, body, clean = await _exchange(
            port, _request("POST", "/produce", body=b"x")
        )
        assert (status, clean) == (400, True) and b"invalid_json" in body
        status, headers, _, clean = await _exchange(port, _request("PUT", "/produce", body=b"x"))
        assert (status, headers["allow"], clean) == (405, "GET", True)
        status, headers, _, clean = await _exchange(
            port, _request("POST", "/subscribe", body=b"x" * 500)
        )
        assert (status, clean) == (405, True)
        # A declared body over --max-body-bytes is refused before a byte of it is read.
        big = _request("POST", "/produce", "Content-Length: 10000000")
        status, headers, body, clean = await _exchange(port, big + b"x" * 65536)
        assert (status, clean) == (413, True)
        assert b"1000 bytes" in body
        status, _, body, clean = await _exchange(port, _request("GET", "/nowhere"))
        assert (status, clean) == (404, True)
        assert b"/produce" in body
        status, headers, _, _ = await _exchange(port, _request("DELETE", "/healthz"))
        assert (status, headers["allow"]) == (405, "GET, HEAD")
        status, _, _, clean = await _exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
        assert (status, clean) == (400, True)
        huge_header = _request("GET", "/healthz", "X-Big: " + "y" * 20000)
        status, _, _, _ = await _exchange(port, huge_header)
        assert status == 431
        # And WebSockets connect at once, as before any of it.
        async with running.connect("/subscribe?channel=c") as sub:
            assert (await recv_json(sub))["type"] == "subscribed"
        metrics = relay.metrics.render().decode()
        for status, count in (("426", 1), ("405", 3), ("413", 1), ("404", 1), ("431", 1)):
            assert f'relay_http_refusals_total{{status="{status}"}} {count}.0' in metrics


async def test_keep_alive_serves_several_requests_on_one_socket() -> None:
    running, relay = await start_relay()
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            # Two pipelined requests, then a third after the answers.
            writer.write(_request("GET", "/healthz") + _request("HEAD", "/readyz"))
            first = await asyncio.wait_for(reader.readuntil(b"ok\n"), 5)
            assert first.startswith(b"HTTP/1.1 200 ")
            second = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert second.startswith(b"HTTP/1.1 200 ") and b"content-length: 6" in second.lower()
            writer.write(_request("GET", "/metrics"))
            third = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert third.startswith(b"HTTP/1.1 200 ")
            assert b"connection: close" not in third.lower()
        finally:
            writer.close()


async def test_requests_with_bodies_never_stall_websockets() -> None:
    """The report: two ``curl -d`` requests made every WebSocket connect fail for 10 s."""
    running, relay = await start_relay()
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        for _ in range(20):
            status, _, _, clean = await _exchange(port, _request("POST", "/produce", body=b"x"))
            assert (status, clean) == (400, True)
        started = asyncio.get_running_loop().time()
        async with subscribed_pair(running) as (sub, producer):
            await send_json(producer, {"id": "m", "delta": "fine", "final": True})
            assert (await recv_json(sub))["text"] == "fine"
        assert asyncio.get_running_loop().time() - started < 2


async def test_fragmented_messages_are_assembled(open_relay: OpenRelay) -> None:
    async with open_relay() as (_, sub, producer):
        frame = json.dumps({"id": "m", "delta": "in three parts", "final": True})
        await producer.send([frame[:5], frame[5:17], frame[17:]])
        assert (await recv_json(sub))["text"] == "in three parts"


async def test_a_silent_peer_is_cut_by_the_keepalive_and_a_live_one_is_not() -> None:
    running, relay = await start_relay(ping_interval=0.2)
    port = int(running.url.rsplit(":", 1)[1])
    async with relay, running.connect("/subscribe?channel=live") as live:
        await recv_json(live)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            _request(
                "GET",
                "/subscribe?channel=c",
                "Upgrade: websocket",
                "Connection: Upgrade",
                "Sec-WebSocket-Version: 13",
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            )
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 101 ")
        # It reads (the pings arrive) but never answers: cut within two intervals.
        started = asyncio.get_running_loop().time()
        while await asyncio.wait_for(reader.read(65536), 5):
            pass
        assert asyncio.get_running_loop().time() - started < 2
        writer.close()
        # websockets' client answers every ping: it is still here after ten intervals.
        await asyncio.sleep(2)
        await live.send(json.dumps({"type": "subscribe", "channel": "other"}))
        assert (await recv_json(live))["type"] == "subscribed"


async def _pinged(port: int, seconds: float, times: list[float]) -> None:
    """A subscriber that answers pings (as a browser does) and notes when each came."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    upgrade = ("Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13")
    writer.write(_request("GET", "/subscribe?channel=c", *upgrade, f"Sec-WebSocket-Key: {key}"))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 101 ")
    client, loop = Protocol(CLIENT), asyncio.get_running_loop()
    end = loop.time() + seconds
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(end):
            while data := await reader.read(65536):
                client.receive_data(data)
                for event in client.events_received():
                    if isinstance(event, Frame) and event.opcode is Opcode.PING:
                        times.append(loop.time())
                for pong in client.data_to_send():
                    writer.write(pong)
    writer.close()


async def test_the_keepalive_pings_every_peer_once_an_interval_spread_over_it() -> None:
    interval, peers = 1.28, 96
    running, relay = await start_relay(
        ping_interval=interval, max_handshakes_per_ip=1000, max_connections_per_ip=1000
    )
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        pings: list[list[float]] = [[] for _ in range(peers)]
        await asyncio.gather(*(_pinged(port, 2.2 * interval, times) for times in pings))
    # Each peer is pinged once an interval, at its own phase, and answers, so none is cut.
    assert all(len(times) in (2, 3) for times in pings), [len(times) for times in pings]
    gaps = [later - first for times in pings for first, later in itertools.pairwise(times)]
    assert all(0.5 * interval < gap < 1.5 * interval for gap in gaps), gaps
    # Spread over the interval in slices, not all sent in one pass of the loop.
    firsts = sorted(times[0] for times in pings)
    assert firsts[-1] - firsts[0] > interval / 2, firsts
    slices = {round((first - firsts[0]) / (interval / SWEEP_SLICES)) for first in firsts}
    assert len(slices) >= 16, sorted(slices)


@contextlib.asynccontextmanager
async def _trickling(
    port: int, count: int, sources: list[str]
) -> AsyncIterator[list[socket.socket]]:
    """``count`` sockets that each sent half a request head, spread over ``sources``."""
    loop = asyncio.get_running_loop()
    held: list[socket.socket] = []
    try:
        for n in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.bind((sources[n % len(sources)], 0))
            with contextlib.suppress(OSError):
                await loop.sock_connect(sock, ("127.0.0.1", port))
                await loop.sock_sendall(sock, b"GET /subscribe?channel=c HTTP/1.1\r\nHost: r")
            held.append(sock)
        yield held
    finally:
        for sock in held:
            sock.close()


def _alive(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


async def test_handshakes_in_flight_are_bounded_per_address_and_in_all() -> None:
    running, relay = await start_relay(max_handshakes=100, max_handshakes_per_ip=20)
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        # One address: 20 held, the rest refused at once with 429.
        async with _trickling(port, 20, ["127.0.0.2"]):
            status, _, body, _ = await _exchange(
                port, _request("GET", "/healthz"), source="127.0.0.2"
            )
            assert status == 429 and b"handshakes" in body
            assert relay.metrics.handshakes.collect()[0].samples[0].value == 20
            # Another address is untouched.
            status, _, _, _ = await _exchange(
                port, _request("GET", "/healthz", "Connection: close")
            )
            assert status == 200
        # Many addresses past the global bound: the oldest are cut, and the canary gets in.
        sources = [f"127.0.1.{n}" for n in range(1, 31)]
        async with _trickling(port, 300, sources) as held:
            await asyncio.sleep(0.1)
            assert len(relay.server.handshaking) <= 100 if relay.server else False
            async with running.connect("/subscribe?channel=c") as canary:
                assert (await recv_json(canary))["type"] == "subscribed"
            assert not _alive(held[0]) and _alive(held[-1])
        await asyncio.sleep(0.1)
        assert relay.server is not None and not relay.server.handshaking
        metrics = relay.metrics.render().decode()
        assert 'reason="too many handshakes in flight from this address"} 1.0' in metrics
        assert 'reason="too many handshakes in flight"}' in metrics
        assert "relay_handshakes_in_flight 0.0" in metrics


@pytest.fixture
def low_fd_limit() -> tuple[int, int]:
    """The soft limit on open files that a relay started now inherits: 400."""
    return 400, resource.getrlimit(resource.RLIMIT_NOFILE)[1]


async def test_a_slowloris_against_a_low_fd_limit_never_shuts_out_a_canary(
    low_fd_limit: tuple[int, int],
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, low_fd_limit)
    try:
        relay = relay_process("--max-handshakes", "100000", "--max-handshakes-per-ip", "100000")
        await relay.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        room = low_fd_limit[0] - FD_RESERVE
        tried = succeeded = 0
        async with _trickling(relay.port, room + 200, ["127.0.0.1"]):
            for _ in range(20):
                tried += 1
                with contextlib.suppress(OSError, asyncio.TimeoutError):
                    async with connect(f"{relay.url}/subscribe?channel=c", open_timeout=5) as ws:
                        if (await recv_json(ws))["type"] == "subscribed":
                            succeeded += 1
        assert (tried, succeeded) == (20, 20)
        assert "out of resource" not in relay.log and "Too many open files" not in relay.log
        assert "file descriptors low" in relay.log
    finally:
        await relay.stop()


async def test_a_burst_of_handshakes_from_one_address_cannot_pass_its_limit() -> None:
    running, relay = await start_relay(max_connections_per_ip=10)
    async with relay:

        async def one() -> object:
            try:
                return await connect(f"{running.url}/subscribe?channel=c")
            except InvalidStatus as exc:
                return exc.response.status_code

        outcomes = await asyncio.gather(*(one() for _ in range(40)))
        admitted = [ws for ws in outcomes if not isinstance(ws, int)]
        try:
            assert len(admitted) == 10 and outcomes.count(429) == 30
        finally:
            await asyncio.gather(*(ws.close() for ws in admitted))  # type: ignore[attr-defined]


async def test_web_root_serves_its_sub_folders_and_a_linked_one_within_its_limits(
    tmp_path: Path,
) -> None:
    root, elsewhere = tmp_path / "site", tmp_path / "package"
    (root / "assets" / "a" / "b" / "c" / "d").mkdir(parents=True)
    elsewhere.mkdir()
    (root / "index.html").write_text("<p>home</p>")
    (root / "assets" / "app.js").write_text("export const x = 1;")
    (root / "assets" / "a" / "b" / "c" / "deep.css").write_text("p{}")
    (root / "assets" / "a" / "b" / "c" / "d" / "too-deep.css").write_text("p{}")
    (root / ".secret.json").write_text("{}")
    (root / "big.js").write_bytes(b"x" * (MAX_FILE_BYTES + 1))
    (root / "notes.txt").write_text("no type, not served")
    (elsewhere / "client.js").write_text("export class C {}")
    (root / "lib").symlink_to(elsewhere)
    running, relay = await start_relay(web_root=str(root))
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:

        async def get(path: str) -> tuple[int, bytes]:
            request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            status, _headers, body, _ = await _exchange(port, request.encode())
            return status, body

        assert await get("/") == (200, b"<p>home</p>")
        assert await get("/assets/app.js") == (200, b"export const x = 1;")
        assert await get("/assets/a/b/c/deep.css") == (200, b"p{}")
        assert await get("/lib/client.js") == (200, b"export class C {}")
        for missing in (
            "/assets/a/b/c/d/too-deep.css",
            "/.secret.json",
            "/big.js",
            "/notes.txt",
            "/assets/../index.html",
            "/assets",
        ):
            assert (await get(missing))[0] == 404, missing
    # At most MAX_FILES files are kept, whatever the tree holds.
    many = tmp_path / "many"
    many.mkdir()
    for n in range(MAX_FILES + 10):
        (many / f"f{n:04}.js").write_text("1")
    assert len(StaticFiles(many).files) == MAX_FILES


async def test_every_accepted_socket_sends_small_frames_at_once() -> None:
    """TCP_NODELAY on each accepted connection: a frame written just after another (a
    snapshot after its subscribe's confirmation, an SSE event after another) goes out at
    once, not after the client's delayed ACK."""
    running, relay = await start_relay()
    async with relay, running.connect("/subscribe?channel=c") as subscriber:
        assert (await recv_json(subscriber))["type"] == "subscribed"
        [peer] = list(running.relay.subscribers.router.hub.subscribers("c"))
        sock = peer.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
