"""``--max-message-chars`` and ``--max-memory-bytes`` hold for a structured message, over
real sockets: what its parts keep beside text (here, the urls of sources) counts, so a
producer can't grow a message past its bound with source-url chunks, and what the relay
keeps of a completed one is counted as held.
"""

from __future__ import annotations

from typing import Any

from ..conftest import recv_core, recv_json, send_json
from .conftest import OpenRelay

URL = "https://example.com/" + "u" * 19_978  # 19,998 characters
SOURCE = 2 + len(URL)
"""What a source ``s<n>`` (n < 10) with :data:`URL` counts: its id and its url."""
assert SOURCE == 20_000

LIMIT = 100_000
"""The relay's ``--max-message-chars``: five such sources fit exactly, a sixth does not."""


def source(message_id: str, n: int) -> dict[str, Any]:
    chunk = {"type": "source-url", "sourceId": f"s{n}", "url": URL}
    return {"id": message_id, "chunk": chunk}


async def test_sources_past_max_message_chars_end_the_message_as_too_large(
    open_relay: OpenRelay,
) -> None:
    async with open_relay(max_message_chars=LIMIT) as (running, sub, producer):
        sessions = running.relay.producers.sessions
        await send_json(producer, {"id": "small", "chunk": {"type": "text-start", "id": "t"}})
        for n in range(5):  # 100,000: at the bound, fine
            await send_json(producer, source("big", n))
        delta = {"type": "text-delta", "id": "t", "delta": "still here"}
        await send_json(producer, {"id": "small", "chunk": delta})
        await send_json(producer, source("big", 5))  # 120,000: past it
        error = await recv_json(producer)
        assert (error["type"], error["code"], error["id"]) == ("error", "message_too_large", "big")
        aborted = await recv_core(sub)
        assert (aborted["type"], aborted["id"], aborted["reason"]) == (
            "aborted",
            "big",
            "message_too_large",
        )
        assert aborted["text"] == ""
        assert aborted["parts"] == [
            {"type": "source-url", "sourceId": f"s{n}", "url": URL} for n in range(6)
        ]
        # The ended message takes no more; the other one on the connection goes on.
        await send_json(producer, source("big", 6))
        late = await recv_json(producer)
        assert (late["code"], late["id"]) == ("message_aborted", "big")
        # A new message whose first chunk alone is past the bound is refused, not started.
        huge = {"type": "source-url", "sourceId": "h", "url": "x" * (LIMIT + 1)}
        await send_json(producer, {"id": "huge", "chunk": huge})
        refused = await recv_json(producer)
        assert (refused["code"], refused["id"]) == ("message_too_large", "huge")
        await send_json(producer, {"id": "small", "chunk": {"type": "text-end", "id": "t"}})
        await send_json(producer, {"id": "small", "final": True})
        ack = await recv_json(producer)
        assert (ack["type"], ack["id"]) == ("ack", "small")
        assert await recv_core(sub) == {
            "type": "message",
            "channel": "c",
            "id": "small",
            "text": "still here",
            "parts": [{"type": "text", "text": "still here", "state": "done"}],
        }
        # What the relay holds now (--max-memory-bytes): the completed "small" only, its
        # chunk id and text; the aborted sources are not held.
        assert sessions.text_chars() == len("t") + len("still here")


async def test_a_completed_message_of_sources_is_counted_as_held(open_relay: OpenRelay) -> None:
    """The parts the relay keeps of a completed message (for an idempotent final) count
    toward ``--max-memory-bytes`` with their urls."""
    async with open_relay(max_message_chars=LIMIT) as (running, sub, producer):
        sessions = running.relay.producers.sessions
        assert sessions.text_chars() == 0
        for n in range(5):
            await send_json(producer, source("m", n))
        await send_json(producer, {"id": "m", "final": True})
        ack = await recv_json(producer)
        assert (ack["type"], ack["id"]) == ("ack", "m")
        message = await recv_core(sub)
        assert (message["type"], len(message["parts"])) == ("message", 5)
        assert sessions.text_chars() == 5 * SOURCE
