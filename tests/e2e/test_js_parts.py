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
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.parts_cases import CASES, TOOL_INPUTS, Step, random_reply
from .test_parts_shape import _as_chunks, _core, _is_top_level, _live_after

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
        snapshot["text"] = core.text()
        if any(not _is_top_level(step) for step in steps[:cut]):
            snapshot["chunks"] = core.catch_up()
        frames.append(snapshot)
        applied.append(cut)
    per_step = _as_chunks(steps)[cut:]
    live = _live_after(steps, cut)  # the chunks after the cut, a held surrogate half carried
    structured = any(not _is_top_level(step) for step in steps[:cut])
    for index, step in enumerate(steps[cut:], cut):
        chunks, live = live[: len(per_step[index - cut])], live[len(per_step[index - cut]) :]
        structured = structured or not _is_top_level(step)
        if not structured:
            # Its text-delta's text: a half a plain snapshot held travels with it.
            delta = chunks[-1]["delta"]
            frames.append({"type": "delta", "channel": CHANNEL, "id": MESSAGE, "delta": delta})
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
        if steps is UNPAIRED:
            # A joiner's snapshot cannot carry a held half: its part shows it (as U+FFFD) only
            # if a delta of the part follows, or with the message frame.
            cuts = [0]
        elif name.startswith("reply "):
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
