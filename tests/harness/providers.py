"""A local model provider: OpenAI's and Anthropic's SSE wire formats, on a free port.

The real ``openai`` and ``anthropic`` SDKs read it through ``base_url``. It serves in a
thread of its own (a sync SDK call blocks its caller, so the provider can't share the
test's event loop), answers ``POST /v1/chat/completions``, ``/v1/responses`` and
``/v1/messages`` with the scripted events below, and records each request.

A request whose ``model`` is ``"hold"`` gets the first :data:`HELD` events of its script,
then nothing more until the client closes the connection: :attr:`Request.closed_early`
is then set. That is how a test sees that a Stop closed the upstream stream.

A Chat Completions request whose ``model`` is :data:`GATED` gets a plain text reply
(:data:`TEXT_REPLY`): its first :data:`HELD` events at once, and the rest once the test sets
:attr:`Provider.go_on`; a client that closes the connection before that gets nothing more,
and :attr:`Request.closed_early` is set. A test so holds a reply in the middle for as long
as it needs (a reload, a Stop), with no timing.
"""

from __future__ import annotations

import json
import select
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HELD = 4
"""Events a held request gets before the provider waits for the client to go."""

CHAT: list[dict[str, Any]] = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    {"choices": [{"index": 0, "delta": {"content": "Let me "}}]},
    {"choices": [{"index": 0, "delta": {"content": "check."}}]},
    {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": ""},
                        }
                    ]
                },
            }
        ]
    },
    {
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]}}
        ]
    },
    {
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'ty":"Paris"}'}}]},
            }
        ]
    },
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
]
CHAT_USAGE = {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}


REFUSED = "refused"
"""The model whose every request is answered 400, with :data:`REFUSAL` as its message."""
REFUSAL = "The model refused the request."

GATED = "gated"
"""The model whose Chat Completions reply is :data:`TEXT_REPLY`, held after :data:`HELD`
events until :attr:`Provider.go_on` is set."""
TEXT_REPLY = ["It is ", "sunny ", "in Paris, ", "21 °C, ", "with ", "a light ", "breeze."]
"""The text deltas of the gated reply, in order."""
TEXT_USAGE = {"prompt_tokens": 14, "completion_tokens": 7, "total_tokens": 21}
GATED_CHAT: list[dict[str, Any]] = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    *({"choices": [{"index": 0, "delta": {"content": delta}}]} for delta in TEXT_REPLY),
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
]


def _chat(body: dict[str, Any]) -> list[str]:
    gated = body.get("model") == GATED
    model = GATED if gated else "gpt-x"
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model}
    events = [{**base, **event} for event in (GATED_CHAT if gated else CHAT)]
    if (body.get("stream_options") or {}).get("include_usage"):
        events = [{**event, "usage": None} for event in events]
        events.append({**base, "choices": [], "usage": TEXT_USAGE if gated else CHAT_USAGE})
    return [json.dumps(event) for event in events] + ["[DONE]"]


RESPONSES_USAGE = {
    "input_tokens": 10,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 20,
    "output_tokens_details": {"reasoning_tokens": 5},
    "total_tokens": 30,
}


