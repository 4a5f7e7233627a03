"""A tool's input as ``ai`` parses it: ``JSON.parse``'s rules, and ``fixJson``'s repair
of a JSON text cut short.

While a tool's input streams, its part shows the text so far repaired into JSON
(:func:`partial_json`); when the message is finalized, the text must parse whole
(:func:`parse_json`). Both answer :data:`~token_relay.core.parts.fields.ABSENT` where
``ai`` gets ``undefined``.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from .fields import ABSENT

_NOT_JSON: Final = object()
"""What Python's parser makes of ``NaN`` and ``Infinity``, which ``JSON.parse`` refuses."""


def _not_json(name: str) -> Any:
    return _NOT_JSON


def _double(literal: str) -> float | None:
    """A JSON number as JavaScript holds it; one past a double's range is ``Infinity``
    there, which JSON carries as ``null``."""
    value = float(literal)
    return None if math.isinf(value) else value


_JSON: Final = json.JSONDecoder(parse_constant=_not_json, parse_float=_double)
"""One decoder for every parse: ``json.loads`` with these options builds one per call."""


MAX_DEPTH: Final = 128
"""The deepest tool input kept parsed: a deeper one is ABSENT (left as its text), as the
relay could neither parse (Python's recursion limit) nor serialize (pydantic's, 254) one
much deeper inside its frames."""


def parse_json(text: str) -> Any:
    """``JSON.parse`` with ``secure-json-parse``'s refusals, as ``ai`` parses tool input:
    ABSENT when it fails, or when it nests deeper than :data:`MAX_DEPTH`."""
    if text.startswith("\ufeff"):
        return ABSENT  # json.loads refuses a byte order mark, as JSON.parse does
    try:
        value = _JSON.decode(text)
    except (ValueError, RecursionError):  # nested past the parser's recursion limit too
        return ABSENT
    nodes = [(value, 0)]
    while nodes:
        node, depth = nodes.pop()
        if node is _NOT_JSON:
            return ABSENT
        if isinstance(node, (dict, list)) and depth >= MAX_DEPTH:
            return ABSENT
        if isinstance(node, dict):
            if "__proto__" in node:
                return ABSENT
            constructor = node.get("constructor")
            if isinstance(constructor, dict) and "prototype" in constructor:
                return ABSENT
            nodes.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            nodes.extend((child, depth + 1) for child in node)
    return value


def partial_json(text: str) -> Any:
    """``parsePartialJson`` of ``ai``: the text as JSON, or repaired, or ABSENT."""
    value = parse_json(text)
    return parse_json(repair_json(text)) if value is ABSENT else value


_VALUE_START: Final = frozenset('"ftn-0123456789{[')
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_CLOSERS: Final = {
    "INSIDE_STRING": '"',
    "INSIDE_OBJECT_KEY": "}",
    "INSIDE_OBJECT_AFTER_KEY": "}",
    "INSIDE_OBJECT_AFTER_COMMA": "}",
    "INSIDE_OBJECT_START": "}",
    "INSIDE_OBJECT_BEFORE_VALUE": "}",
    "INSIDE_OBJECT_AFTER_VALUE": "}",
    "INSIDE_ARRAY_START": "]",
    "INSIDE_ARRAY_AFTER_COMMA": "]",
    "INSIDE_ARRAY_AFTER_VALUE": "]",
}


