"""UTF-16 surrogate halves split across deltas, joined: what a gateway slicing a
JavaScript string may send, made into text that always encodes to UTF-8. Pure."""

from __future__ import annotations

import re

__all__ = ["REPLACEMENT", "has_surrogate", "mend"]

REPLACEMENT = "\ufffd"
"""What a surrogate that never pairs becomes (U+FFFD, the replacement character)."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a surrogate half (so :func:`mend` may change it)."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def mend(held: str, delta: str, final: bool) -> tuple[str, str]:
    """Join UTF-16 surrogate halves split across deltas: ``(text to append, held)``.

    A gateway slicing a JavaScript string may cut an emoji in two, so a delta can end
    in a high surrogate and the next start with the low one. The high half is held
    back until the next delta; a pair becomes its code point; a half that never pairs
    (the message ends, or nothing fitting follows) becomes :data:`REPLACEMENT`. The
    text handed on never holds a lone surrogate, so it always encodes to UTF-8.
    """
    text = held + delta
    if text.isascii() or _SURROGATE.search(text) is None:
        return text, ""
    held = ""
    if not final and "\ud800" <= text[-1] <= "\udbff":
        held, text = text[-1], text[:-1]
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace"), held
