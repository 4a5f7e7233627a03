"""Documented promises about how connections and commands end, each proved over real sockets
or by running the real command:

* a peer that never answers the close handshake is cut at ``--shutdown-timeout``
  (docs/reference/flags.md, docs/how-to/rolling-restarts.md);
* an SSE stream ended for a slow reader, or by a shutdown, ends with a comment naming the close
  code, 1013, and 1001 or 1012 (docs/reference/protocol.md);
* ``token-relay token`` exits 2 for a grant with a wildcard inside it (docs/how-to/security.md);
* the JavaScript client (in Chromium) falls back to SSE when a WebSocket upgrade is never answered,
  after ``openTimeout``, and its defaults are those the docs give (docs/how-to/browser-client.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h11
import pytest
from playwright.async_api import Page

from ..conftest import NO_SWEEPS, RunningRelay, recv_json, send_json, start_relay
from ..docs.blocks import docs_block
from ..harness import RedisServer

SHUTDOWN_TIMEOUT = 0.5
"""The ``--shutdown-timeout`` of the shutdown tests: short, so that they are quick."""
CUT_MARGIN = 2.0
"""How long after the shutdown deadline a socket may still take to be seen cut, for a loaded
machine. It stays under the 5 s a WebSocket's own close handshake waits before the socket is
cut anyway, so a relay that cuts nothing at its deadline fails."""
UPGRADE = (
    "Upgrade: websocket",
    "Connection: Upgrade",
    "Sec-WebSocket-Version: 13",
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
)


def _port(running: RunningRelay) -> int:
    return int(running.url.rsplit(":", 1)[1])


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    """The unmasked WebSocket frames in ``data``, as (opcode, payload); a frame cut short at
    the end is left out."""
    frames, at = [], 0
    while at + 2 <= len(data):
        opcode, length = data[at] & 0x0F, data[at + 1] & 0x7F
        at += 2
        if length == 126:
            (length,) = struct.unpack_from("!H", data, at)
            at += 2
        elif length == 127:
            (length,) = struct.unpack_from("!Q", data, at)
            at += 8
        if at + length > len(data):
            break
        frames.append((opcode, data[at : at + length]))
        at += length
    return frames


async def _read_until_cut(reader: asyncio.StreamReader, into: bytearray) -> float:
    """Read (and never answer) until the socket ends; the time it ended (EOF or reset)."""
    try:
        while chunk := await reader.read(65536):
            into.extend(chunk)
    except ConnectionResetError:
        pass
    return time.monotonic()


async def test_a_peer_deaf_to_the_close_handshake_is_cut_at_the_shutdown_timeout() -> None:
    running, relay = await start_relay(shutdown_timeout=SHUTDOWN_TIMEOUT, **NO_SWEEPS)
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(running))
    try:
        # A WebSocket handshake, then nothing: the peer reads what comes but never writes a
        # byte, so it never answers the relay's close frame.
        lines = ["GET /subscribe?channel=c HTTP/1.1", "Host: relay", *UPGRADE]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 101 "), head
        received = bytearray()
        cut = asyncio.ensure_future(_read_until_cut(reader, received))
        began = time.monotonic()
        deadline = began + SHUTDOWN_TIMEOUT + CUT_MARGIN
        try:
            await asyncio.wait_for(relay.stop(), deadline - time.monotonic())
        except TimeoutError:
            pytest.fail(f"stopping took more than {SHUTDOWN_TIMEOUT + CUT_MARGIN:g} s")
        try:
            cut_at = await asyncio.wait_for(cut, max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            pytest.fail(
                f"the peer was still connected {SHUTDOWN_TIMEOUT + CUT_MARGIN:g} s after the "
                f"shutdown began (--shutdown-timeout {SHUTDOWN_TIMEOUT:g} s)"
            )
        assert cut_at <= deadline
        # It was offered the close handshake first: a close frame with 1001 (going away).
        frames = _frames(bytes(received))
        assert frames and frames[-1][0] == 0x8, frames
        assert struct.unpack("!H", frames[-1][1][:2])[0] == 1001, frames[-1]
    finally:
        writer.transport.abort()
        await relay.stop()


# ----------------------------------------------------------------------- SSE's last comment


class RawSse:
    """``GET path`` as an SSE stream over one real socket, whose body is kept byte for byte;
    its reading can be paused, as a client that stops reading does."""

    def __init__(self, port: int, path: str) -> None:
        self.port, self.path = port, path
        self.body = bytearray()
        self.ended = False
        self._http = h11.Connection(h11.CLIENT)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self, receive_buffer: int | None = None) -> None:
        """Send the request and read the response head (a 200)."""
        sock = socket.socket()
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        self._reader, self._writer = await asyncio.open_connection(sock=sock)
        request = h11.Request(
            method="GET",
            target=self.path,
            headers=[("Host", "relay"), ("Accept", "text/event-stream")],
        )
        self._writer.write(self._http.send(request) + self._http.send(h11.EndOfMessage()))
        event = await asyncio.wait_for(self._next(), 5)
        assert isinstance(event, h11.Response) and event.status_code == 200, event

    async def _next(self) -> Any:
        assert self._reader is not None
        while (event := self._http.next_event()) is h11.NEED_DATA:
            self._http.receive_data(await self._reader.read(65536))
        return event

    async def read_until(self, text: bytes, wait: float = 5.0) -> None:
        """Read until the body holds ``text``."""
        async with asyncio.timeout(wait):
            while text not in self.body:
                event = await self._next()
                assert isinstance(event, h11.Data), f"the stream ended first: {event}"
                self.body += event.data

    async def read_to_end(self, wait: float = 5.0) -> bytes:
        """Read the rest of the body until the response ends and the socket closes."""
        async with asyncio.timeout(wait):
            while not self.ended:
                event = await self._next()
                if isinstance(event, h11.Data):
                    self.body += event.data
                else:
                    assert isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)), event
                    self.ended = True
            assert self._reader is not None
            while not self._reader.at_eof():  # and then the socket is closed
                assert await self._reader.read(65536) == b""
        return bytes(self.body)

    def _transport(self) -> asyncio.Transport:
        assert self._writer is not None
        transport = self._writer.transport
        assert isinstance(transport, asyncio.Transport)
        return transport

    def pause(self) -> None:
        self._transport().pause_reading()

    def resume(self) -> None:
        self._transport().resume_reading()

    def cut(self) -> None:
        if self._writer is not None:
            self._writer.transport.abort()


def _last_block(body: bytes) -> list[str]:
    """The lines of the stream's last SSE block (what follows the last blank line)."""
    blocks = [block for block in body.decode().split("\n\n") if block]
    assert blocks, body
    return blocks[-1].split("\n")