def repair_json(text: str) -> str:
    """``fixJson`` of ``ai``, state for state: close what a truncated JSON text left open."""
    stack = ["ROOT"]
    last_valid = -1
    literal_start = 0
    hex_digits = 0

    def value_start(char: str, i: int, swap: str) -> None:
        nonlocal last_valid, literal_start
        if char not in _VALUE_START:
            return
        if char != "-":
            last_valid = i
        stack[-1] = swap
        if char == '"':
            stack.append("INSIDE_STRING")
        elif char in "ftn":
            literal_start = i
            stack.append("INSIDE_LITERAL")
        elif char == "{":
            stack.append("INSIDE_OBJECT_START")
        elif char == "[":
            stack.append("INSIDE_ARRAY_START")
        else:
            stack.append("INSIDE_NUMBER")

    def after_value(char: str, i: int, comma_state: str, closer: str) -> None:
        nonlocal last_valid
        if char == ",":
            stack[-1] = comma_state
        elif char == closer:
            last_valid = i
            stack.pop()

    for i, char in enumerate(text):
        top = stack[-1]
        if top == "FINISH":
            break  # the root value is whole: no character after it changes anything
        if top == "ROOT":
            value_start(char, i, "FINISH")
        elif top == "INSIDE_OBJECT_START":
            if char == '"':
                stack[-1] = "INSIDE_OBJECT_KEY"
            elif char == "}":
                last_valid = i
                stack.pop()
        elif top == "INSIDE_OBJECT_AFTER_COMMA":
            if char == '"':
                stack[-1] = "INSIDE_OBJECT_KEY"
        elif top == "INSIDE_OBJECT_KEY":
            if char == '"':
                stack[-1] = "INSIDE_OBJECT_AFTER_KEY"
        elif top == "INSIDE_OBJECT_AFTER_KEY":
            if char == ":":
                stack[-1] = "INSIDE_OBJECT_BEFORE_VALUE"
        elif top == "INSIDE_OBJECT_BEFORE_VALUE":
            value_start(char, i, "INSIDE_OBJECT_AFTER_VALUE")
        elif top == "INSIDE_OBJECT_AFTER_VALUE":
            after_value(char, i, "INSIDE_OBJECT_AFTER_COMMA", "}")
        elif top == "INSIDE_STRING":
            if char == '"':
                stack.pop()
                last_valid = i
            elif char == "\\":
                stack.append("INSIDE_STRING_ESCAPE")
            else:
                last_valid = i
        elif top == "INSIDE_ARRAY_START":
            if char == "]":
                last_valid = i
                stack.pop()
            else:
                value_start(char, i, "INSIDE_ARRAY_AFTER_VALUE")
        elif top == "INSIDE_ARRAY_AFTER_VALUE":
            if char == ",":
                stack[-1] = "INSIDE_ARRAY_AFTER_COMMA"
            elif char == "]":
                last_valid = i
                stack.pop()
            else:
                last_valid = i
        elif top == "INSIDE_ARRAY_AFTER_COMMA":
            value_start(char, i, "INSIDE_ARRAY_AFTER_VALUE")
        elif top == "INSIDE_STRING_ESCAPE":
            stack.pop()
            if char == "u":
                hex_digits = 0
                stack.append("INSIDE_STRING_UNICODE_ESCAPE")
            else:
                last_valid = i
        elif top == "INSIDE_STRING_UNICODE_ESCAPE":
            if char in _HEX:
                hex_digits += 1
                if hex_digits == 4:
                    stack.pop()
                    last_valid = i
        elif top == "INSIDE_NUMBER":
            if char in "0123456789":
                last_valid = i
            elif char in "eE-.":
                pass
            elif char in ",}]":
                stack.pop()
                if stack[-1] == "INSIDE_ARRAY_AFTER_VALUE" and char != "}":
                    after_value(char, i, "INSIDE_ARRAY_AFTER_COMMA", "]")
                if stack[-1] == "INSIDE_OBJECT_AFTER_VALUE" and char != "]":
                    after_value(char, i, "INSIDE_OBJECT_AFTER_COMMA", "}")
            else:
                stack.pop()
        elif top == "INSIDE_LITERAL":
            partial = text[literal_start : i + 1]
            if not any(word.startswith(partial) for word in ("false", "true", "null")):
                stack.pop()
                if stack[-1] == "INSIDE_OBJECT_AFTER_VALUE":
                    after_value(char, i, "INSIDE_OBJECT_AFTER_COMMA", "}")
                elif stack[-1] == "INSIDE_ARRAY_AFTER_VALUE":
                    after_value(char, i, "INSIDE_ARRAY_AFTER_COMMA", "]")
            else:
                last_valid = i

    result = text[: last_valid + 1]
    for state in reversed(stack):
        if state == "INSIDE_LITERAL":
            partial = text[literal_start:]
            for word in ("true", "false", "null"):
                if word.startswith(partial):
                    result += word[len(partial) :]
                    break
        else:
            result += _CLOSERS.get(state, "")
    return result
