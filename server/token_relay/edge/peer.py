"""What a subscriber's frames go to: a WebSocket, or an SSE stream."""

from __future__ import annotations

from .httpproducer import HttpProducer
from .sse import SseStream
from .websocket import WebSocket

__all__ = ["Peer", "ProducerPeer", "Streamed"]

Peer = WebSocket | SseStream | HttpProducer
"""Whatever frames go to; the writer serializes a frame once per kind."""
ProducerPeer = WebSocket | HttpProducer
"""A producer connection: a WebSocket, or one HTTP request."""
Streamed = WebSocket | SseStream
"""What owns a socket once its request is answered: every byte is its from then on."""
