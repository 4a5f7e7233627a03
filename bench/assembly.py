"""The assembler case, in this process: events per second through three assemblers.

The relay's ``TokenAssembler.apply()``; the same rules with each message a ``str`` that
every delta extends (``text += delta``), the first thing most people write; and the floor, a
bare loop appending to a dict of lists, with no call, no checks and no memory of ids. Each
runs the same pre-built event dicts; its texts are checked after the clock stops.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from token_relay import TokenAssembler

from .wire import BenchError, Message


class NaiveAssembler:
    """The seed rules with ``str +=``: each delta copies the message's text so far."""

    __slots__ = ("_completed", "_texts")

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}
        self._completed: dict[str, str] = {}

    def apply(self, event: Mapping[str, Any]) -> str | None:
        """Like :meth:`token_relay.TokenAssembler.apply`."""
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
    "token": ("TokenAssembler.apply()", lambda events: _through(TokenAssembler().apply, events)),
    "naive": ("naive str += assembler", lambda events: _through(NaiveAssembler().apply, events)),
    "floor": ("dict + list append loop (floor)", floor_run),
}
"""Key: label, and a function that runs a fresh assembler over the events."""


def run_assembler(key: str, messages: Sequence[Message]) -> tuple[int, float]:
    """Time one assembler over every event of ``messages``, check every completed text;
    return the events and the seconds."""
    events = [event for message in messages for event in message.events]
    gc.collect()
    start = time.perf_counter()
    texts = ASSEMBLERS[key][1](events)
    seconds = time.perf_counter() - start
    expected = [message.text for message in messages]
    if texts != expected:
        wrong = next(
            (n for n, (a, b) in enumerate(zip(texts, expected, strict=False)) if a != b), len(texts)
        )
        raise BenchError(f"assembler {key!r} got message {wrong} wrong or missing")
    return len(events), seconds
