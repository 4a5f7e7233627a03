"""The ``openai`` SDK's streams as AI SDK chunks: Chat Completions and Responses events.

Theory of operation
-------------------
A translator takes a provider's stream events one at a time (``feed``) and says what
they amount to: a list of :data:`~token_relay.core.protocol.Chunk`\\ s of the AI SDK's UI
message stream (``ai`` 7), in order, and :attr:`meta`, the message's metadata so far.
``end()`` closes whatever part the stream left open and sets the finish reason. Nothing
here does I/O or imports ``openai``: events are read by attribute (the SDK's models) or
by key (plain dicts), so the same code serves the sync and async streams, and tests can
feed it either.

Chat Completions (``chat.completion.chunk``): a choice's ``delta.content`` is one text
part (``text-0`` for choice 0), ``delta.reasoning_content`` (or ``reasoning``, as
compatible servers send it) one reasoning part, and each ``delta.tool_calls[i]`` one tool
call: ``tool-input-start`` on its first delta (it has the ``id`` and the name), then a
``tool-input-delta`` per piece of ``function.arguments``, and ``tool-input-available``
with the parsed JSON when the choice finishes (invalid JSON gives ``tool-input-error``).
``finish_reason`` and the ``usage`` chunk (``stream_options={"include_usage": True}``)
become meta.

Responses (``response.*`` events): ``response.output_text.delta`` is text (the part's id
is the output item's), ``response.reasoning_summary_text.delta`` and
``response.reasoning_text.delta`` reasoning, and a ``function_call`` output item a tool
call whose ``response.function_call_arguments.delta``\\ s stream its input, ending at
``response.function_call_arguments.done``. ``response.completed``, ``.incomplete`` and
``.failed`` carry the usage and the status.

Meta: ``finishReason`` is ``ai`` 7's (``stop``, ``length``, ``content-filter``,
``tool-calls``, ``error``, ``other``), ``finish_reason`` the provider's own word,
``usage`` the provider's usage object as JSON, and ``model``.
"""

from __future__ import annotations

import json
from typing import Any

from ..core.protocol import Chunk

__all__ = ["ChatCompletionsChunks", "ResponsesChunks", "field", "to_json"]

CHAT_FINISH = {
    "stop": "stop",
    "length": "length",
    "content_filter": "content-filter",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
}
"""Chat Completions' ``finish_reason`` to ``ai`` 7's; anything else is ``other``."""

RESPONSES_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content-filter"}
"""An incomplete response's reason to ``ai`` 7's finish reason; anything else is ``other``."""


def field(event: Any, name: str) -> Any:
    """A field of a provider's event: an SDK model's attribute or a dict's key (None if
    absent)."""
    if isinstance(event, dict):
        return event.get(name)
    return getattr(event, name, None)


def to_json(value: Any) -> Any:
    """A provider's model (usage, an error) as plain JSON values, its unset fields left out."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items() if item is not None}
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    dump = getattr(value, "model_dump", None)
    if dump is not None:
        return to_json(dump(exclude_none=True, mode="json"))
    return str(value)


def tool_input(call_id: str, name: str, arguments: str) -> Chunk:
    """The chunk that ends a tool call's streamed input: the parsed JSON, or an error."""
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {
            "type": "tool-input-error",
            "toolCallId": call_id,
            "toolName": name,
            "input": arguments,
            "errorText": "the model's tool arguments are not valid JSON",
        }
    return {
        "type": "tool-input-available",
        "toolCallId": call_id,
        "toolName": name,
        "input": parsed,
    }


class _Parts:
    """Which text and reasoning parts are open, so each opens once and ends once."""

    def __init__(self) -> None:
        self.open: dict[str, str] = {}
        """Open part id -> its kind (``text`` or ``reasoning``), in the order they opened."""
        self.ended: set[str] = set()

    def delta(self, kind: str, part_id: str, delta: str) -> list[Chunk]:
        if not delta or part_id in self.ended:
            return []
        chunks: list[Chunk] = []
        if part_id not in self.open:
            self.open[part_id] = kind
            chunks.append({"type": f"{kind}-start", "id": part_id})
        chunks.append({"type": f"{kind}-delta", "id": part_id, "delta": delta})
        return chunks

    def end(self, part_id: str) -> list[Chunk]:
        kind = self.open.pop(part_id, None)
        if kind is None:
            return []
        self.ended.add(part_id)
        return [{"type": f"{kind}-end", "id": part_id}]

    def end_all(self) -> list[Chunk]:
        return [chunk for part_id in list(self.open) for chunk in self.end(part_id)]