def _assert_ends_with_a_comment_naming(body: bytes, code: int) -> None:
    last = _last_block(body)
    shown = [line[:120] for line in last]
    assert all(line.startswith(":") for line in last), f"the stream's last block: {shown}"
    assert any(re.search(rf"\b{code}\b", line) for line in last), f"no {code} in {shown}"


async def test_a_slow_sse_reader_is_ended_after_a_comment_naming_1013() -> None:
    running, relay = await start_relay(
        subscriber_high_water_bytes=4096, max_subscriber_buffer_bytes=65536, **NO_SWEEPS
    )
    stuck = RawSse(_port(running), "/sse?channel=c")
    async with relay:
        try:
            await stuck.open(receive_buffer=4096)
            await stuck.read_until(b"event: subscribed")
            stuck.pause()  # it stops reading: the relay's unsent bytes to it pile up
            async with running.connect("/produce?channel=c") as producer:
                for n in range(2000):
                    await send_json(producer, {"id": f"m{n}", "delta": "x" * 20_000, "final": True})
                    assert (await recv_json(producer))["type"] == "ack"
                    if relay.metrics.slow_closes.value:
                        break
            assert relay.metrics.slow_closes.value == 1
            stuck.resume()
            body = await stuck.read_to_end()
        finally:
            stuck.cut()
    _assert_ends_with_a_comment_naming(body, 1013)


@pytest.mark.parametrize("broker", ["memory", "redis"])
async def test_an_sse_stream_ended_by_a_shutdown_says_1001_or_1012(
    broker: str, tmp_path: Path
) -> None:
    """With the memory broker the relay goes away (1001); with Redis it hands off, a
    restart (1012): see docs/how-to/rolling-restarts.md."""
    redis = RedisServer(tmp_path) if broker == "redis" else None
    settings: dict[str, Any] = {"shutdown_timeout": SHUTDOWN_TIMEOUT, **NO_SWEEPS}
    if redis is not None:
        redis.start()
        settings["broker"] = redis.url
    try:
        running, relay = await start_relay(**settings)
        stream = RawSse(_port(running), "/sse?channel=c")
        try:
            await stream.open()
            await stream.read_until(b"event: subscribed")
            await relay.stop()
            body = await stream.read_to_end()
        finally:
            stream.cut()
            await relay.stop()
    finally:
        if redis is not None:
            redis.kill()
    _assert_ends_with_a_comment_naming(body, 1012 if redis is not None else 1001)


# ----------------------------------------------------------------------- the CLI

SECRET = "a-secret-of-32-bytes-or-more-...."


