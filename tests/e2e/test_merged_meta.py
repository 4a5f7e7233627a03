"""End to end: a message's merged ``meta`` is bounded by --max-meta-bytes, as one event's is.

A WebSocket producer adding new meta keys to one message is refused once the next would
take the merged meta past the bound; the refusal is an ``error`` frame, the connection
stays up, and its messages complete exactly, the refused event's delta left out.
"""

from __future__ import annotations

import json
from typing import Any

from ..conftest import RunningRelay, recv_core, send_json


def json_bytes(meta: dict[str, Any]) -> int:
    """What --max-meta-bytes counts: the compact JSON, in UTF-8."""
    return len(json.dumps(meta, separators=(",", ":"), ensure_ascii=False).encode())


async def test_new_meta_keys_are_refused_at_the_bound_and_the_producer_goes_on(
    relay: RunningRelay,
) -> None:
    bound = relay.relay.settings.max_meta_bytes
    async with relay.connect("/subscribe?channel=mm") as sub:
        assert (await recv_core(sub))["type"] == "subscribed"
        async with relay.connect("/produce?channel=mm") as producer:
            await send_json(producer, {"id": "other", "delta": "before, "})
            # A completed message whose repeated final is acked, never broadcast: each ack
            # tells that every event sent before it was taken (frames are answered in order).
            await send_json(producer, {"id": "probe", "final": True})
            assert await recv_core(producer) == {"type": "ack", "id": "probe", "channel": "mm"}
            assert (await recv_core(sub))["id"] == "probe"
            text, merged = "", {}
            refusal: dict[str, Any] | None = None
            for i in range(1, 1000):
                meta = {f"key-{i:05}": "v" * 30}
                delta = "" if i % 5 == 0 else f"{i}é,"
                await send_json(producer, {"id": "m", "delta": delta, "meta": meta})
                await send_json(producer, {"id": "probe", "final": True})
                frame = await recv_core(producer)
                if frame["type"] == "error":
                    refusal = frame
                    frame = await recv_core(producer)
                assert frame == {"type": "ack", "id": "probe", "channel": "mm"}
                if refusal is not None:
                    break
                text += delta
                merged.update(meta)
            assert refusal is not None, "no event was refused"
            assert (refusal["code"], refusal["id"]) == ("invalid_event", "m")
            assert "merged meta" in refusal["message"]
            assert json_bytes(merged) <= bound < json_bytes({**merged, **meta})
            assert i > 50  # the bound, not one event's meta, refused it
            # The connection is up: the other message completes exactly...
            await send_json(producer, {"id": "other", "delta": "after", "final": True})
            assert await recv_core(producer) == {"type": "ack", "id": "other", "channel": "mm"}
            other = await recv_core(sub)
            assert (other["id"], other["text"], other.get("meta")) == (
                "other",
                "before, after",
                None,
            )
            # ... and so does the refused one's, without the refused event's delta.
            await send_json(producer, {"id": "m", "delta": "end", "final": True})
            assert await recv_core(producer) == {"type": "ack", "id": "m", "channel": "mm"}
            message = await recv_core(sub)
            assert (message["type"], message["id"], message["text"]) == (
                "message",
                "m",
                text + "end",
            )
            assert message["meta"] == merged and json_bytes(message["meta"]) <= bound


async def test_meta_holding_half_a_surrogate_pair_is_refused_and_the_producer_goes_on(
    relay: RunningRelay,
) -> None:
    async with relay.connect("/subscribe?channel=ms") as sub:
        assert (await recv_core(sub))["type"] == "subscribed"
        async with relay.connect("/produce?channel=ms") as producer:
            await send_json(producer, {"id": "m", "delta": "fine"})
            # JSON may escape half a pair alone; it is no text, so no frame could carry it.
            await producer.send('{"id": "m", "delta": "!", "meta": {"k": "\\ud800"}}')
            refusal = await recv_core(producer)
            assert (refusal["type"], refusal["code"], refusal["id"]) == (
                "error",
                "invalid_event",
                "m",
            )
            await send_json(producer, {"id": "m", "delta": ", still", "final": True})
            assert await recv_core(producer) == {"type": "ack", "id": "m", "channel": "ms"}
            message = await recv_core(sub)
            assert (message["id"], message["text"]) == ("m", "fine, still")