class ChatCompletionsChunks:
    """Chat Completions' ``chat.completion.chunk`` events to chunks and meta."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self._parts = _Parts()
        self._calls: dict[tuple[int, int], list[str]] = {}
        """(choice, tool call index) -> [its id, its name, its arguments so far]."""
        self._done: set[tuple[int, int]] = set()

    def feed(self, event: Any) -> list[Chunk]:
        """The chunks one ``chat.completion.chunk`` amounts to."""
        chunks: list[Chunk] = []
        model = field(event, "model")
        if model:
            self.meta["model"] = model
        usage = field(event, "usage")
        if usage is not None:
            self.meta["usage"] = to_json(usage)
        for choice in field(event, "choices") or ():
            index = field(choice, "index") or 0
            delta = field(choice, "delta")
            if delta is not None:
                reasoning = field(delta, "reasoning_content") or field(delta, "reasoning")
                if isinstance(reasoning, str):
                    chunks += self._parts.delta("reasoning", f"reasoning-{index}", reasoning)
                content = field(delta, "content")
                if isinstance(content, str):
                    chunks += self._parts.delta("text", f"text-{index}", content)
                for call in field(delta, "tool_calls") or ():
                    chunks += self._tool_delta(index, call)
            reason = field(choice, "finish_reason")
            if reason:
                chunks += self._finish_choice(index)
                self.meta["finish_reason"] = reason
                self.meta["finishReason"] = CHAT_FINISH.get(reason, "other")
        return chunks

    def end(self) -> list[Chunk]:
        """Close what the stream left open (it ended without a finish reason)."""
        chunks = self._parts.end_all()
        for key in list(self._calls):
            if key not in self._done:
                chunks += self._finish_call(key)
        self.meta.setdefault("finishReason", "other")
        return chunks

    def _tool_delta(self, choice: int, call: Any) -> list[Chunk]:
        key = (choice, field(call, "index") or 0)
        function = field(call, "function")
        name = field(function, "name") if function is not None else None
        arguments = field(function, "arguments") if function is not None else None
        chunks: list[Chunk] = []
        state = self._calls.get(key)
        if state is None:
            call_id = field(call, "id") or f"call-{choice}-{key[1]}"
            state = self._calls[key] = [call_id, name or "", ""]
            chunks.append({"type": "tool-input-start", "toolCallId": call_id, "toolName": state[1]})
        if arguments:
            state[2] += arguments
            chunks.append(
                {"type": "tool-input-delta", "toolCallId": state[0], "inputTextDelta": arguments}
            )
        return chunks

    def _finish_choice(self, choice: int) -> list[Chunk]:
        chunks = self._parts.end(f"reasoning-{choice}") + self._parts.end(f"text-{choice}")
        for key in [key for key in self._calls if key[0] == choice and key not in self._done]:
            chunks += self._finish_call(key)
        return chunks

    def _finish_call(self, key: tuple[int, int]) -> list[Chunk]:
        self._done.add(key)
        call_id, name, arguments = self._calls[key]
        return [tool_input(call_id, name, arguments)]


class ResponsesChunks:
    """The Responses API's stream events to chunks and meta."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self._parts = _Parts()
        self._calls: dict[str, list[str]] = {}
        """Function call item id -> [its call id, its name, its arguments so far]."""
        self._called = False

    def feed(self, event: Any) -> list[Chunk]:
        """The chunks one Responses stream event amounts to."""
        kind = field(event, "type") or ""
        item_id = field(event, "item_id") or ""
        if kind == "response.output_text.delta":
            return self._parts.delta("text", self._text_id(event), field(event, "delta") or "")
        if kind == "response.output_text.done":
            return self._parts.end(self._text_id(event))
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            delta = field(event, "delta") or ""
            return self._parts.delta("reasoning", self._reasoning_id(event), delta)
        if kind in ("response.reasoning_summary_text.done", "response.reasoning_text.done"):
            return self._parts.end(self._reasoning_id(event))
        if kind == "response.output_item.added":
            return self._item_added(field(event, "item"))
        if kind == "response.function_call_arguments.delta":
            state = self._calls.get(item_id)
            delta = field(event, "delta") or ""
            if state is None or not delta:
                return []
            state[2] += delta
            return [{"type": "tool-input-delta", "toolCallId": state[0], "inputTextDelta": delta}]
        if kind == "response.function_call_arguments.done":
            state = self._calls.pop(item_id, None)
            if state is None:
                return []
            arguments = field(event, "arguments")
            return [tool_input(state[0], state[1], arguments if arguments else state[2])]
        if kind in ("response.created", "response.in_progress"):
            self._response(field(event, "response"))
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self._response(field(event, "response"))
            return self._end_parts()
        elif kind == "error":
            self.meta["finish_reason"] = "error"
            self.meta["finishReason"] = "error"
            message = field(event, "message")
            if message:
                self.meta["errorText"] = message
        return []

    def end(self) -> list[Chunk]:
        """Close what the stream left open (it ended without ``response.completed``)."""
        chunks = self._end_parts()
        self.meta.setdefault("finishReason", "other")
        return chunks

    def _end_parts(self) -> list[Chunk]:
        chunks = self._parts.end_all()
        for call_id, name, arguments in self._calls.values():
            chunks.append(tool_input(call_id, name, arguments))
        self._calls.clear()
        return chunks

    def _item_added(self, item: Any) -> list[Chunk]:
        if item is None or field(item, "type") != "function_call":
            return []
        item_id = field(item, "id") or ""
        call_id = field(item, "call_id") or item_id
        name = field(item, "name") or ""
        self._calls[item_id] = [call_id, name, ""]
        self._called = True
        return [{"type": "tool-input-start", "toolCallId": call_id, "toolName": name}]

    def _response(self, response: Any) -> None:
        if response is None:
            return
        model = field(response, "model")
        if model:
            self.meta["model"] = model
        usage = field(response, "usage")
        if usage is not None:
            self.meta["usage"] = to_json(usage)
        status = field(response, "status")
        if status == "completed":
            reason = "tool-calls" if self._called else "stop"
        elif status == "incomplete":
            details = field(response, "incomplete_details")
            why = field(details, "reason") if details is not None else None
            status = why or status
            reason = RESPONSES_INCOMPLETE.get(why or "", "other")
        elif status == "failed":
            reason = "error"
            error = field(response, "error")
            if error is not None:
                self.meta["errorText"] = field(error, "message") or ""
        else:
            return
        self.meta["finish_reason"] = status
        self.meta["finishReason"] = reason

    @staticmethod
    def _text_id(event: Any) -> str:
        item_id, content = field(event, "item_id") or "", field(event, "content_index") or 0
        return item_id if content == 0 else f"{item_id}:{content}"

    @staticmethod
    def _reasoning_id(event: Any) -> str:
        index = field(event, "summary_index")
        if index is None:
            index = field(event, "content_index") or 0
        return f"{field(event, 'item_id') or ''}:{index}"
