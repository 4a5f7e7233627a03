"""Tool calls: the tool state machine, one method per tool chunk.

A tool part's ``state`` follows the steps drawn in the package's docstring; a chunk
for a tool in a final state is ``part_ended``, any other step out of order is
``invalid_chunk``.
"""

from __future__ import annotations

from typing import Any, Final

from .fields import ABSENT, Fields, put
from .records import ToolRecord
from .refusals import INVALID_CHUNK, PART_ENDED, PART_EXISTS, UNKNOWN_PART, reject
from .state import PartsState

_OUTPUT_FROM: Final = (
    "input-available",
    "approval-requested",
    "approval-responded",
    "output-available",
)
"""States a tool output may follow (``output-available`` only while ``preliminary``)."""


class ToolChunks(PartsState):
    """The tool chunks of :class:`~token_relay.core.parts.MessageParts`."""

    __slots__ = ()

    def _fail_input(self, tool: ToolRecord, error_text: str) -> None:
        """The tool failed while its input streamed: ``tool-output-error`` on it."""
        value, raw = tool.streamed_input()
        tool.update(
            "output-error",
            input=value,
            errorText=error_text,
            rawInput=ABSENT if tool.dynamic else raw,
            title=tool.part.get("title", ABSENT),
        )
        self._recount(tool)

    def _tool_fields(self, fields: Fields) -> dict[str, Any]:
        """The options every tool chunk that names its tool may carry."""
        return {
            "providerExecuted": fields.optional_bool("providerExecuted"),
            "providerMetadata": fields.metadata(),
            "toolMetadata": fields.object("toolMetadata"),
        }

    def _new_tool(self, tool_call_id: str, name: str, dynamic: bool) -> ToolRecord:
        self._room()
        tool = ToolRecord(tool_call_id, name, dynamic, len(self._parts))
        self._parts.append(tool)
        self._tools[tool_call_id] = tool
        return tool

    def _tool(self, fields: Fields) -> ToolRecord:
        tool_call_id = fields.text("toolCallId")
        found = self._tools.get(tool_call_id)
        if found is None:
            raise reject(UNKNOWN_PART, f"no tool call '{tool_call_id}'", tool_call_id)
        return found

    def _tool_input_start(self, fields: Fields) -> int:
        tool_call_id = fields.text("toolCallId")
        name = fields.text("toolName")
        encoding = fields.optional_text("inputEncoding")
        if encoding not in (ABSENT, "json", "text"):
            raise fields.bad("inputEncoding", "'json' or 'text'")
        options = self._tool_fields(fields)
        title = fields.optional_text("title")
        dynamic = fields.optional_bool("dynamic") is True
        if tool_call_id in self._tools:
            raise reject(PART_EXISTS, f"tool call '{tool_call_id}' exists", tool_call_id)
        tool = self._new_tool(tool_call_id, name, dynamic)
        tool.encoding = encoding
        tool.open = True
        tool.update("input-streaming", inputEncoding=encoding, title=title, **options)
        self._recount(tool)
        self._open_tools[tool_call_id] = tool
        return tool.index

    def _tool_input_delta(self, fields: Fields) -> int:
        tool = self._tool(fields)
        delta = fields.text("inputTextDelta")
        if not tool.open:
            raise reject(
                PART_ENDED,
                f"tool call '{tool.tool_call_id}' takes no more input",
                tool.tool_call_id,
            )
        limit = self.limits.max_tool_input_chars
        appended, held = tool.buffer.prepare(delta, limit, "tool input", tool.tool_call_id)
        self._chars += tool.buffer.commit(appended, held)
        tool.had_delta = True
        return tool.index

    def _input_end(self, fields: Fields) -> tuple[ToolRecord | None, str, bool, Any]:
        """Checks common to ``tool-input-available`` and ``tool-input-error``: the tool
        (None if it is new), its name, whether it is dynamic, and the input."""
        tool_call_id = fields.text("toolCallId")
        name = fields.text("toolName")
        dynamic = fields.optional_bool("dynamic") is True
        value = fields.value("input", required=True)
        found = self._tools.get(tool_call_id)
        if found is None:
            return None, name, dynamic, value
        tool = found
        if not tool.open:
            raise reject(
                PART_ENDED, f"tool call '{tool_call_id}' has no input streaming", tool_call_id
            )
        if name != tool.name:
            raise reject(
                INVALID_CHUNK, f"tool call '{tool_call_id}' is of tool '{tool.name}'", tool_call_id
            )
        return tool, name, dynamic, value

    def _close_input(self, tool: ToolRecord, how: str) -> None:
        self._chars += tool.buffer.flush()
        self._recount(tool)
        tool.open = False
        tool.input_end = how
        self._open_tools.pop(tool.tool_call_id, None)

    def _tool_input_available(self, fields: Fields) -> int:
        tool, name, dynamic, value = self._input_end(fields)
        options = self._tool_fields(fields)
        title = fields.optional_text("title")
        if tool is not None and dynamic != tool.dynamic:
            raise reject(
                INVALID_CHUNK,
                f"tool call '{tool.tool_call_id}' was started "
                f"{'dynamic' if tool.dynamic else 'static'}",
                tool.tool_call_id,
            )
        if tool is None:
            tool = self._new_tool(fields.text("toolCallId"), name, dynamic)
        tool.update("input-available", input=value, title=title, **options)
        self._close_input(tool, "tool-input-available")
        return tool.index

    def _tool_input_error(self, fields: Fields) -> int:
        tool, name, dynamic, value = self._input_end(fields)
        error_text = fields.text("errorText")
        options = self._tool_fields(fields)
        if tool is None:
            tool = self._new_tool(fields.text("toolCallId"), name, dynamic)
        tool.update("output-error", input=value, errorText=error_text, **options)
        self._close_input(tool, "tool-input-error")
        return tool.index

    def _tool_approval_request(self, fields: Fields) -> int:
        tool = self._tool(fields)
        approval_id = fields.text("approvalId")
        approval: dict[str, Any] = {"id": approval_id}
        descriptor = fields.value("approvalDescriptor")
        if descriptor is not ABSENT:
            approval["descriptor"] = descriptor
        if "inputSchemaInput" in fields.chunk:
            approval["inputSchemaInput"] = fields.value("inputSchemaInput", required=True)
        reason = fields.optional_text("reason")
        if reason is not ABSENT:
            approval["requestReason"] = reason
        if fields.optional_bool("isAutomatic") is True:
            approval["isAutomatic"] = True
        signature = fields.optional_text("signature")
        if signature is not ABSENT:
            approval["signature"] = signature
        self._tool_stage(tool, ("input-available",), "tool-approval-request")
        if approval_id in self._approvals:
            raise reject(PART_EXISTS, f"approval '{approval_id}' exists", approval_id)
        tool.part["state"] = "approval-requested"
        tool.part["approval"] = approval
        self._recount(tool)
        self._approvals[approval_id] = tool
        return tool.index

    def _tool_approval_response(self, fields: Fields) -> int:
        approval_id = fields.text("approvalId")
        approved = fields.chunk.get("approved")
        if not isinstance(approved, bool):
            raise fields.bad("approved", "a boolean")
        reason = fields.optional_text("reason")
        executed = fields.optional_bool("providerExecuted")
        metadata = fields.metadata()
        found = self._approvals.get(approval_id)
        if found is None:
            raise reject(UNKNOWN_PART, f"no approval '{approval_id}'", approval_id)
        tool = found
        self._tool_stage(tool, ("approval-requested",), "tool-approval-response")
        approval = {**tool.part["approval"], "id": approval_id, "approved": approved}
        put(approval, "reason", reason)
        tool.part["state"] = "approval-responded"
        tool.part["approval"] = approval
        if executed is not ABSENT:
            tool.part["providerExecuted"] = executed
        if metadata is not ABSENT:
            tool.part["callProviderMetadata"] = metadata
        self._recount(tool)
        return tool.index

    def _tool_stage(self, tool: ToolRecord, allowed: tuple[str, ...], kind: str) -> None:
        """Refuse ``kind`` unless the tool's state is one of ``allowed``."""
        if tool.state in allowed and not (tool.state == "output-available" and tool.final()):
            return
        code = PART_ENDED if tool.final() else INVALID_CHUNK
        raise reject(
            code,
            f"'{kind}' for tool call '{tool.tool_call_id}' in state '{tool.state}'",
            tool.tool_call_id,
        )

    def _output(self, fields: Fields) -> tuple[ToolRecord, dict[str, Any]]:
        tool = self._tool(fields)
        options = {
            "providerExecuted": fields.optional_bool("providerExecuted"),
            "providerMetadata": fields.metadata(),
            "toolMetadata": fields.object("toolMetadata"),
            "input": tool.part.get("input", ABSENT),
            "title": tool.part.get("title", ABSENT),
        }
        return tool, options

    def _tool_output_available(self, fields: Fields) -> int:
        tool, options = self._output(fields)
        output = fields.value("output", required=True)
        preliminary = fields.optional_bool("preliminary")
        self._tool_stage(tool, _OUTPUT_FROM, fields.kind)
        tool.update("output-available", output=output, preliminary=preliminary, **options)
        self._recount(tool)
        return tool.index

    def _tool_output_error(self, fields: Fields) -> int:
        tool, options = self._output(fields)
        error_text = fields.text("errorText")
        self._tool_stage(tool, ("input-streaming", *_OUTPUT_FROM), fields.kind)
        if tool.state == "input-streaming":
            self._chars += tool.buffer.flush()
            self._open_tools.pop(tool.tool_call_id, None)
            tool.open = False
            options["input"], raw = tool.streamed_input()
            options["rawInput"] = ABSENT if tool.dynamic else raw
        elif not tool.dynamic:
            options["rawInput"] = tool.part.get("rawInput", ABSENT)
        tool.update("output-error", errorText=error_text, **options)
        self._recount(tool)
        return tool.index

    def _tool_output_denied(self, fields: Fields) -> int:
        tool = self._tool(fields)
        allowed = ("input-available", "approval-requested", "approval-responded")
        self._tool_stage(tool, allowed, fields.kind)
        tool.part["state"] = "output-denied"
        return tool.index
