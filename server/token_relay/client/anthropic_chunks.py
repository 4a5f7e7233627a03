"""The ``anthropic`` SDK's Messages stream as AI SDK chunks.

Theory of operation
-------------------
:class:`MessagesChunks` takes the Messages stream's events one at a time (``feed``), the
raw ones (``stream=True``) or those of ``messages.stream()``, whose extra events
(``text``, ``thinking``, ``input_json``, ``citation``, ``signature``) repeat raw ones and
are skipped. It returns the :data:`~token_relay.core.protocol.Chunk`\\ s each amounts to
and keeps :attr:`meta`. Pure, like :mod:`token_relay.client.openai_chunks`, whose field
access it shares: no I/O, no ``anthropic`` import.

A content block is a part, named by its index: ``text`` (``text_delta``) a text part
``text-N``, ``thinking`` (``thinking_delta``) a reasoning part ``reasoning-N``, and
``tool_use`` (or ``server_tool_use``) a tool call whose ``input_json_delta``\\ s stream
its input, ``tool-input-available`` with the parsed JSON at ``content_block_stop``.
``message_start`` gives the model and the input usage, ``message_delta`` the
``stop_reason`` and the output usage (merged over it).

``stop_reason`` to ``ai`` 7's ``finishReason``: ``end_turn`` and ``stop_sequence`` are
``stop``, ``max_tokens`` and ``model_context_window_exceeded`` ``length``, ``tool_use``
``tool-calls``, ``refusal`` ``content-filter``, anything else ``other``.
"""

from __future__ import annotations

from typing import Any

from ..core.protocol import Chunk
from .openai_chunks import field, to_json, tool_input

__all__ = ["MessagesChunks"]

STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool-calls",
    "refusal": "content-filter",
}
"""Anthropic's ``stop_reason`` to ``ai`` 7's finish reason; anything else is ``other``."""

EVENTS = frozenset(
    {
        "message_start",
        "message_delta",
        "message_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "ping",
    }
)
"""The raw event types of a Messages stream."""


class MessagesChunks:
    """Anthropic Messages stream events to chunks and meta."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self._blocks: dict[int, list[str]] = {}
        """Open block index -> [its kind, its part id or tool call id, name, input so far]."""

    def feed(self, event: Any) -> list[Chunk]:
        """The chunks one Messages stream event amounts to."""
        kind = field(event, "type")
        if kind == "content_block_delta":
            return self._delta(field(event, "index") or 0, field(event, "delta"))
        if kind == "content_block_start":
            return self._start(field(event, "index") or 0, field(event, "content_block"))
        if kind == "content_block_stop":
            return self._stop(field(event, "index") or 0)
        if kind == "message_start":
            message = field(event, "message")
            if message is not None:
                model = field(message, "model")
                if model:
                    self.meta["model"] = model
                self._usage(field(message, "usage"))
        elif kind == "message_delta":
            delta = field(event, "delta")
            reason = field(delta, "stop_reason") if delta is not None else None
            if reason:
                self.meta["stop_reason"] = reason
                self.meta["finishReason"] = STOP_REASONS.get(reason, "other")
            self._usage(field(event, "usage"))
        return []

    def end(self) -> list[Chunk]:
        """Close the blocks the stream left open (it ended before their stop)."""
        chunks = [chunk for index in list(self._blocks) for chunk in self._stop(index)]
        self.meta.setdefault("finishReason", "other")
        return chunks

    def _usage(self, usage: Any) -> None:
        if usage is None:
            return
        values = to_json(usage)
        if isinstance(values, dict):
            self.meta["usage"] = {**self.meta.get("usage", {}), **values}

    def _start(self, index: int, block: Any) -> list[Chunk]:
        kind = field(block, "type") if block is not None else None
        if kind == "text":
            self._blocks[index] = ["text", f"text-{index}", "", ""]
            return [{"type": "text-start", "id": f"text-{index}"}]
        if kind == "thinking":
            self._blocks[index] = ["reasoning", f"reasoning-{index}", "", ""]
            return [{"type": "reasoning-start", "id": f"reasoning-{index}"}]
        if kind in ("tool_use", "server_tool_use"):
            call_id, name = field(block, "id") or f"call-{index}", field(block, "name") or ""
            self._blocks[index] = ["tool", call_id, name, ""]
            return [{"type": "tool-input-start", "toolCallId": call_id, "toolName": name}]
        return []

    def _delta(self, index: int, delta: Any) -> list[Chunk]:
        block = self._blocks.get(index)
        if block is None or delta is None:
            return []
        kind = field(delta, "type")
        if kind == "text_delta" and block[0] == "text":
            text = field(delta, "text") or ""
            return [{"type": "text-delta", "id": block[1], "delta": text}] if text else []
        if kind == "thinking_delta" and block[0] == "reasoning":
            text = field(delta, "thinking") or ""
            return [{"type": "reasoning-delta", "id": block[1], "delta": text}] if text else []
        if kind == "input_json_delta" and block[0] == "tool":
            text = field(delta, "partial_json") or ""
            if not text:
                return []
            block[3] += text
            return [{"type": "tool-input-delta", "toolCallId": block[1], "inputTextDelta": text}]
        return []

    def _stop(self, index: int) -> list[Chunk]:
        block = self._blocks.pop(index, None)
        if block is None:
            return []
        kind, part_id, name, arguments = block
        if kind == "tool":
            return [tool_input(part_id, name, arguments)]
        return [{"type": f"{kind}-end", "id": part_id}]
