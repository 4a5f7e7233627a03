"""The browser client's parts held to the relay's core: ``MessageParts`` of token-relay-client
(clients/js/src/parts.js) assembles, key for key, the parts ``token_relay.core.parts.MessageParts``
assembles (and so ``readUIMessageStream`` of ``ai`` 7, to which tests/e2e/test_parts_shape.py
holds the core), and its ``ChannelState`` shows them live from the relay's frames.

Every case of tests/core/parts_cases.py (fixed replies, tool inputs cut at every character,
seeded random replies) runs through the core and, in one Node process per test, through
tests/js/client_parts.mjs:

* the chunks fed to the client's assembler give the core's parts and text, whole and at
  every prefix of the reply (a tool's input repaired as ``ai`` repairs it);
* a channel's state fed the frames a deltas subscriber gets (``delta`` frames while the
  message is plain, ``chunks`` frames once it is structured, several chunks to a frame)
  shows after every frame exactly the core's parts so far; one that joins at any cut, with a
  ``snapshot`` (the core's compacted ``catch_up()``, or the plain text so far), shows the
  same parts from there on; and the ``message`` frame's parts replace the live view.

And over a real relay: a producer streams replies one event at a time, and clients of the
package in Node, over real WebSockets, one from the start and two joining mid-reply, show
after every event exactly the core's parts so far, and at the end the ``message`` frame's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ..conftest import recv_json, send_json, start_relay
from ..core.parts_cases import CASES, TOOL_INPUTS, Step, random_reply
from .test_parts_shape import _as_chunks, _core, _flat, _is_top_level, _live_after

DRIVER = Path(__file__).resolve().parents[1] / "js" / "client_parts.mjs"
CHANNEL = "c"
MESSAGE = "m"
RANDOM_REPLIES = 120


def _client(cases: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each case through the client, in one Node process."""
    node = shutil.which("node")
    assert node is not None, "these tests need Node"
    # ensure_ascii keeps a lone surrogate as a \\u escape, which JSON.parse reads as one
    # UTF-16 code unit: the producer's own cut.
    done = subprocess.run(
        [node, str(DRIVER)],
        input=json.dumps(list(cases)).encode(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    lines = [json.loads(line) for line in done.stdout.decode().split("\n") if line]
    assert [line["name"] for line in lines] == [case["name"] for case in cases]
    return lines


UNPAIRED: list[Step] = [
    {"delta": "a\ud83d"},
    {"type": "reasoning-start", "id": "r"},
    {"type": "reasoning-delta", "id": "r", "delta": "b\udbff"},
    {"type": "reasoning-end", "id": "r"},
    {"type": "text-start", "id": "t"},
    {"type": "text-delta", "id": "t", "delta": "\ude00x\ud83d"},
    {"type": "tool-input-start", "toolCallId": "c", "toolName": "t"},
    {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": '{"a": "\ud83d'},
    {"type": "tool-output-error", "toolCallId": "c", "errorText": "no"},
    {"type": "finish-step"},
    {"type": "start-step"},
]
"""Surrogate halves that never pair: held while their part is open, U+FFFD once it ends (by
its end, a step's finish, a tool's error)."""


def _replies() -> list[tuple[str, list[Step]]]:
    replies = [(case.name, case.steps) for case in CASES]
    replies.append(("halves that never pair", UNPAIRED))
    replies += [(f"reply {seed}", random_reply(seed)) for seed in range(RANDOM_REPLIES)]
    return replies


# ----------------------------------------------------------------------- the assembler


def test_the_client_assembles_the_cores_parts_at_every_prefix() -> None:
    cases: list[dict[str, Any]] = []
    expected: list[tuple[list[dict[str, Any]], str]] = []
    for name, steps in _replies():
        for cut in range(len(steps) + 1):
            cases.append({"name": f"{name} to {cut}", "steps": steps[:cut]})
            core = _core(steps[:cut])
            expected.append((core.parts(), core.text()))
    differences = [
        f"{case['name']}:\n  core:   {parts}\n  client: {got['parts']}"
        for case, (parts, text), got in zip(cases, expected, _client(cases), strict=True)
        if (got["parts"], got["text"]) != (parts, text)
    ]
    assert not differences, "\n".join(differences[:5])
    # The cases reach every kind of part, and every state of a tool.
    kinds = {part["type"].split("-")[0] for parts, _ in expected for part in parts}
    assert kinds >= {"step", "text", "reasoning", "tool", "dynamic", "source", "file", "data"}
    states = {part.get("state") for parts, _ in expected for part in parts}
    assert states >= {
        "streaming", "done", "input-streaming", "input-available", "approval-requested",
        "approval-responded", "output-available", "output-error", "output-denied",
    }  # fmt: skip


def test_a_tool_input_cut_anywhere_is_repaired_as_the_core_repairs_it() -> None:
    cases: list[dict[str, Any]] = []
    for text in TOOL_INPUTS:
        for cut in range(len(text) + 1):
            for dynamic in (False, True):
                start: Step = {"type": "tool-input-start", "toolCallId": "c", "toolName": "t"}
                if dynamic:
                    start["dynamic"] = True
                delta: Step = {"type": "tool-input-delta", "toolCallId": "c"}
                delta["inputTextDelta"] = text[:cut]
                cases.append({"name": f"{text[:cut]!r} {dynamic}", "steps": [start, delta]})
    got = _client(cases)
    wrong = [
        case["name"]
        for case, theirs in zip(cases, got, strict=True)
        if theirs["parts"] != _core(case["steps"]).parts()
    ]
    assert not wrong, wrong[:5]
    # Some cuts hold a value already, some do not: both were met.
    inputs = [theirs["parts"][0].get("input", "absent") for theirs in got]
    assert "absent" in inputs and any(isinstance(value, dict) for value in inputs)


# ----------------------------------------------------------------------- live frames


def _frames(steps: Sequence[Step], cut: int, merge: int) -> tuple[list[dict[str, Any]], list[int]]:
    """The frames a deltas subscriber that joins after ``steps[:cut]`` gets, and after each
    frame how many steps the relay has applied. ``merge`` chunks frames in a row become one."""
    frames: list[dict[str, Any]] = [
        {"type": "subscribed", "channel": CHANNEL, "offset": 0, "epoch": "E"}
    ]
    applied = [0]
    if cut > 0:
        core = _core(steps[:cut])
        snapshot: dict[str, Any] = {"type": "snapshot", "channel": CHANNEL, "id": MESSAGE}
        if any(not _is_top_level(step) for step in steps[:cut]):
            snapshot["text"] = core.text()
            snapshot["chunks"] = core.catch_up()
        else:
            # A plain message's text as the relay holds it: its deltas as they came.
            snapshot["text"] = "".join(step["delta"] for step in steps[:cut])
        frames.append(snapshot)
        applied.append(cut)
    # The chunks after the cut, as the producer sent them: a surrogate pair it split arrives
    # split, its first half at the end of the snapshot's delta for its part.
    per_step = _as_chunks(steps)[cut:]
    assert _flat(per_step) == _live_after(steps, cut)
    structured = any(not _is_top_level(step) for step in steps[:cut])
    for index, step in enumerate(steps[cut:], cut):
        chunks = per_step[index - cut]
        structured = structured or not _is_top_level(step)
        if not structured:
            frames.append(
                {"type": "delta", "channel": CHANNEL, "id": MESSAGE, "delta": step["delta"]}
            )
            applied.append(index + 1)
        elif frames[-1]["type"] == "chunks" and len(frames[-1]["chunks"]) < merge:
            frames[-1]["chunks"] += chunks
            applied[-1] = index + 1
        else:
            frames.append({"type": "chunks", "channel": CHANNEL, "id": MESSAGE, "chunks": chunks})
            applied.append(index + 1)
    return frames, applied


def test_a_channel_shows_the_live_parts_after_every_frame_from_any_join() -> None:
    cases: list[dict[str, Any]] = []
    expected: list[list[tuple[list[dict[str, Any]], str] | None]] = []
    for name, steps in _replies():
        cuts: Sequence[int] = range(len(steps) + 1)
        if name.startswith("reply "):
            draw = random.Random(name)
            cuts = sorted({0, len(steps), *draw.sample(range(len(steps)), 4)})
        for cut in cuts:
            frames, applied = _frames(steps, cut, merge=1 + cut % 3)
            # The end: the message frame, whose parts are the finalized core's.
            final = _core(steps)
            final.finalize()
            frames.append(
                {"type": "message", "channel": CHANNEL, "id": MESSAGE, "text": final.text(),
                 "parts": final.parts(), "offset": 1, "epoch": "E"}
            )  # fmt: skip
            seen: list[tuple[list[dict[str, Any]], str] | None] = [None]  # the confirmation
            for count in applied[1:]:
                core = _core(steps[:count])
                seen.append((core.parts(), core.text()))
            seen.append((final.parts(), final.text()))
            cases.append({"name": f"{name} joined at {cut}", "frames": frames, "id": MESSAGE})
            expected.append(seen)
    differences = []
    for case, wanted, got in zip(cases, expected, _client(cases), strict=True):
        assert got["frozen"], case["name"]
        assert [entry["outcome"] for entry in got["seen"]] == ["changed"] * len(wanted)
        for index, (want, entry) in enumerate(zip(wanted, got["seen"], strict=True)):
            if want is None:
                continue
            last = index == len(wanted) - 1
            status = "complete" if last else "streaming"
            if (entry["parts"], entry["text"], entry["status"]) != (*want, status):
                frame = case["frames"][index]
                differences.append(
                    f"{case['name']}, frame {index} {frame}:\n  core:   {want[0]}\n"
                    f"  client: {entry['parts']}"
                )
                break
    assert not differences, "\n".join(differences[:5])


# ----------------------------------------------------------------------- over a real relay

LIVE_DRIVER = Path(__file__).resolve().parents[1] / "js" / "client_live.mjs"


class NodeClients:
    """tests/js/client_live.mjs: clients of the JS package in one Node process, each
    following a channel over a real WebSocket and printing each message as it changes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        """Each line to its client's queue."""
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            entry = json.loads(line)
            self._queue(entry["client"]).put_nowait(entry)

    def _queue(self, name: str) -> asyncio.Queue[dict[str, Any]]:
        return self.queues.setdefault(name, asyncio.Queue())

    async def start(self, name: str) -> None:
        """Start client ``name``; returns once it has joined the channel."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{name}\n".encode())
        await self.process.stdin.drain()
        await self.until(name, lambda line: line.get("open") is True)

    async def until(self, name: str, wanted: Any, wait: float = 10.0) -> dict[str, Any]:
        """The next line of client ``name`` for which ``wanted(line)`` holds; the lines it
        passed over are in ``skipped``."""
        self.skipped: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(wait):
                while not wanted(line := await self._queue(name).get()):
                    self.skipped.append(line)
        except TimeoutError:
            last = self.skipped[-1:]
            raise AssertionError(f"client {name} never showed it; last: {last}") from None
        return line


@contextlib.asynccontextmanager
async def _node_clients(url: str, channel: str) -> AsyncIterator[NodeClients]:
    node = shutil.which("node")
    assert node is not None
    process = await asyncio.create_subprocess_exec(
        node, "--experimental-websocket", "--no-warnings", str(LIVE_DRIVER),
        f"{url}/subscribe", channel,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=2**24,
    )  # fmt: skip
    clients = NodeClients(process)
    try:
        yield clients
    finally:
        clients.reader.cancel()
        if process.returncode is None:
            assert process.stdin is not None
            process.stdin.write(b"close\n")
            await process.stdin.drain()
            await asyncio.wait_for(process.wait(), 10)


def _event(step: Step) -> dict[str, Any]:
    return {"id": MESSAGE, **step} if _is_top_level(step) else {"id": MESSAGE, "chunk": step}


LIVE_REPLIES = {"reply 3": random_reply(3), "reply 8": random_reply(8), "halves": UNPAIRED}
"""Replies streamed through a real relay: random ones (text, reasoning, tools, sources,
data, steps, surrogate pairs cut in two) and halves that never pair."""


@pytest.mark.parametrize("name", sorted(LIVE_REPLIES))
async def test_a_relay_streams_a_structured_reply_to_the_js_client_live_and_exact(
    name: str,
) -> None:
    """A producer sends the reply one event at a time; client ``a`` follows from the start,
    client ``b`` joins a third of the way in, client ``c`` two thirds. After every event, each
    client's message shows exactly the core's parts of the reply so far; at the end, exactly
    the completed message's parts."""
    steps = LIVE_REPLIES[name]
    joins = {len(steps) // 3: "b", 2 * len(steps) // 3: "c"}
    running, relay = await start_relay()
    async with (
        relay,
        running.connect("/produce?channel=live") as producer,
        running.connect("/subscribe") as watcher,
        _node_clients(running.url, "live") as clients,
    ):
        await send_json(watcher, {"type": "subscribe", "channel": "live"})
        assert (await recv_json(watcher))["type"] == "subscribed"
        await clients.start("a")
        following = ["a"]
        for index, step in enumerate(steps):
            if index in joins:
                await clients.start(joins[index])
                following.append(joins[index])
                expected = _core(steps[:index])
                # The join's snapshot shows the reply so far.
                await clients.until(
                    joins[index], lambda line, e=expected: line["parts"] == e.parts()
                )
            before = _core(steps[:index]).parts()
            await send_json(producer, _event(step))
            expected = _core(steps[: index + 1])
            shown = {"status": "streaming", "text": expected.text(), "parts": expected.parts()}
            for client in following:
                await clients.until(client, lambda line, s=shown: {k: line.get(k) for k in s} == s)
                # Never a wrong view on the way: at most the one before again (an event
                # the relay publishes with no change, a surrogate half it holds).
                assert all(line["parts"] == before for line in clients.skipped), (
                    client, index, step, clients.skipped,
                )  # fmt: skip
        await send_json(producer, {"id": MESSAGE, "final": True})
        assert (await recv_json(producer))["type"] == "ack"
        frame = await recv_json(watcher)
        assert frame["type"] == "message"
        final = _core(steps)
        final.finalize()
        assert frame["parts"] == final.parts()
        for client in following:
            line = await clients.until(client, lambda line: line["status"] == "complete")
            assert (line["parts"], line["text"]) == (frame["parts"], frame["text"])
