"""``MessageParts`` held to the real ``ai`` package: the parts the core assembles are, key for
key, the ``message.parts`` that the AI SDK's own reader assembles from the same chunks, at its
current major and the one before.

The cases of tests/core/parts_cases.py (fixed replies, tool inputs cut at every character,
and seeded random replies) run through the core and, in one Node process per test and major,
through tests/js/ui_parts.mjs: the chunks framed as a UI message stream body, read as
``DefaultChatTransport`` reads one (its chunk schema first) and then by
``readUIMessageStream``. Three promises are checked:

* the parts are equal (and so is the text), and ``finalize()`` completes them as the chunks
  that end each open part would (``ai`` 7 decides, as the design says);
* a compacted ``catch_up()`` at every cut point, followed by the chunks that come after it,
  gives the package exactly the parts of the whole reply: never a part twice, one delta per
  part at most;
* a chunk the package refuses, the core refuses too, with ``PartRejected`` and nothing changed;
  where the core is stricter than the package, on purpose, each case is listed
  (``STRICTER``).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from token_relay.core.parts import MessageParts, PartRejected, chunks_of

from ..core.parts_cases import (
    ANY_ERROR_TEXT,
    CASES,
    REFUSED,
    STRICTER,
    TOOL_INPUTS,
    PartsCase,
    RefusedCase,
    Step,
    delta,
    random_reply,
)

AI_MAJORS = ("ai", "ai-v6")
"""The AI SDK's packages in tests/js: its current major, and the one before."""

MAJOR_DIFFERENCES = {
    ("ai-v6", "a tool error: input that did not parse"): (
        "ai 6 keeps a tool-input-error's input as rawInput, ai 7 as input"
    ),
    ("ai-v6", "tool-input-error with no start"): "as above",
    ("ai-v6", "a tool approval requested and granted"): "ai 6 has no tool-approval-response",
    ("ai-v6", "a tool approval requested, then denied"): "as above",
    ("ai-v6", "text-end with citations"): "ai 6 has no citations",
    ("ai-v6", "citations with keys ai does not know (dropped), a document, whole-number floats"): (
        "ai 6 has no citations"
    ),
    ("ai-v6", "provider metadata on tool errors lands on the result"): "rawInput, as above",
    ("ai-v6", "an approval on a dynamic tool, with every approval field"): "no approvals",
}
"""Cases whose parts differ between the majors: the core follows ``ai`` 7, so these are
compared with ``ai`` 7 only."""

MESSAGE_CHUNKS = frozenset({"start", "finish", "abort", "error", "message-metadata"})
DELTA_KEYS = {"text-delta": "id", "reasoning-delta": "id", "tool-input-delta": "toolCallId"}
"""Chunks that extend a part's text, and the field that names the part."""
DELTA_STARTS = {
    "text-delta": "text-start",
    "reasoning-delta": "reasoning-start",
    "tool-input-delta": "tool-input-start",
}
STARTS = {start: DELTA_KEYS[delta] for delta, start in DELTA_STARTS.items()}


@dataclass(frozen=True)
class Assembled:
    """What the package made of one run: the final parts, and its refusal if it refused."""

    parts: list[dict[str, Any]]
    error: str | None


