"""A chat's AI SDK messages (``UIMessage``) as OpenAI Chat Completions messages.

A chat's request (:class:`~token_relay.core.protocol.ChatRequest`) holds the page's
``UIMessage``\\ s as sent: each a ``role`` and a list of ``parts``. A model takes
``{"role", "content"}`` messages instead. :func:`openai_messages` keeps the text of each
``system``, ``user`` and ``assistant`` message, its text parts joined in order; every other
part (reasoning, tool calls, files, sources, data, step boundaries) is left out, and a
message with no text left is dropped. Pure: no I/O, and ``openai`` is not imported.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..core.errors import UsageError

__all__ = ["ROLES", "openai_messages"]

ROLES = frozenset({"system", "user", "assistant"})
"""The roles a ``UIMessage`` may have (``ai`` 7), each a Chat Completions role as well."""


def openai_messages(ui_messages: Iterable[Any]) -> list[Any]:
    """The text of ``ui_messages`` (``UIMessage`` dicts, oldest first) as Chat Completions
    messages, ``[{"role": "user", "content": "..."}, ...]``: each a ``dict[str, str]``,
    typed ``Any`` so that it passes as the ``openai`` SDK's message types (typed dicts, one
    per role) with no cast.

    Raises :class:`~token_relay.core.errors.UsageError` naming the message's index if one
    is not a ``UIMessage``: not an object, a ``role`` other than ``system``, ``user`` and
    ``assistant``, ``parts`` not a list of objects, or a text part whose ``text`` is not a
    string.
    """
    converted: list[Any] = []
    for index, message in enumerate(ui_messages):
        if not isinstance(message, dict):
            raise UsageError(f"messages[{index}] is not a UIMessage object")
        role, parts = message.get("role"), message.get("parts")
        if not isinstance(role, str) or role not in ROLES:
            raise UsageError(f"messages[{index}].role is not one of {sorted(ROLES)}: {role!r:.50}")
        if not isinstance(parts, list) or not all(isinstance(part, dict) for part in parts):
            raise UsageError(f"messages[{index}].parts is not a list of objects")
        texts = [part.get("text") for part in parts if part.get("type") == "text"]
        if not all(isinstance(text, str) for text in texts):
            raise UsageError(f"messages[{index}] has a text part whose text is not a string")
        content = "".join(texts)
        if content:
            converted.append({"role": role, "content": content})
    return converted