def _documented_token_command(grant: str) -> list[str]:
    """The security page's ``token-relay token`` command (as ``python -m token_relay``), its
    grant replaced by ``grant``."""
    words = shlex.split(docs_block("security-token-cli"))
    args = words[words.index("token-relay") + 1 :]
    at = args.index("--channel") + 1
    assert args[at] == "chat-*", args  # the page's own grant, which mints a token
    args[at] = grant
    return [sys.executable, "-m", "token_relay", *args]


@pytest.mark.parametrize("grant", ["chat-*x", "chat-**", "ch?t-*", "chat-[1]"])
def test_minting_a_grant_with_a_wildcard_inside_it_exits_2_with_an_error(grant: str) -> None:
    """The page's command itself mints a token (tests/e2e/test_docs_samples.py runs it)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    result = subprocess.run(
        _documented_token_command(grant),
        capture_output=True,
        text=True,
        env={**environment, "RELAY_SECRET": SECRET},
        timeout=30,
        check=False,
    )
    assert result.returncode == 2, result
    assert result.stdout == ""  # no token
    # One error line, about this grant (not, say, a missing secret), and no traceback.
    assert result.stderr.startswith("error: grant ") and repr(grant) in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


# ----------------------------------------------------------------------- the JS client

PACKAGE_SOURCE = Path(__file__).resolve().parents[2] / "clients" / "js" / "src"
JS_DEFAULTS = Path(__file__).resolve().parents[1] / "js" / "client_defaults.mjs"


def test_the_js_client_defaults_are_the_documented_ones() -> None:
    node = shutil.which("node")
    assert node is not None, "this test needs Node"
    result = subprocess.run(
        [node, "--no-warnings", str(JS_DEFAULTS)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    defaults = json.loads(result.stdout)
    assert defaults["openTimeout"] == 5000
    assert defaults["openTimeoutArmed"] == 5000  # the WebSocket's deadline, as armed
    assert defaults["backoff"] == {"initial": 250, "max": 10000}
    # Each reconnect's delay in [half, all] of a ceiling doubling from 250 ms to 10,000 ms.
    ceilings = [250, 500, 1000, 2000, 4000, 8000, 10000, 10000]
    assert defaults["lowest"] == [c / 2 for c in ceilings]
    assert defaults["highest"] == ceilings


@pytest.mark.asyncio(loop_scope="module")
async def test_the_js_client_falls_back_to_sse_when_the_upgrade_is_never_answered(
    page: Page,
) -> None:
    """In Chromium, the package's own files: a WebSocket whose upgrade a server takes at TCP
    level and never answers counts as failed after ``openTimeout``, and the client reads the
    channel over SSE from the relay."""
    requests: list[bytes] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):  # the upgrade request, never answered
            requests.append(chunk)
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    silent_url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/subscribe"
    running, relay = await start_relay(web_root=str(PACKAGE_SOURCE), **NO_SWEEPS)
    open_timeout = 300
    async with server, relay:
        http = running.url.replace("ws://", "http://")
        await page.goto(f"{http}/")  # any page of the relay's origin
        await page.evaluate(
            """async ([url, sseUrl, openTimeout]) => {
                const { RelayClient } = await import("/index.js");
                const made = performance.now();
                window.statuses = [];
                window.client = new RelayClient(url, {
                    channels: ["c"], sseUrl, openTimeout, rewind: 0,
                });
                client.on("status", (status) => statuses.push(
                    { status, transport: client.transport, elapsed: performance.now() - made }
                ));
            }""",
            [silent_url, f"{http}/sse", open_timeout],
        )
        await page.wait_for_function("client.getChannel('c').status === 'live'", timeout=10_000)
        assert await page.evaluate("client.transport") == "sse"
        async with running.connect("/produce?channel=c") as producer:
            await send_json(producer, {"id": "m", "delta": "over SSE", "final": True})
            assert (await recv_json(producer))["type"] == "ack"
        await page.wait_for_function("client.getChannel('c').messages.length === 1")
        message = await page.evaluate("client.getChannel('c').messages[0]")
        assert (message["text"], message["status"]) == ("over SSE", "complete")
        assert await page.evaluate("client.transport") == "sse"
        statuses = await page.evaluate("statuses")
        await page.evaluate("client.close()")
    request = b"".join(requests).lower()
    assert request.startswith(b"get /subscribe") and b"upgrade: websocket" in request, requests
    opened = [entry for entry in statuses if entry["status"] == "open"]
    assert opened and opened[0]["transport"] == "sse", statuses
    # After the WebSocket's time was up (a timer may fire a millisecond early in Chromium), and
    # at its openTimeout, not the default's 5 s (the margin is for a loaded machine).
    assert open_timeout - 2 <= opened[0]["elapsed"] < open_timeout + 2500, statuses
