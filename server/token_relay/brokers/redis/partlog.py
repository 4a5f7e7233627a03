"""A structured message's log in Redis: what it applied since it became structured, in
order, so that another process can rebuild its parts (a session taken over, a gone
process's message aborted).

A message becomes structured with its first ``chunk``. From then on its key
``tr:text:OWNER|ID`` holds, instead of its text::

    0xFF FLAG LENGTH ":" TEXT ( 0x1E ENTRY )*

* ``0xFF``, a byte UTF-8 never holds, marks it structured: a catch-up rebuilds its parts
  from it and hands a joiner their compacted catch-up;
* ``FLAG`` is ``1`` if its text so far became its implicit text part (it had a top-level
  delta before its first chunk, an empty one included), ``0`` if not, and ``x`` once the
  log was cut (see :data:`MAX_LOG_BYTES`);
* ``TEXT`` (``LENGTH`` bytes) is the text it had before, kept as a plain message's;
* each ``ENTRY`` is one applied event as JSON: a chunk as its object, a top-level delta as
  a string. JSON never holds a raw 0x1E, so entries need no escaping.

Bound: at most :data:`MAX_LOG_BYTES` per message, counted by the script that appends
(``STRLEN``, so the check costs nothing). The text it holds is bounded by
``--max-message-chars`` and the other chunks by the parts' limits, but JSON adds bytes per
chunk, and chunks that change nothing (empty deltas) or replace (a data part updated by its
id) repeat without end; past the bound the log is cut (``x``) and no longer grows. So is
a log an entry of which failed or could not be queued (Redis unreachable, the queue full):
the next entry cuts it, unless the message's process rewrites it whole first (a resync
after an outage: :func:`log_value` of its compacted catch-up). A message
whose log was cut can't be rebuilt: a process taking its session over aborts it, and a
reaper's abort carries its text without parts, as before logs existed.

A plain message is never logged: its writes are exactly what they were.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = [
    "MAX_LOG_BYTES",
    "SEPARATOR",
    "PartLog",
    "chunk_entry",
    "delta_entry",
    "log_value",
    "read_value",
]

MAX_LOG_BYTES = 16 * 1024 * 1024
"""Bytes of one structured message's log in Redis, at most: past it the log is cut."""
SEPARATOR = b"\x1e"
"""Before each entry: a byte JSON never holds raw."""
_MARK = 0xFF
_encode = msgspec.json.encode


def _entry(value: Any) -> bytes:
    try:
        return SEPARATOR + _encode(value)
    except UnicodeEncodeError:  # a lone surrogate (half of a pair split across deltas)
        return SEPARATOR + json.dumps(value, separators=(",", ":")).encode()


def chunk_entry(chunk: Mapping[str, Any]) -> bytes:
    """The log entry of an applied chunk."""
    return _entry(chunk)


def log_value(chunks: list[dict[str, Any]]) -> bytes:
    """A whole log holding ``chunks`` (no text before them): a structured message's log
    rewritten from its compacted catch-up, which rebuilds its parts."""
    return bytes([_MARK]) + b"00:" + b"".join(_entry(chunk) for chunk in chunks)


def delta_entry(delta: str) -> bytes:
    """The log entry of a top-level delta applied to a structured message."""
    return _entry(delta)


@dataclass(frozen=True, slots=True)
class PartLog:
    """A structured message's log, as read back from Redis."""

    implicit: bool
    """Its text before its first chunk became its implicit text part."""
    text: str
    """Its text before its first chunk."""
    entries: list[Mapping[str, Any] | str]
    """Each chunk (a mapping) and top-level delta (a string) it applied, in order."""
    cut: bool = False
    """The log passed :data:`MAX_LOG_BYTES`: it can't rebuild the parts."""


def read_value(value: bytes) -> str | PartLog:
    """A message's ``tr:text:`` value: its text (a plain message) or its log."""
    if not value or value[0] != _MARK:
        return value.decode()
    flag = value[1:2]
    colon = value.index(b":", 2)
    start = colon + 1
    end = start + int(value[2:colon])
    text = value[start:end].decode()
    if flag == b"x":
        return PartLog(False, text, [], cut=True)
    entries = [json.loads(raw) for raw in value[end + 1 :].split(SEPARATOR)] if value[end:] else []
    return PartLog(flag == b"1", text, entries)
