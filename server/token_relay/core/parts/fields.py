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
        """The bytes of ``value``'s JSON (:func:`json_size`), checked against
        ``max_data_bytes``."""
        try:
            size = json_size(value)
        except (TypeError, ValueError, RecursionError):
            raise self.bad(key, "a JSON value") from None
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

    def citations(self) -> list[dict[str, Any]] | Absent:
        """``citations`` on ``text-end``, as ``ai`` 7's schema reads them: an array (never
        ``null``) of citations, each one checked, the keys it does not know dropped (its
        objects strip them)."""
        if "citations" not in self.chunk:
            return ABSENT
        value = self.chunk["citations"]
        if not isinstance(value, list):
            raise self.bad("citations", "an array")
        self.size("citations", value)
        return [self._citation(item) for item in value]

    def _citation(self, item: Any) -> dict[str, Any]:
        bad = self.bad(
            "citations", "an array of {source, startIndex?, endIndex?, citedText?} citations"
        )
        source = item.get("source") if isinstance(item, dict) else None
        if not isinstance(source, dict) or source.get("type") != "source":
            raise bad
        kind = source.get("sourceType")
        shape = CITED_SOURCES.get(kind) if isinstance(kind, str) else None
        if shape is None:
            raise bad
        required, optional = shape
        kept: dict[str, Any] = {"type": "source", "sourceType": kind}
        for key in (*required, *optional):
            if key in source or key in required:
                if not isinstance(source.get(key), str):
                    raise bad
                kept[key] = source[key]
        if "providerMetadata" in source:
            metadata = source["providerMetadata"]
            if not isinstance(metadata, dict) or not all(
                isinstance(entry, dict) for entry in metadata.values()
            ):
                raise bad
            kept["providerMetadata"] = metadata
        citation: dict[str, Any] = {"source": kept}
        for key in ("startIndex", "endIndex"):
            if key in item:
                index = item[key]
                whole = isinstance(index, int) or (isinstance(index, float) and index.is_integer())
                if isinstance(index, bool) or not whole or index < 0:
                    raise bad
                citation[key] = int(index)
        if "citedText" in item:
            if not isinstance(item["citedText"], str):
                raise bad
            citation["citedText"] = item["citedText"]
        return citation


CITED_SOURCES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "url": (("id", "url"), ("title",)),
    "document": (("id", "mediaType", "title"), ("filename",)),
}
"""A citation's source by its ``sourceType``: the string fields it must have, then those
it may have (``ai`` 7's citation schema)."""


def json_size(value: Any) -> int:
    """The bytes of ``value``'s compact JSON, not escaping non-ASCII, in UTF-8: what
    ``max_data_bytes`` bounds and :meth:`~token_relay.core.parts.MessageParts.chars`
    counts of a JSON value. Raises ``TypeError``, ``ValueError`` or ``RecursionError``
    for a value that is not JSON."""
    encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return len(encoded.encode("utf-8", "surrogatepass"))


def put(target: dict[str, Any], key: str, value: Any) -> None:
    """``target[key] = value`` as JavaScript does it: assigning ``undefined`` removes it."""
    if value is ABSENT:
        target.pop(key, None)
    else:
        target[key] = value


def fallback(value: Any, current: Any) -> Any:
    """JavaScript's ``value ?? current``."""
    return current if value is ABSENT else value
