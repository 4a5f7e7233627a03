"""Per-address accounting over real sockets: a request whose body is being read counts against
``--max-connections-per-ip`` like a WebSocket, and when descriptors run low the address holding
the most sockets is cut, never a newcomer from another address."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import AsyncIterator

from token_relay.edge.server import FD_RESERVE
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidMessage, InvalidStatus

from ..conftest import recv_json, start_relay
from ..harness import eventually, relay_process

STREAMING_POST = (
    b"POST /produce?channel=c HTTP/1.1\r\nHost: relay\r\nContent-Type: application/x-ndjson\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
END = b"0\r\n\r\n"


@contextlib.asynccontextmanager
async def _held_posts(
    port: int, count: int
) -> AsyncIterator[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
    """``count`` streaming ``POST /produce`` requests from 127.0.0.1, their heads sent and
    their bodies held open."""
    held = []
    try:
        for _ in range(count):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(STREAMING_POST)
            held.append((reader, writer))
        yield held
    finally:
        for _, writer in held:
            writer.transport.abort()


async def _status(reader: asyncio.StreamReader) -> int:
    line = await asyncio.wait_for(reader.readline(), 5)
    return int(line.split()[1]) if line else 0


async def test_streaming_posts_count_against_the_address_and_429_past_its_limit() -> None:
    running, relay = await start_relay(max_connections_per_ip=20)
    port = int(running.url.rsplit(":", 1)[1])
    async with relay:
        refused = 'relay_http_refusals_total{status="429"} 10.0'
        async with _held_posts(port, 30) as held:
            await eventually(lambda: refused in relay.metrics.render().decode(), 5)
            assert relay.gate.per_address == {"127.0.0.1": 20}
            # Every kind of connection shares the count: a WebSocket from there is refused.
            try:
                await connect(f"{running.url}/subscribe?channel=c")
                raise AssertionError("a WebSocket got past the address's limit")
            except InvalidStatus as exc:
                assert exc.response.status_code == 429
            # Another address is not.
            async with connect(
                f"{running.url}/subscribe?channel=c", local_addr=("127.0.0.2", 0)
            ) as other:
                assert (await recv_json(other))["type"] == "subscribed"
            for _, writer in held:
                with contextlib.suppress(ConnectionError):
                    writer.write(END)
            statuses = await asyncio.gather(*(_status(reader) for reader, _ in held))
            assert sorted(statuses) == [200] * 20 + [429] * 10
            await eventually(lambda: relay.gate.per_address == {}, 5)


async def _hold_posts_again_and_again(port: int, stop: asyncio.Event) -> int:
    """A streaming ``POST /produce`` from 127.0.0.1 held open, opened again each time the
    relay ends it, until ``stop``: how many times it was ended."""
    ended = 0
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            ended += 1
            continue
        try:
            writer.write(STREAMING_POST)
            stopping = asyncio.ensure_future(stop.wait())
            reading = asyncio.ensure_future(reader.read())
            await asyncio.wait([stopping, reading], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if reading.done():
                ended += 1
                reading.exception()  # a reset is an end too
            else:
                reading.cancel()
        finally:
            writer.transport.abort()
    return ended


async def test_one_address_holding_requests_never_gets_another_addresss_canary_refused() -> None:
    limit = 400
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        # No per-address limit to speak of: only the descriptor guard stands in the way.
        relay = relay_process("--max-connections-per-ip", "100000", "--idle-timeout", "120")
        await relay.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    stop = asyncio.Event()
    attack = [
        asyncio.create_task(_hold_posts_again_and_again(relay.port, stop))
        for _ in range(limit - FD_RESERVE + 50)
    ]
    try:
        # The descriptors are used up once the relay has started to end some of them.
        await eventually(lambda: relay.log.count("file descriptors low") > 0, 20)
        outcomes = []
        for _ in range(20):
            try:
                async with connect(
                    f"{relay.url}/subscribe?channel=c", local_addr=("127.0.0.2", 0)
                ) as canary:
                    outcomes.append((await recv_json(canary))["type"])
            except InvalidStatus as exc:
                outcomes.append(str(exc.response.status_code))
            except (InvalidMessage, OSError) as exc:  # cut before its answer
                outcomes.append(type(exc).__name__)
        assert outcomes == ["subscribed"] * 20
        assert "Too many open files" not in relay.log
    finally:
        stop.set()
        await asyncio.gather(*attack)
        await relay.stop()