def _response(status: str, usage: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "gpt-x",
        "status": status,
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


def _responses(body: dict[str, Any]) -> list[str]:
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": _response("in_progress", None)},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"id": "rs_1", "type": "reasoning", "summary": []},
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 0,
            "delta": "Weather ",
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 0,
            "delta": "asked.",
        },
        {
            "type": "response.reasoning_summary_text.done",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 0,
            "text": "Weather asked.",
        },
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            },
        },
        {
            "type": "response.output_text.delta",
            "item_id": "msg_1",
            "output_index": 1,
            "content_index": 0,
            "delta": "Checking ",
            "logprobs": [],
        },
        {
            "type": "response.output_text.delta",
            "item_id": "msg_1",
            "output_index": 1,
            "content_index": 0,
            "delta": "now.",
            "logprobs": [],
        },
        {
            "type": "response.output_text.done",
            "item_id": "msg_1",
            "output_index": 1,
            "content_index": 0,
            "text": "Checking now.",
            "logprobs": [],
        },
        {
            "type": "response.output_item.added",
            "output_index": 2,
            "item": {
                "id": "fc_1",
                "type": "function_call",
                "call_id": "call_9",
                "name": "weather",
                "arguments": "",
                "status": "in_progress",
            },
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_1",
            "output_index": 2,
            "delta": '{"city":',
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_1",
            "output_index": 2,
            "delta": '"Oslo"}',
        },
        {
            "type": "response.function_call_arguments.done",
            "item_id": "fc_1",
            "output_index": 2,
            "name": "weather",
            "arguments": '{"city":"Oslo"}',
        },
        {"type": "response.completed", "response": _response("completed", RESPONSES_USAGE)},
    ]
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return [json.dumps(event) for event in events]


def _messages(body: dict[str, Any]) -> list[str]:
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-x",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 25, "output_tokens": 1},
            },
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "Needs "},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "a tool."},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "c2lnbg=="},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "On "}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "it."}},
        {"type": "content_block_stop", "index": 1},
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": ""},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": '{"city": "Ro'},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": 'me"}'},
        },
        {"type": "content_block_stop", "index": 2},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 40},
        },
        {"type": "message_stop"},
    ]
    return [f"event: {event['type']}\ndata: {json.dumps(event)}" for event in events]


SCRIPTS = {"/v1/chat/completions": _chat, "/v1/responses": _responses, "/v1/messages": _messages}


@dataclass
class Request:
    """One request the provider got."""

    path: str
    body: dict[str, Any]
    finished: bool = False
    """Every event of its script was written."""
    closed_early: threading.Event = field(default_factory=threading.Event)
    """A held request's client closed the connection."""


def _released(connection: socket.socket, go_on: threading.Event) -> bool:
    """Wait until ``go_on`` is set (True) or the client closes ``connection`` (False); a
    client silent for two minutes counts as gone."""
    for _ in range(6000):
        if go_on.wait(0.01):
            return True
        readable, _, _ = select.select([connection], [], [], 0.01)
        if readable:
            try:
                if connection.recv(1) == b"":
                    return False
            except OSError:
                return False
    return False


class Provider:
    """The provider, serving on 127.0.0.1 (``base_url``) until :meth:`close`."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.go_on = threading.Event()
        """Set: a gated reply goes on past its first :data:`HELD` events (clear it to hold
        the next one)."""
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                script = SCRIPTS.get(self.path)
                if script is None:
                    self.send_error(404)
                    return
                request = Request(self.path, body)
                provider.requests.append(request)
                if body.get("model") == REFUSED:
                    self._refuse()
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                events = script(body)
                held = body.get("model") == "hold"
                gated = body.get("model") == GATED and self.path == "/v1/chat/completions"
                try:
                    self._write(events[:HELD] if held or gated else events)
                    if gated:
                        if not _released(self.connection, provider.go_on):
                            request.closed_early.set()
                            return
                        self._write(events[HELD:])
                except OSError:  # the client closed it while its first events were written
                    if held or gated:
                        request.closed_early.set()
                    return
                if held:
                    self.connection.settimeout(30)
                    try:
                        gone = self.connection.recv(1) == b""
                    except OSError:
                        gone = True
                    if gone:
                        request.closed_early.set()
                    return
                request.finished = True
                self.close_connection = True

            def _refuse(self) -> None:
                error = {"message": REFUSAL, "type": "invalid_request_error", "code": None}
                answer = json.dumps({"error": error}).encode()
                self.send_response(400)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def _write(self, events: list[str]) -> None:
                for event in events:
                    self.wfile.write(
                        (event if event.startswith("event:") else f"data: {event}").encode()
                        + b"\n\n"
                    )
                    self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
