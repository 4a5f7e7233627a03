"""What frames go to: the contract the writer and the relay hold every peer to.

A subscriber's frames go to a WebSocket or an SSE stream (an AI SDK stream is one), a
producer's replies to its WebSocket or to its HTTP request's response: each of these is
a :class:`Peer`, and takes a broadcast frame in its own form (:meth:`Peer.take`).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Protocol

from ..core.grants import Grant
from .broadcast import Broadcast
from .httpproducer import HttpProducer
from .sse import SseStream
from .websocket import WebSocket

__all__ = ["Peer", "ProducerPeer", "Streamed"]


class Peer(Protocol):
    """Whatever frames go to."""

    @property
    def id(self) -> uuid.UUID:
        """Names the connection in logs."""

    transport: asyncio.Transport
    """The socket; its unsent bytes are the peer's backpressure."""
    path: str
    """The request target, query included."""
    client: str
    """The client's address (the peer's, or the one a trusted proxy forwarded for)."""
    grant: Grant

    def __hash__(self) -> int:
        """Peers key the hub's maps: each is itself."""

    @property
    def open(self) -> bool:
        """Whether frames may still be sent."""

    def take(self, broadcast: Broadcast) -> None:
        """Write a frame sent to many peers, in this peer's form, without waiting."""

    async def send(self, data: str | bytes) -> None:
        """Send one frame, then wait until the socket can take more."""

    async def drain(self) -> None:
        """Wait until the socket can take more."""

    def start_close(self, code: int, reason: str = "") -> None:
        """Begin the end of the connection, without waiting."""

    async def close(self, code: int = ..., reason: str = "") -> None:
        """End the connection and wait until it is closed."""


ProducerPeer = WebSocket | HttpProducer
"""A producer connection: a WebSocket, or one HTTP request."""
Streamed = WebSocket | SseStream
"""What owns a socket once its request is answered: every byte is its from then on."""