@dataclass(frozen=True)
class Package:
    """One major of the AI SDK, driven by tests/js/ui_parts.mjs."""

    script: Path
    name: str

    def assemble(self, runs: Sequence[list[Step]]) -> list[Assembled]:
        """Each run's chunks through the package, all in one Node process."""
        cases = [{"name": str(index), "chunks": chunks} for index, chunks in enumerate(runs)]
        # ensure_ascii keeps a lone surrogate as a \\u escape, which JSON.parse reads as one
        # UTF-16 code unit: the producer's own cut.
        done = subprocess.run(
            ["node", str(self.script)],
            input=json.dumps(cases).encode(),
            capture_output=True,
            env={**os.environ, "AI_PACKAGE": self.name},
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        # Lines end at "\n" only: JSON may hold U+2028 raw.
        lines = [json.loads(line) for line in done.stdout.decode().split("\n") if line]
        assert [line["name"] for line in lines] == [case["name"] for case in cases]
        return [Assembled(line["parts"], line.get("error")) for line in lines]


@pytest.fixture(scope="session", params=AI_MAJORS)
def package(js_clients: Path, request: pytest.FixtureRequest) -> Package:
    """The AI SDK at each major."""
    return Package(js_clients / "ui_parts.mjs", request.param)


@pytest.fixture(scope="session")
def ai_7(js_clients: Path) -> Package:
    """The AI SDK at its current major, which decides where the majors differ."""
    return Package(js_clients / "ui_parts.mjs", "ai")


# ----------------------------------------------------------------------- the two sides


def _is_top_level(step: Step) -> bool:
    return step.keys() == {"delta"}


def _as_chunks(steps: Sequence[Step]) -> list[list[Step]]:
    """Each step as the package sees it: a top-level delta is a ``text-delta`` on the part
    ``"text"``, opened by a ``text-start`` before the first one (unless the producer opened
    a part ``"text"`` itself)."""
    per_step: list[list[Step]] = []
    opened = False
    for step in steps:
        if _is_top_level(step):
            chunks: list[Step] = [] if opened else [{"type": "text-start", "id": "text"}]
            chunks.append({"type": "text-delta", "id": "text", "delta": step["delta"]})
            opened = True
            per_step.append(chunks)
        else:
            opened = opened or (step.get("type"), step.get("id")) == ("text-start", "text")
            per_step.append([step])
    return per_step


def _flat(per_step: Iterable[list[Step]]) -> list[Step]:
    return [chunk for chunks in per_step for chunk in chunks]


def _core(steps: Iterable[Step]) -> MessageParts:
    parts = MessageParts()
    for step in steps:
        if _is_top_level(step):
            parts.delta(step["delta"])
        else:
            parts.apply(step)
    return parts


def _cases(major: str) -> list[PartsCase]:
    return [case for case in CASES if (major, case.name) not in MAJOR_DIFFERENCES]


def _texts(parts: list[dict[str, Any]]) -> str:
    return "".join(part["text"] for part in parts if part["type"] == "text")


def _mask_error_text(core: list[dict[str, Any]], package: list[dict[str, Any]]) -> None:
    """Where the package's part holds :data:`ANY_ERROR_TEXT`, the core's own wording stands:
    any non-empty string."""
    for mine, theirs in zip(core, package, strict=False):
        wording = mine.get("errorText")
        if theirs.get("errorText") == ANY_ERROR_TEXT and isinstance(wording, str) and wording:
            mine["errorText"] = ANY_ERROR_TEXT


def _shape(part: dict[str, Any]) -> tuple[str, str | None]:
    """A part's kind (``tool`` for ``tool-<name>``, ``data`` for ``data-<name>``) and state."""
    kind = part["type"]
    if kind.startswith(("tool-", "data-")):
        kind = kind.split("-")[0]
    return kind, part.get("state")


def _differences(
    names: Sequence[str],
    expected: Sequence[Any],
    package: Sequence[Assembled],
    expected_from: str = "core",
) -> list[str]:
    """Where the package's parts are not the ``expected`` ones, or it refused a chunk."""
    found = []
    for name, mine, theirs in zip(names, expected, package, strict=True):
        if theirs.error is not None:
            found.append(f"{name}: the package refused it: {theirs.error}")
        elif mine != theirs.parts:
            found.append(f"{name}:\n  {expected_from}: {mine}\n  package: {theirs.parts}")
    return found


# ----------------------------------------------------------------------- same parts


def test_the_core_assembles_the_packages_parts(package: Package) -> None:
    cases = _cases(package.name)
    assembled = package.assemble([_flat(_as_chunks(case.steps)) for case in cases])
    cores = [_core(case.steps) for case in cases]
    names = [case.name for case in cases]
    differences = _differences(names, [core.parts() for core in cores], assembled)
    assert not differences, "\n".join(differences)
    assert [core.text() for core in cores] == [_texts(theirs.parts) for theirs in assembled]
    assert not any(core.finalized for core in cores)
    # The cases reach the whole vocabulary, in every state the package gives it.
    shapes = {_shape(part) for theirs in assembled for part in theirs.parts}
    assert shapes >= {
        ("step-start", None), ("text", "streaming"), ("text", "done"),
        ("reasoning", "streaming"), ("reasoning", "done"),
        ("tool", "input-streaming"), ("tool", "input-available"), ("tool", "output-available"),
        ("tool", "output-error"), ("tool", "output-denied"),
        ("dynamic-tool", "input-streaming"), ("dynamic-tool", "output-available"),
        ("dynamic-tool", "output-error"),
        ("source-url", None), ("source-document", None), ("file", None), ("data", None),
    }  # fmt: skip


def test_a_tool_input_cut_anywhere_is_repaired_as_the_package_repairs_it(
    package: Package,
) -> None:
    flags: list[Step] = [{}, {"dynamic": True}]
    runs: list[list[Step]] = [
        [
            {"type": "tool-input-start", "toolCallId": "c", "toolName": "t", **dynamic},
            {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": text[:cut]},
        ]
        for text in TOOL_INPUTS
        for cut in range(len(text) + 1)
        for dynamic in flags
    ]
    labels = [f"{run[1]['inputTextDelta']!r}, dynamic: {'dynamic' in run[0]}" for run in runs]
    differences = _differences(labels, [_core(run).parts() for run in runs], package.assemble(runs))
    assert not differences, "\n".join(differences)


def test_finalize_completes_the_parts_as_their_ending_chunks_would(ai_7: Package) -> None:
    cases = [case for case in CASES if case.finalize_as is not None]
    assert len(cases) >= 10
    ended = [_flat(_as_chunks(case.steps)) + (case.finalize_as or []) for case in cases]
    cores = [_core(case.steps) for case in cases]
    for core in cores:
        core.finalize()
    # What a late reader of a finalized message is given rebuilds the same parts.
    caught_up = [core.catch_up() for core in cores]
    assembled = ai_7.assemble(ended + caught_up)
    finalized, rebuilt = assembled[: len(cases)], assembled[len(cases) :]
    labels = [f"{case.name} (finalized)" for case in cases]
    labels += [f"{case.name} (finalized, caught up)" for case in cases]
    mine = [core.parts() for core in cores * 2]
    for parts, theirs in zip(mine, finalized + rebuilt, strict=True):
        _mask_error_text(parts, theirs.parts)
    differences = _differences(labels, mine, finalized + rebuilt)
    assert not differences, "\n".join(differences)
    for core in cores:
        assert core.finalized
        assert all(part.get("state") != "streaming" for part in core.parts())
        assert all(part.get("state") != "input-streaming" for part in core.parts())


def test_a_finalized_reply_is_rebuilt_by_its_catch_up(package: Package) -> None:
    cores = [_core(case.steps) for case in _cases(package.name)]
    for core in cores:
        core.finalize()
    assembled = package.assemble([core.catch_up() for core in cores])
    labels = [case.name for case in _cases(package.name)]
    differences = _differences(labels, [core.parts() for core in cores], assembled)
    assert not differences, "\n".join(differences)


def test_finalize_is_idempotent_and_nothing_applies_after_it() -> None:
    for case in CASES:
        core = _core(case.steps)
        core.finalize()
        once = (core.parts(), core.text(), core.catch_up(), core.chars())
        core.finalize()
        late_steps: list[Step] = [
            {"delta": "late"},
            {"type": "text-start", "id": "late"},
            {"type": "text-delta", "id": "text", "delta": "late"},
            {"type": "data-late", "data": 1},
        ]
        for late in late_steps:
            try:
                if _is_top_level(late):
                    core.delta(late["delta"])
                else:
                    core.apply(late)
            except PartRejected:
                pass
        assert (core.parts(), core.text(), core.catch_up(), core.chars()) == once, case.name


def test_a_surrogate_half_is_held_until_its_pair_and_replaced_if_none_comes() -> None:
    streaming = _core([delta("a\ud83d"), {"type": "reasoning-start", "id": "r"},
                       {"type": "reasoning-delta", "id": "r", "delta": "b\udbff"}])  # fmt: skip
    assert [part["text"] for part in streaming.parts()] == ["a", "b"]
    assert streaming.text() == "a"
    assert not _compaction_faults(streaming.catch_up())
    streaming.apply({"type": "reasoning-end", "id": "r"})
    assert [part["text"] for part in streaming.parts()] == ["a", "b\ufffd"]
    streaming.finalize()
    assert [part["text"] for part in streaming.parts()] == ["a\ufffd", "b\ufffd"]
    assert streaming.text() == "a\ufffd"


# ----------------------------------------------------------------------- catch-up


def _live_after(steps: Sequence[Step], cut: int) -> list[Step]:
    """The package's chunks for ``steps[cut:]`` as a relay forwards them live: as the
    producer sent them. A high surrogate the core holds at the cut (the first half of a
    pair split across deltas) went in the catch-up's delta, and its other half comes in
    the next live delta of its part, where a reader joins them."""
    return _flat(_as_chunks(steps)[cut:])


def _compaction_faults(catch_up: list[Step]) -> list[str]:
    """What breaks the compaction promise: a message-level chunk, a second delta for one
    part, a lone surrogate handed to a reader (but the high half a delta ends with, which
    the next live delta completes)."""
    faults = [f"message-level chunk {c}" for c in catch_up if c["type"] in MESSAGE_CHUNKS]
    deltas: Counter[tuple[str, str, int]] = Counter()
    opened: Counter[tuple[str, str]] = Counter()  # an id ended may open a new part
    for chunk in catch_up:
        if (key := STARTS.get(chunk["type"])) is not None:
            opened[(chunk["type"], chunk[key])] += 1
        if (key := DELTA_KEYS.get(chunk["type"])) is not None:
            start = DELTA_STARTS[chunk["type"]]
            deltas[(chunk["type"], chunk[key], opened[(start, chunk[key])])] += 1
    faults += [f"{count} deltas for {part}" for part, count in deltas.items() if count > 1]
    for chunk in catch_up:
        for key, value in chunk.items():
            if not isinstance(value, str):
                continue
            # Only a delta's last character may be half a pair: the half still held.
            whole = value[:-1] if key in ("delta", "inputTextDelta") else value
            if any("\ud800" <= c <= "\udfff" for c in whole) or "\udc00" <= value[-1:] <= "\udfff":
                faults.append(f"a lone surrogate in {chunk}")
    return faults


def test_a_catch_up_at_any_cut_then_the_rest_gives_the_whole_parts(package: Package) -> None:
    cases = _cases(package.name)
    runs: list[list[Step]] = []
    labels: list[str] = []
    faults: list[str] = []
    for case in cases:
        runs.append(_flat(_as_chunks(case.steps)))
        labels.append(f"{case.name} (whole)")
        for cut in range(len(case.steps) + 1):
            catch_up = _core(case.steps[:cut]).catch_up()
            faults += [f"{case.name} at {cut}: {fault}" for fault in _compaction_faults(catch_up)]
            runs.append(catch_up + _live_after(case.steps, cut))
            labels.append(f"{case.name} at {cut}")
    assert not faults, "\n".join(faults)
    assembled = package.assemble(runs)
    expected: list[Any] = []
    whole: list[dict[str, Any]] = []
    for label, theirs in zip(labels, assembled, strict=True):
        if label.endswith("(whole)"):
            assert theirs.error is None, (label, theirs.error)
            whole = theirs.parts
        expected.append(whole)
    differences = _differences(labels, expected, assembled, "whole reply, read by the package")
    assert not differences, "\n".join(differences)


RANDOM_REPLIES = 120
"""Random replies drawn (from seeds 0, 1, ...) for the cross-check, each cut at 6 points."""


def test_random_replies_assemble_and_catch_up_as_the_package_reads_them(
    package: Package,
) -> None:
    runs: list[list[Step]] = []
    expected: list[Any] = []
    labels: list[str] = []
    faults: list[str] = []
    for seed in range(RANDOM_REPLIES):
        steps = random_reply(seed)
        whole = _core(steps).parts()
        runs.append(_flat(_as_chunks(steps)))
        expected.append(whole)
        labels.append(f"reply {seed}")
        for cut in sorted({0, len(steps), *random.Random(seed).sample(range(len(steps)), 4)}):
            catch_up = _core(steps[:cut]).catch_up()
            faults += [f"reply {seed} at {cut}: {fault}" for fault in _compaction_faults(catch_up)]
            runs.append(catch_up + _live_after(steps, cut))
            expected.append(whole)
            labels.append(f"reply {seed}, caught up at {cut}")
        finalized = _core(steps)
        finalized.finalize()
        runs.append(finalized.catch_up())
        expected.append(finalized.parts())
        labels.append(f"reply {seed}, finalized and caught up")
    assert not faults, "\n".join(faults)
    differences = _differences(labels, expected, package.assemble(runs), "core's whole reply")
    assert not differences, "\n".join(differences)


def test_the_package_rebuilds_a_list_of_parts_from_its_chunks_of(package: Package) -> None:
    """What the AI SDK stream replays of a completed or aborted structured reply: its
    ``parts``, as ``chunks_of`` makes them, read by the package after a ``start``."""
    cases = _cases(package.name)
    expected: list[Any] = []
    labels: list[str] = []
    for case in cases:
        message = _core(case.steps)
        expected.append(message.parts())  # as an aborted reply's frame carries them
        labels.append(f"{case.name} (as it was)")
        message.finalize()
        expected.append(message.parts())
        labels.append(f"{case.name} (finalized)")
    for seed in range(RANDOM_REPLIES):
        expected.append(_core(random_reply(seed)).parts())
        labels.append(f"reply {seed}")
    assembled = package.assemble([chunks_of(parts) for parts in expected])
    differences = _differences(labels, expected, assembled, "the parts")
    assert not differences, "\n".join(differences)


def test_a_catch_up_is_one_chunk_per_part_so_far() -> None:
    core = _core(
        [
            {"type": "start-step"},
            {"type": "reasoning-start", "id": "r"},
            *({"type": "reasoning-delta", "id": "r", "delta": c} for c in "thinking"),
            {"type": "reasoning-end", "id": "r"},
            {"type": "tool-input-start", "toolCallId": "c", "toolName": "w"},
            *(
                {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": c}
                for c in '{"a": 1}'
            ),
            *({"delta": c} for c in "Hello"),
        ]
    )
    assert core.catch_up() == [
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "r"},
        {"type": "reasoning-delta", "id": "r", "delta": "thinking"},
        {"type": "reasoning-end", "id": "r"},
        {"type": "tool-input-start", "toolCallId": "c", "toolName": "w"},
        {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": '{"a": 1}'},
        {"type": "text-start", "id": "text"},
        {"type": "text-delta", "id": "text", "delta": "Hello"},
    ]


# ----------------------------------------------------------------------- refusals


def _refusals(cases: Sequence[RefusedCase], assembled: Sequence[Assembled]) -> list[str]:
    """Feed each case's steps, then its refused chunk; check the core's parts before it are
    the package's, and that the chunk is refused with the case's code, changing nothing.
    The codes the core gave, by case."""
    codes = []
    for case, theirs in zip(cases, assembled, strict=True):
        core = _core(case.steps)
        before = (core.parts(), core.text(), core.catch_up(), core.chars())
        try:
            core.apply(case.refused)
        except PartRejected as refused:
            codes.append(f"{case.name}: {refused.code}")
        else:
            codes.append(f"{case.name}: accepted")
            continue
        assert (core.parts(), core.text(), core.catch_up(), core.chars()) == before, case.name
        if theirs.error is not None:  # the package's parts before its refusal
            assert before[0] == theirs.parts, case.name
    return codes


def _assert_codes(cases: Sequence[RefusedCase], got: list[str]) -> None:
    wanted = [f"{case.name}: {case.code}" for case in cases]
    wrong = [
        f"{mine} (wanted {want})" for mine, want in zip(got, wanted, strict=True) if mine != want
    ]
    assert not wrong, "\n".join(wrong)


def test_what_the_package_refuses_the_core_refuses_changing_nothing(package: Package) -> None:
    cases = [case for case in REFUSED if package.name in case.majors]
    runs = [[*_flat(_as_chunks(case.steps)), case.refused] for case in cases]
    assembled = package.assemble(runs)
    accepted = [
        case.name for case, theirs in zip(cases, assembled, strict=True) if not theirs.error
    ]
    assert accepted == []
    _assert_codes(cases, _refusals(cases, assembled))


def test_what_the_core_refuses_beyond_the_package(package: Package) -> None:
    """The core is stricter than the package in a few places, on purpose; each is a chunk
    the package takes, and the core refuses with its code, changing nothing."""
    cases = [case for case in STRICTER if package.name in case.majors]
    runs = [_flat(_as_chunks(case.steps)) for case in cases]
    runs += [[*run, case.refused] for run, case in zip(runs, cases, strict=True)]
    assembled = package.assemble(runs)
    before, after = assembled[: len(cases)], assembled[len(cases) :]
    refused = [case.name for case, theirs in zip(cases, after, strict=True) if theirs.error]
    assert refused == []
    _assert_codes(cases, _refusals(cases, before))
