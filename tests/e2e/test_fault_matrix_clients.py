"""Rolling restarts with the real client packages reading: two relay processes on one real
redis-server behind the harness ``Balancer`` (as in ``test_fault_matrix``), gateways streaming
replies with ``RelayProducer`` through it, while each relay process in turn is stopped
(SIGTERM) mid-stream and started again, and one real client follows the channel through the
balancer:

* Chromium's own ``EventSource`` on ``/sse?channel=C``, which reconnects by itself with
  ``Last-Event-ID``;
* the official ``@durable-streams/client`` following ``/v1/stream/__channel/C`` live (SSE, and
  long-poll), reconnecting by itself from its offset;
* the ``ai`` package's ``DefaultChatTransport`` resuming a chat's stream
  (``/ai-sdk/C/stream``) across a SIGTERM of the process it reads from.

Each must end with every acked reply exactly once, with its exact text, in channel order.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page
from token_relay.client import RelayProducer

from ..harness import Balancer, RedisServer, ServiceProcess, relay_process
from .test_fault_matrix import GATEWAYS, Seen, _cluster, _flags, _gateway, _judge

pytestmark = pytest.mark.asyncio(loop_scope="module")


class ClientReader:
    """A real client following the channel through the balancer: ``start`` returns once it
    follows it; ``frames`` is what it got so far (dicts of the terminal frames, in order)."""

    name = "client"

    async def start(self, balancer: Balancer, channel: str) -> None:
        raise NotImplementedError

    async def frames(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def stop(self) -> list[str]:
        """Stop it; what it said went wrong (gave up, errors), if anything."""
        raise NotImplementedError


class EventSourceReader(ClientReader):
    name = "chromium-eventsource"

    def __init__(self, page: Page) -> None:
        self.page = page

    async def start(self, balancer: Balancer, channel: str) -> None:
        http = f"http://127.0.0.1:{balancer.port}"
        await self.page.goto(f"{http}/")  # any page of the relay's origin (a 404 will do)
        await self.page.evaluate(
            """(url) => {
                window.seen = [];
                window.opened = 0;
                window.errors = 0;
                window.subscribed = 0;
                const source = new EventSource(url);
                window.source = source;
                source.onopen = () => { window.opened += 1; };
                source.onerror = () => { window.errors += 1; };
                source.addEventListener("subscribed", () => { window.subscribed += 1; });
                for (const kind of ["message", "aborted"]) {
                    source.addEventListener(kind, (e) => window.seen.push(JSON.parse(e.data)));
                }
            }""",
            f"{http}/sse?channel={channel}",
        )
        # Its first id (the subscribed event's) read: from now on it resumes, never rejoins.
        await self.page.wait_for_function("window.subscribed >= 1", timeout=15000)

    async def frames(self) -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = await self.page.evaluate("window.seen")
        return seen

    async def stop(self) -> list[str]:
        state = await self.page.evaluate(
            """() => { const s = {readyState: window.source.readyState, opened: window.opened,
                errors: window.errors, subscribed: window.subscribed};
                window.source.close(); return s; }"""
        )
        print(f"{self.name}: {state}")
        if state["readyState"] == 2:  # CLOSED: the browser gave up reconnecting
            return [f"{self.name}: EventSource gave up (readyState CLOSED): {state}"]
        return []


class NodeReader(ClientReader):
    """A Node script printing one JSON line per batch: ``{"items": [...]}``, or ``{"error"}``."""

    def __init__(self, name: str, folder: Path, *args: str) -> None:
        self.name = name
        self.folder = folder
        self.args = args
        self.items: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.ready = asyncio.Event()
        self.process: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task[None] | None = None

    def command(self, balancer: Balancer, channel: str) -> list[str]:
        raise NotImplementedError

    async def start(self, balancer: Balancer, channel: str) -> None:
        self.process = await asyncio.create_subprocess_exec(
            "node", *self.command(balancer, channel),
            cwd=self.folder, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self.task = asyncio.create_task(self._read())
        await asyncio.wait_for(self.ready.wait(), 15)

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while line := await self.process.stdout.readline():
            said = json.loads(line)
            if "error" in said:
                self.errors.append(f"{self.name}: {said['error']}")
            self.items.extend(said.get("items", []))
            if said.get("ready"):
                self.ready.set()

    async def frames(self) -> list[dict[str, Any]]:
        return self.items

    async def stop(self) -> list[str]:
        assert self.process is not None and self.task is not None
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 5)
        assert self.process.stderr is not None
        err = (await self.process.stderr.read()).decode()
        if err.strip():
            print(f"{self.name} stderr: {err[-3000:]}")
        return self.errors


class DurableStreamReader(NodeReader):
    def __init__(self, live: str, clients: Path) -> None:
        super().__init__(f"durable-streams-{live}", clients)
        self.live = live

    def command(self, balancer: Balancer, channel: str) -> list[str]:
        url = f"http://127.0.0.1:{balancer.port}/v1/stream/__channel/{channel}"
        return ["follow_channel.mjs", url, "-1", self.live]


async def _play(
    redis: RedisServer, channel: str, reader: ClientReader, rounds: int = 2
) -> list[str]:
    """Gateways stream replies through the balancer while each relay process in turn is
    stopped (SIGTERM) mid-stream and started again, ``rounds`` times, and ``reader`` follows
    the channel; what is wrong with what it got."""
    loop = asyncio.get_running_loop()
    stopped: list[ServiceProcess] = []
    acked: dict[str, float] = {}
    until: list[float] = []
    wrong: list[str] = []
    frames: list[dict[str, Any]] = []
    async with _cluster(redis) as (relays, balancer):
        await reader.start(balancer, channel)
        gateways = asyncio.gather(
            *(_gateway(balancer.url, channel, n, until, acked) for n in range(GATEWAYS))
        )
        faults = 0
        try:
            for _ in range(rounds):
                for index in range(len(relays)):
                    await asyncio.sleep(0.2 + 0.1 * faults % 3)  # mid-stream
                    faults += 1
                    assert await relays[index].terminate(15) == 0, relays[index].log
                    stopped.append(relays[index])
                    relays[index] = relay_process(*_flags(redis))
                    await relays[index].start()
                    balancer.backends = [relay.port for relay in relays]
            until.append(loop.time() + 0.5)
            await asyncio.wait_for(gateways, 60)
            deadline = loop.time() + 15
            while loop.time() < deadline:
                if set(acked) <= {frame["id"] for frame in await reader.frames()}:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # anything more (a duplicate) would come now
        finally:
            until.append(0.0)
            if not gateways.done():
                gateways.cancel()
                await asyncio.gather(gateways, return_exceptions=True)
            frames = await reader.frames()
            wrong += await reader.stop()
    seen = Seen(reader.name, [(f["type"], f["id"], f["text"]) for f in frames])
    wrong += _judge(seen, acked)
    positions = [(f["epoch"], f["offset"]) for f in frames]
    if any(b[1] <= a[1] for a, b in itertools.pairwise(positions) if a[0] == b[0]):
        wrong.append(f"{reader.name}: out of channel order: {positions}")
    if len({epoch for epoch, _ in positions}) > 1:  # Redis keeps the epoch across restarts
        wrong.append(f"{reader.name}: the epoch changed: {positions}")
    print(f"{reader.name}: {faults} SIGTERMs, {len(acked)} replies, {len(frames)} frames")
    if wrong:
        for relay in stopped:
            print("----", relay.pid, relay.log[-6000:])
    return wrong


async def test_chromium_event_source_gets_every_reply_once_across_rolling_restarts(
    redis_server: RedisServer, page: Page
) -> None:
    wrong = await _play(redis_server, "clients-es", EventSourceReader(page))
    assert wrong == []


@pytest.mark.parametrize("live", ["sse", "long-poll"])
async def test_durable_streams_client_gets_every_reply_once_in_order_across_rolling_restarts(
    redis_server: RedisServer, live: str, ds_clients: Path
) -> None:
    reader = DurableStreamReader(live, ds_clients)
    wrong = await _play(redis_server, f"clients-ds-{live}", reader)
    assert wrong == []


@pytest.mark.parametrize("package", ["ai", "ai-v6"])
async def test_ai_sdk_transport_resumes_a_reply_across_rolling_restarts(
    redis_server: RedisServer, package: str, js_clients: Path
) -> None:
    """One long reply streamed through the balancer while each relay process in turn is
    stopped (SIGTERM), the AI SDK's ``DefaultChatTransport`` reading it: each stream a
    stopped process ends early is resumed by the reply's id on the process that is left,
    and the last one ends with the whole reply, exact, under its id."""
    channel = f"clients-ai-{package}"
    loop = asyncio.get_running_loop()
    stopped: list[ServiceProcess] = []
    async with _cluster(redis_server) as (relays, balancer):
        sent: list[str] = []
        done = asyncio.Event()

        async def gateway() -> None:
            async with RelayProducer(balancer.url, channel=channel, backoff=(0.02, 0.3)) as p:
                token = 0
                while not done.is_set() or token < 20:
                    sent.append(f"t{token} ")
                    await p.send("long", sent[-1])
                    token += 1
                    await asyncio.sleep(0.01)
                ack = await asyncio.wait_for(p.finish("long"), 30)
                assert ack.id == "long"

        producing = asyncio.create_task(gateway())
        await asyncio.sleep(0.2)  # the reply is in progress
        node = await asyncio.create_subprocess_exec(
            "node", "ai_sdk_follow.mjs", f"http://127.0.0.1:{balancer.port}", channel,
            cwd=js_clients, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "AI_PACKAGE": package, "SAY_OPEN": "1"},
        )  # fmt: skip
        try:
            assert node.stderr is not None
            said = b""
            while not said.endswith(b"open\n"):
                line = await asyncio.wait_for(node.stderr.readline(), 30)
                assert line, said
                said += line
            for index in range(len(relays)):
                await asyncio.sleep(0.4)  # mid-reply
                assert await relays[index].terminate(15) == 0, relays[index].log
                stopped.append(relays[index])
                relays[index] = relay_process(*_flags(redis_server))
                await relays[index].start()
                balancer.backends = [relay.port for relay in relays]
            await asyncio.sleep(0.3)
            done.set()
            await asyncio.wait_for(producing, 60)
            out, err = await asyncio.wait_for(node.communicate(), 30)
        finally:
            done.set()
            if node.returncode is None:
                node.kill()
                await node.wait()
            if not producing.done():
                producing.cancel()
            await asyncio.gather(producing, return_exceptions=True)
    got = json.loads(out)
    whole = "".join(sent)
    print(
        f"{package}: {len(got['streams'])} streams, {len(sent)} tokens, errors {got['errors']},"
        f" at {loop.time():.1f}"
    )
    for stream in got["streams"]:
        print("  ", stream["parts"][:3], "...", stream["parts"][-3:], len(stream["text"] or ""))
    assert (got["id"], got["text"], got["states"]) == ("long", whole, ["done"]), (
        got,
        err.decode()[-2000:],
    )
    # Its process was stopped under it: it read more than one stream, each a replay of the
    # same reply from its start, never text of its own.
    assert len(got["streams"]) >= 2
    # Each stream but the last was cut, and reading it failed (Node's fetch: "terminated"):
    # never a clean end, which reads as a reply that is over.
    failed = [error for error in got["errors"] if error.startswith(("read:", "parts:"))]
    assert len(failed) >= len(got["streams"]) - 1, got["errors"]
    for stream in got["streams"]:
        assert stream["id"] == "long" and whole.startswith(stream["text"])
        assert stream["parts"].count("start") == 1 and stream["parts"].count("text-start") == 1
