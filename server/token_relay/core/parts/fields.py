"""A chunk's fields, read with each type and bound checked before anything changes;
and JavaScript's ``undefined`` (:data:`ABSENT`).

A key that ``ai`` leaves ``undefined`` is absent from its part, as it is once the
message is JSON; :func:`put` and :func:`fallback` do what JavaScript's assignment and
``??`` do with it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from ..errors import PartRejected
from .refusals import INVALID_CHUNK, PART_TOO_LARGE, PartLimits, reject


class Absent:
    """JavaScript's ``undefined``: a key ``ai`` leaves undefined is absent from the part."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final = Absent()


class Fields:
    """Reads a chunk's fields, checking each type and bound before anything changes."""

    __slots__ = ("chunk", "kind", "limits")

    def __init__(self, chunk: Mapping[str, Any], kind: str, limits: PartLimits) -> None:
        self.chunk = chunk
        self.kind = kind
        self.limits = limits

    def bad(self, key: str, expected: str) -> PartRejected:
        return reject(INVALID_CHUNK, f"'{self.kind}' chunk: '{key}' must be {expected}")

    def text(self, key: str) -> str:
        value = self.chunk.get(key)
        if not isinstance(value, str):
            raise self.bad(key, "a string")
        if len(value) > self.limits.max_part_chars:
            raise reject(
                PART_TOO_LARGE,
                f"'{self.kind}' chunk: '{key}' is longer than {self.limits.max_part_chars} "
                "characters",
            )
        return value

    def optional_text(self, key: str) -> str | Absent:
        return ABSENT if key not in self.chunk else self.text(key)

    def optional_bool(self, key: str) -> bool | Absent:
        if key not in self.chunk:
            return ABSENT
        value = self.chunk[key]
        if not isinstance(value, bool):
            raise self.bad(key, "a boolean")
        return value

    def value(self, key: str, required: bool = False) -> Any:
        """A JSON value (``null`` included), sized against ``max_data_bytes``; ABSENT if
        missing, or if null where ``ai`` reads ``null`` as not given."""
        if key not in self.chunk:
            if required:
                raise self.bad(key, "present")
            return ABSENT
        value = self.chunk[key]
        if value is None and not required:
            return ABSENT
        self.size(key, value)
        return value

    def size(self, key: str, value: Any) -> int:
        try:
            encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            raise self.bad(key, "a JSON value") from None
        size = len(encoded.encode("utf-8", "surrogatepass"))
        if size > self.limits.max_data_bytes:
            raise reject(
                PART_TOO_LARGE,
                f"'{self.kind}' chunk: '{key}' is {size} bytes of JSON, more than "
                f"{self.limits.max_data_bytes}",
            )
        return size

    def object(self, key: str) -> dict[str, Any] | Absent:
        """An optional object; ``null`` is refused, as ``ai``'s chunk schema refuses it."""
        if key not in self.chunk:
            return ABSENT
        value = self.chunk[key]
        if not isinstance(value, dict):
            raise self.bad(key, "an object")
        self.size(key, value)
        return value

    def metadata(self) -> dict[str, Any] | Absent:
        """``providerMetadata``: an object of objects, as ``ai``'s schema wants."""
        value = self.object("providerMetadata")
        if isinstance(value, dict) and not all(isinstance(v, dict) for v in value.values()):
            raise self.bad("providerMetadata", "an object of objects")
        return value


def put(target: dict[str, Any], key: str, value: Any) -> None:
    """``target[key] = value`` as JavaScript does it: assigning ``undefined`` removes it."""
    if value is ABSENT:
        target.pop(key, None)
    else:
        target[key] = value


def fallback(value: Any, current: Any) -> Any:
    """JavaScript's ``value ?? current``."""
    return current if value is ABSENT else value
