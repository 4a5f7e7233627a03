"""A Durable Streams JSON body read as messages: validated, one level of array flattened,
each message kept as the exact text it was sent as.

A body that is a JSON array is a batch: each element is one message (``[[1,2],[3,4]]`` is
the two messages ``[1,2]`` and ``[3,4]``); any other JSON value is one message. The text of
each message is the slice of the body it came from, so what a reader gets back is what was
written, byte for byte, between the commas the relay adds. ``NaN``, ``Infinity`` and bodies
that are not UTF-8 are not JSON, and are refused.
"""

from __future__ import annotations

import json

from .errors import StreamRefused

__all__ = ["json_array", "messages_of"]

_WHITESPACE = " \t\n\r"


def _invalid(message: str) -> StreamRefused:
    """The body is not a JSON text: 400, ``invalid_json`` (its message says where)."""
    return StreamRefused(400, "invalid_json", message)


def _no_constant(name: str) -> object:
    raise _invalid(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _skip(text: str, index: int) -> int:
    while index < len(text) and text[index] in _WHITESPACE:
        index += 1
    return index


def _value(text: str, index: int) -> int:
    """The end of the JSON value that starts at ``index``."""
    try:
        _, end = _DECODER.raw_decode(text, index)
    except json.JSONDecodeError as exc:
        raise _invalid(f"invalid JSON: {exc.msg} at character {exc.pos}") from None
    except RecursionError:
        raise _invalid(f"the JSON value at character {index} is nested too deeply") from None
    return end


def messages_of(body: bytes) -> list[bytes]:
    """The messages of a JSON body, in order (none for ``[]``);
    :class:`~token_relay.core.errors.StreamRefused` (400, ``invalid_json``) if it is not one
    JSON text."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _invalid("the body is not UTF-8") from None
    start = _skip(text, 0)
    if start == len(text):
        raise _invalid("the body is empty: no JSON value")
    if text[start] != "[":
        end = _value(text, start)
        if _skip(text, end) != len(text):
            raise _invalid(f"invalid JSON: extra data at character {_skip(text, end)}")
        return [text[start:end].encode()]
    messages: list[bytes] = []
    index = _skip(text, start + 1)
    if index < len(text) and text[index] == "]":
        index += 1
    else:
        while True:
            end = _value(text, index)
            messages.append(text[index:end].encode())
            index = _skip(text, end)
            if index < len(text) and text[index] == ",":
                index = _skip(text, index + 1)
                continue
            if index < len(text) and text[index] == "]":
                index += 1
                break
            raise _invalid(f"invalid JSON: expected ',' or ']' at character {index}")
    if _skip(text, index) != len(text):
        raise _invalid(f"invalid JSON: extra data at character {_skip(text, index)}")
    return messages


def json_array(messages: list[bytes]) -> bytes:
    """Messages as one JSON array, as a read of a JSON stream returns them."""
    return b"[" + b",".join(messages) + b"]"
