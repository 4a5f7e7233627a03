"""Requests played through real :class:`~token_relay.edge.connection.HttpConnection`\\ s of a
relay over in-memory transports: what the differential tests of the edge's shortcuts share."""

from __future__ import annotations

import asyncio

from token_relay import Relay
from token_relay.edge.connection import HttpConnection

from tests.edge.test_http11 import FakeTransport


async def settle() -> None:
    """Let the loop run long enough for every answer due to be written."""
    for _ in range(40):
        await asyncio.sleep(0)


def connection(relay: Relay) -> tuple[HttpConnection, FakeTransport]:
    """A new connection to ``relay``, and what is written to it."""
    assert relay.server is not None
    opened, transport = HttpConnection(relay.server), FakeTransport()
    opened.connection_made(transport)  # type: ignore[arg-type]
    return opened, transport


async def answers(
    relay: Relay, sequence: list[bytes], together: bool, opened: list[HttpConnection]
) -> list[bytes]:
    """The bytes written back to ``sequence``: each request on a connection of its own, or
    all of them pipelined on one (``together``). The connections go to ``opened``."""
    written: list[bytes] = []
    if together:
        one, transport = connection(relay)
        opened.append(one)
        one.data_received(b"".join(sequence))
        for _ in range(len(sequence) + 2):
            await settle()
        return [bytes(transport.written)]
    for request in sequence:
        one, transport = connection(relay)
        opened.append(one)
        one.data_received(request)
        await settle()
        written.append(bytes(transport.written))
    return written
