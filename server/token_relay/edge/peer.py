"""What a subscriber's frames go to: a WebSocket, or an SSE stream."""

from __future__ import annotations

from .sse import SseStream
from .websocket import WebSocket

__all__ = ["Peer"]

Peer = WebSocket | SseStream
"""A subscriber connection; the writer serializes a frame once per kind."""
