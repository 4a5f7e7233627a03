"""Handlers run eagerly: the first step now, the rest in a task, as a task would run them."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from token_relay import Relay, Settings
from token_relay.edge.connection import HttpConnection
from token_relay.edge.eager import start

from tests.edge.test_http11 import FakeTransport


class Spawned:
    """A spawn that keeps its tasks."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def __call__(self, coroutine: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coroutine))


def test_a_handler_that_never_waits_ends_within_the_call() -> None:
    async def play() -> None:
        seen: list[str] = []

        async def handler() -> None:
            seen.append("ran")

        spawn = Spawned()
        assert start(handler(), spawn) is True
        assert seen == ["ran"] and spawn.tasks == []

    asyncio.run(play())


def test_a_handler_that_waits_goes_on_in_a_task_with_what_it_waited_for() -> None:
    async def play() -> None:
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        seen: list[Any] = []

        async def handler() -> None:
            seen.append("before")
            seen.append(await first)
            await asyncio.sleep(0)  # a bare yield
            try:
                await second
            except ValueError as exc:
                seen.append(str(exc))

        spawn = Spawned()
        assert start(handler(), spawn) is False
        assert seen == ["before"] and len(spawn.tasks) == 1
        first.set_result(1)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert seen == ["before", 1]
        second.set_exception(ValueError("refused"))
        await spawn.tasks[0]
        assert seen == ["before", 1, "refused"]

    asyncio.run(play())


def test_cancelling_the_task_cancels_what_the_handler_waits_for() -> None:
    async def play() -> None:
        waited = asyncio.get_running_loop().create_future()
        seen: list[str] = []

        async def handler() -> None:
            try:
                await waited
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            finally:
                seen.append("finally")

        spawn = Spawned()
        assert start(handler(), spawn) is False
        await asyncio.sleep(0)
        spawn.tasks[0].cancel()
        await asyncio.gather(*spawn.tasks, return_exceptions=True)
        assert spawn.tasks[0].cancelled()
        assert waited.cancelled() and seen == ["cancelled", "finally"]

    asyncio.run(play())


def test_a_cancel_after_what_it_waited_for_is_done_reaches_the_handler_as_in_a_task() -> None:
    """The task is cancelled when the future it waited on is already done: the handler
    learns it was cancelled where an asyncio task's handler would, and then only."""

    async def play(eager: bool) -> list[str]:
        waited = asyncio.get_running_loop().create_future()
        seen: list[str] = []

        async def handler() -> None:
            try:
                await waited
            except asyncio.CancelledError:
                seen.append("cancelled at the future")
                raise
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                seen.append("cancelled at the sleep")
                raise

        spawn = Spawned()
        if eager:
            start(handler(), spawn)
        else:
            spawn(handler())
        await asyncio.sleep(0)
        waited.set_result(None)
        spawn.tasks[0].cancel()
        await asyncio.gather(*spawn.tasks, return_exceptions=True)
        assert spawn.tasks[0].cancelled()
        return seen

    in_a_task = asyncio.run(play(False))
    assert in_a_task == ["cancelled at the future"]
    assert asyncio.run(play(True)) == in_a_task


# ---------------------------------------------------------------------- Durable Streams


def _connection(relay: Relay) -> tuple[HttpConnection, FakeTransport]:
    assert relay.server is not None
    connection, transport = HttpConnection(relay.server), FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def _request(method: str, path: str, body: bytes = b"") -> bytes:
    return (
        b"%b %b HTTP/1.1\r\nHost: relay\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%b"
        % (method.encode(), path.encode(), len(body), body)
    )


def test_appends_are_answered_by_the_call_that_read_them_in_order() -> None:
    """Appends on the store in this process, pipelined on one connection, are each answered
    within the one call that read them all, in order, and the stream holds them in order."""

    async def play() -> None:
        relay = Relay(Settings(port=0))
        await relay.start()
        try:
            connection, transport = _connection(relay)
            connection.data_received(_request("PUT", "/v1/stream/s"))
            for _ in range(10):
                await asyncio.sleep(0)
            assert transport.written.startswith(b"HTTP/1.1 201 ")
            transport.written.clear()
            appends = [_request("POST", "/v1/stream/s", b"%d," % n) for n in range(5)]
            connection.data_received(b"".join(appends))
            assert transport.written.count(b"HTTP/1.1 204 ") == 5
            offsets = [
                bytes(line.split(b": ")[1])
                for line in transport.written.split(b"\r\n")
                if line.lower().startswith(b"stream-next-offset")
            ]
            assert offsets == sorted(offsets) and len(set(offsets)) == 5
            reader, read = _connection(relay)
            reader.data_received(b"GET /v1/stream/s?offset=-1 HTTP/1.1\r\nHost: relay\r\n\r\n")
            for _ in range(10):
                await asyncio.sleep(0)
            assert read.written.endswith(b"0,1,2,3,4,")
        finally:
            await relay.stop()

    asyncio.run(play())
