"""A real HTTP server that takes webhook POSTs, on a thread of its own, and answers each as
a test decides."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclasses.dataclass(frozen=True)
class Received:
    """One POST a :class:`WebhookReceiver` got, and what it answered."""

    headers: dict[str, str]
    body: bytes
    status: int
    """The status answered; 0 if the receiver stalled and dropped the connection."""
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


class WebhookReceiver:
    """A real HTTP server taking webhook POSTs, on a thread of its own.

    ``answer(n, body)`` decides each answer (``n`` counts POSTs from 0): an HTTP status,
    or a negative number of seconds to stall before dropping the connection unanswered.
    """

    def __init__(self, answer: Callable[[int, bytes], float] | None = None) -> None:
        self.answer: Callable[[int, bytes], float] = answer or (lambda n, body: 200)
        self.received: list[Received] = []
        self.posts = 0
        """POSTs that arrived (a stalled one is in ``received`` only once it ends)."""
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if len(body) < length:  # the sender died mid-request: nothing arrived
                    self.close_connection = True
                    return
                with receiver._lock:
                    n = receiver.posts
                    receiver.posts += 1
                    decision = receiver.answer(n, body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                if decision < 0:
                    time.sleep(-decision)
                    with receiver._lock:
                        receiver.received.append(Received(headers, body, 0, time.time()))
                    self.close_connection = True
                    return
                status = int(decision)
                with receiver._lock:
                    receiver.received.append(Received(headers, body, status, time.time()))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def delivered(self) -> list[Any]:
        """The payloads answered with a 2xx, in arrival order."""
        with self._lock:
            return [r.json() for r in self.received if 200 <= r.status < 300]

    def unique(self) -> list[Any]:
        """The delivered payloads, once each by ``webhook-id``, in first-arrival order."""
        seen: set[str] = set()
        out: list[Any] = []
        with self._lock:
            for r in self.received:
                if 200 <= r.status < 300 and r.headers["webhook-id"] not in seen:
                    seen.add(r.headers["webhook-id"])
                    out.append(r.json())
        return out
