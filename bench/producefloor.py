"""``python -m bench.producefloor --port N``: the floor of ``POST /produce`` in Python.

The least a Python server can do for each request and still do the relay's job: an asyncio
protocol reads just enough HTTP/1.1 (a head up to its blank line, its ``Content-Length``,
keep-alive), decodes the body as one event, applies it to the seed's assembler (the relay's
:class:`TokenAssembler`), keeps a completed message in a bounded history with its offset,
and answers as the relay does (``{"acks": [{"type": "ack", ...}], "errors": [],
"cancels": []}``). Nothing else: no validation, limits, sessions, rate limits, metrics,
broker or subscribers; the assembler keeps every completed text for the run, where the
relay bounds them. ``GET /count`` answers the messages completed so far, and ``GET /last``
the last one kept. It needs nothing beyond the relay's own package.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import signal
import sys
from typing import ClassVar

from token_relay.core.assembler import TokenAssembler

FLOOR_HISTORY = 1000
"""Completed messages the ``produce`` floor keeps (the relay's default ``--history-size``)."""


class ProduceFloor(asyncio.Protocol):
    """One socket of the ``produce`` floor (see the module's docstring)."""

    assembler: ClassVar[TokenAssembler] = TokenAssembler()
    history: ClassVar[collections.deque[bytes]] = collections.deque(maxlen=FLOOR_HISTORY)
    offset: ClassVar[int] = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        buffer, out = self.buffer + data, []
        while (end := buffer.find(b"\r\n\r\n")) >= 0:
            head = buffer[:end].lower()
            at = head.find(b"\r\ncontent-length:")
            length = 0
            if at >= 0:
                line_end = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : line_end if line_end >= 0 else end])
            if len(buffer) < end + 4 + length:
                break
            body, buffer = buffer[end + 4 : end + 4 + length], buffer[end + 4 + length :]
            if head.startswith(b"get /count "):
                out.append(_response(str(ProduceFloor.offset).encode()))
                continue
            if head.startswith(b"get /last "):
                out.append(_response(ProduceFloor.history[-1] if ProduceFloor.history else b""))
                continue
            out.append(_response(b'{"acks":[%b],"errors":[],"cancels":[]}' % self.apply(body)))
        self.buffer = buffer
        if out:
            self.transport.write(b"".join(out))

    @staticmethod
    def apply(body: bytes) -> bytes:
        """One event: the ack of the message it completes, or nothing."""
        event = json.loads(body)
        message_id, delta = event["id"], event.get("delta")
        final = bool(event.get("final"))
        text = ProduceFloor.assembler.feed(message_id, delta, final)
        if text is None or not final:
            return b""
        ProduceFloor.offset += 1
        record = {"type": "message", "id": message_id, "text": text, "offset": ProduceFloor.offset}
        ProduceFloor.history.append(json.dumps(record).encode())
        ack = {"type": "ack", "id": message_id, "offset": ProduceFloor.offset}
        return json.dumps(ack, separators=(",", ":")).encode()


def _response(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (
        len(body),
        body,
    )


async def _serve(port: int) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    listening = await loop.create_server(ProduceFloor, "127.0.0.1", port)
    bound = listening.sockets[0].getsockname()[1]
    print(
        f"POST /produce floor listening on port {bound}: http://127.0.0.1:{bound}/produce",
        file=sys.stderr,
        flush=True,
    )
    try:
        await stopping.wait()
    finally:
        listening.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.producefloor")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port))
