"""Shared fixtures: a real relay on a free port, and small client helpers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
from token_relay import Relay, Settings
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

from .harness import RedisServer, npm_installed
from .harness.processes import PARSER_VARIABLE

# Test clients give up on a close handshake quickly: a relay that is gone or never answers
# would otherwise hold every ``async with`` exit for websockets' default 10 s.
CLOSE_TIMEOUT = 1.0


def connect(url: str, **kwargs: Any) -> Any:
    """``websockets.asyncio.client.connect`` with a short ``close_timeout`` by default."""
    kwargs.setdefault("close_timeout", CLOSE_TIMEOUT)
    return ws_connect(url, **kwargs)


@dataclass
class RunningRelay:
    """A relay serving on 127.0.0.1 at ``url``."""

    relay: Relay
    url: str

    def connect(self, path: str, **kwargs: Any) -> Any:
        """Open a real WebSocket client to ``path`` (for example ``/subscribe?channel=a``).

        A producer's ``session`` frame is read and checked on the way in.
        """
        if path.startswith("/produce"):
            return open_producer(self.url + path, **kwargs)
        return connect(self.url + path, **kwargs)


@asynccontextmanager
async def open_producer(url: str, **kwargs: Any) -> AsyncIterator[ClientConnection]:
    """A producer connection whose first frame, the ``session`` frame, is already read."""
    async with connect(url, **kwargs) as ws:
        session = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert session["type"] == "session" and len(session["session"]) >= 32, session
        ws.session = session  # type: ignore[attr-defined]
        yield ws


HTTP_PARSER = {"name": "fast"}
"""The ``--http-parser`` of the relays a test starts (see :func:`pytest_generate_tests`)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test module that sets ``HTTP_PARSERS = ("fast", "h11")`` runs each of its tests
    once per parser, so that both stay covered end to end."""
    parsers = getattr(metafunc.module, "HTTP_PARSERS", None)
    if parsers:
        metafunc.fixturenames.append("http_parser")
        metafunc.parametrize("http_parser", parsers)


@pytest.fixture(autouse=True)
def _http_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The parser of this test's relays: those it starts in this process, and the relay
    processes it starts."""
    callspec = getattr(request.node, "callspec", None)
    parser = callspec.params.get("http_parser", "fast") if callspec else "fast"
    HTTP_PARSER["name"] = parser
    if parser != "fast":
        monkeypatch.setenv(PARSER_VARIABLE, parser)
    try:
        yield
    finally:
        HTTP_PARSER["name"] = "fast"


NO_SWEEPS: dict[str, Any] = {"ping_interval": 86_400.0, "sse_heartbeat": 86_400.0}
"""Settings that keep keepalive pings and SSE heartbeats out of the bytes a relay writes, for
tests that compare them with what is expected, or with another run's. A sweep visits a 64th
of the peers each 64th of its interval, so with the defaults a peer may get a ping a third of
a second after the relay started (an SSE stream a heartbeat after a quarter): under load,
in one of two runs compared byte for byte and not in the other."""


async def start_relay(**overrides: Any) -> tuple[RunningRelay, Relay]:
    """Start a relay on a free port; use the returned relay as ``async with`` to stop it."""
    overrides.setdefault("http_parser", HTTP_PARSER["name"])
    relay = Relay(Settings(port=0, **overrides))
    server = await relay.start()
    port = server.sockets[0].getsockname()[1]
    return RunningRelay(relay, f"ws://127.0.0.1:{port}"), relay


@pytest.fixture
async def relay() -> AsyncIterator[RunningRelay]:
    """A relay with default settings, closed after the test."""
    running, server = await start_relay()
    async with server:
        yield running


async def recv_json(ws: ClientConnection, wait: float = 5.0) -> dict[str, Any]:
    """The next frame, decoded; fails the test if none arrives within ``wait`` seconds."""
    raw = await asyncio.wait_for(ws.recv(), wait)
    frame: dict[str, Any] = json.loads(raw)
    return frame


async def recv_core(ws: ClientConnection, wait: float = 5.0) -> dict[str, Any]:
    """The next frame without its history position (``offset``, ``epoch``)."""
    frame = await recv_json(ws, wait)
    frame.pop("offset", None)
    frame.pop("epoch", None)
    return frame


async def assert_silent(ws: ClientConnection, wait: float = 0.3) -> None:
    """Assert that no frame arrives within ``wait`` seconds."""
    try:
        raw = await asyncio.wait_for(ws.recv(), wait)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected frame: {raw!r}")


async def send_json(ws: ClientConnection, frame: Any) -> None:
    """Send one JSON text frame."""
    await ws.send(json.dumps(frame))


@pytest.fixture
def redis_server(tmp_path: Any) -> Iterator[RedisServer]:
    """A private redis-server on a free port, killed after the test."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One private redis-server for a module's tests, killed after them (each test empties
    it, or keeps to keys of its own): for generated examples, which would start one each."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.kill()


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--soak-seconds N``: run the soak test for N seconds (for release checks); without it
    the soak test runs a short smoke of the same checks."""
    parser.addoption(
        "--soak-seconds",
        type=float,
        default=None,
        help="run the soak test for this many seconds (default: a ~1.5 s smoke)",
    )


class Served(Protocol):
    """Anything that serves the relay's WebSocket routes at ``url`` (``ws://host:port``): a
    relay in this process, a relay process, nginx in front of relays."""

    @property
    def url(self) -> str: ...


@asynccontextmanager
async def subscribed_pair(
    target: Served | str,
    *,
    channel: str = "c",
    deltas: bool = False,
    producer: str | None = None,
    **options: Any,
) -> AsyncIterator[tuple[ClientConnection, ClientConnection]]:
    """A subscriber whose ``subscribed`` frame is already read, and a producer whose
    ``session`` frame is already read, on ``channel`` of ``target`` (or a base URL).

    ``producer`` is the producer's path when it is not ``/produce?channel=CHANNEL``;
    ``options`` go to both connections (``ssl=``, ``max_size=``...).
    """
    base = target if isinstance(target, str) else target.url
    query = f"/subscribe?channel={channel}" + ("&deltas=1" if deltas else "")
    async with (
        connect(base + query, **options) as sub,
        open_producer(base + (producer or f"/produce?channel={channel}"), **options) as produce,
    ):
        confirmation = await recv_json(sub)
        assert (confirmation["type"], confirmation["channel"]) == ("subscribed", channel)
        yield sub, produce


@pytest.fixture(scope="session")
def js_clients(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/js, with its pinned packages installed (npm reaches the registry): real clients
    from the JavaScript ecosystem, run by Node against a running relay."""
    source = Path(__file__).resolve().parent / "js"
    return npm_installed(source, tmp_path_factory.mktemp("js"), "install")
