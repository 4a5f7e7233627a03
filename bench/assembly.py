"""The assembler case, in this process: events per second through three assemblers.

* :class:`server.TokenAssembler`, through ``apply()``, the relay's own;
* :class:`NaiveAssembler`, the same rules with each message kept as a ``str`` that every
  delta extends (``text += delta``), the first thing most people write;
* :func:`floor_run`, a bare loop over the events appending to a dict of lists and joining at
  the final, with no method call, no checks and no memory of completed ids: what assembling
  costs in Python at the least.

Each runs the same pre-built event dicts (as the relay holds them after decoding) on two
workloads, short replies and 10,000-character replies, and its completed texts are checked
against the expected ones after the clock stops.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from token_relay import TokenAssembler

from .errors import BenchError
from .messages import Message

__all__ = ["ASSEMBLERS", "AssemblyRun", "NaiveAssembler", "floor_run", "run_assembler"]


class NaiveAssembler:
    """The seed rules with ``str +=``: each delta copies the message's text so far."""

    __slots__ = ("_completed", "_texts")

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}
        self._completed: dict[str, str] = {}

    def apply(self, event: Mapping[str, Any]) -> str | None:
        """Like :meth:`server.TokenAssembler.apply`."""
        message_id = event["id"]
        completed = self._completed.get(message_id)
        if completed is not None:
            return completed if event.get("final") else None
        text = self._texts.get(message_id, "")
        delta = event.get("delta")
        if delta is not None:
            text += delta
        if event.get("final"):
            self._texts.pop(message_id, None)
            self._completed[message_id] = text
            return text
        self._texts[message_id] = text
        return None


def _through(apply: Callable[[Mapping[str, Any]], str | None], events: Sequence[Any]) -> list[str]:
    texts: list[str] = []
    keep = texts.append
    for event in events:
        text = apply(event)
        if text is not None:
            keep(text)
    return texts


def token_run(events: Sequence[dict[str, Any]]) -> list[str]:
    """Every event through a fresh ``TokenAssembler().apply``; the completed texts."""
    return _through(TokenAssembler().apply, events)


def naive_run(events: Sequence[dict[str, Any]]) -> list[str]:
    """Every event through a fresh :class:`NaiveAssembler`; the completed texts."""
    return _through(NaiveAssembler().apply, events)


def floor_run(events: Sequence[dict[str, Any]]) -> list[str]:
    """The floor: a dict of lists, appended to inline, joined at each final."""
    texts: list[str] = []
    keep = texts.append
    streaming: dict[str, list[str]] = {}
    for event in events:
        message_id = event["id"]
        parts = streaming.get(message_id)
        if parts is None:
            parts = streaming[message_id] = []
        delta = event.get("delta")
        if delta is not None:
            parts.append(delta)
        if event.get("final"):
            keep("".join(streaming.pop(message_id)))
    return texts


ASSEMBLERS: dict[str, tuple[str, Callable[[Sequence[dict[str, Any]]], list[str]]]] = {
    "token": ("TokenAssembler.apply()", token_run),
    "naive": ("naive str += assembler", naive_run),
    "floor": ("dict + list append loop (floor)", floor_run),
}
"""Key: label and run function."""


@dataclass(frozen=True, slots=True)
class AssemblyRun:
    """One pass of one assembler over one workload."""

    events: int
    seconds: float

    @property
    def events_per_second(self) -> float:
        """Events applied per second."""
        return self.events / self.seconds


def run_assembler(key: str, messages: Sequence[Message]) -> AssemblyRun:
    """Time one assembler over every event of ``messages``; check every completed text."""
    _, run = ASSEMBLERS[key]
    events = [event for message in messages for event in message.events]
    gc.collect()
    start = time.perf_counter()
    texts = run(events)
    seconds = time.perf_counter() - start
    expected = [message.text for message in messages]
    if texts != expected:
        wrong = next(
            (n for n, pair in enumerate(zip(texts, expected, strict=False)) if pair[0] != pair[1]),
            len(texts),
        )
        raise BenchError(f"assembler {key!r} got message {wrong} wrong or missing")
    return AssemblyRun(len(events), seconds)
