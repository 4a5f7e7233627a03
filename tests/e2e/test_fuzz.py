"""Fuzz a live relay: random malformed frames of every kind beside valid streams.

Each hypothesis example starts a relay on a free port and runs, at once: a
producer streaming valid messages with bad frames mixed into the same
connection, a second producer sending only bad frames, and a subscriber sending
bad frames between valid ones. The relay must answer every bad frame with
exactly one error, never crash, and deliver every valid message exactly once
and intact.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..conftest import recv_json, start_relay

TRIED = {"bad_frames": 0, "examples": 0}

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
json_scalar = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text
json_value = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=6,
)
not_a_string = st.none() | st.booleans() | st.integers() | st.lists(json_scalar, max_size=2)
not_a_bool = st.none() | st.integers() | text | st.lists(json_scalar, max_size=2)
extra_key = text.filter(lambda k: k not in {"id", "delta", "final", "channel", "type"})


@st.composite
def bad_event(draw: st.DrawFn) -> str | bytes:
    """A producer frame that is invalid for a reason chosen at random."""
    kind = draw(st.sampled_from(["binary", "syntax", "not_object", "field", "extra", "no_id"]))
    if kind == "binary":
        return draw(st.binary(max_size=40))
    if kind == "syntax":
        return draw(st.sampled_from(["{", "[1,", "nul", '{"id": }', "{'id': 'x'}", ""]))
    if kind == "not_object":
        value = draw(json_value.filter(lambda v: not isinstance(v, dict)))
        return json.dumps(value)
    event: dict[str, Any] = {"id": draw(text)}
    if kind == "no_id":
        del event["id"]
        event["delta"] = draw(text)
    elif kind == "extra":
        event[draw(extra_key)] = draw(json_value)
    else:
        field = draw(st.sampled_from(["id", "delta", "final", "channel"]))
        event[field] = draw(not_a_bool if field == "final" else not_a_string)
    return json.dumps(event)


@st.composite
def bad_subscriber_frame(draw: st.DrawFn) -> str | bytes:
    """A subscriber frame that is invalid for a reason chosen at random."""
    kind = draw(st.sampled_from(["binary", "syntax", "not_object", "type", "field", "extra"]))
    if kind == "binary":
        return draw(st.binary(max_size=40))
    if kind == "syntax":
        return draw(st.sampled_from(["{", "]", '{"type": subscribe}', ""]))
    if kind == "not_object":
        return json.dumps(draw(json_value.filter(lambda v: not isinstance(v, dict))))
    if kind == "type":
        frame_type = draw(
            json_value.filter(lambda v: v not in ("subscribe", "unsubscribe", "cancel"))
        )
        return json.dumps({"type": frame_type, "channel": "c"})
    frame: dict[str, Any] = {
        "type": draw(st.sampled_from(["subscribe", "unsubscribe"])),
        "channel": "c",
    }
    if kind == "extra":
        frame[draw(extra_key)] = draw(json_value)
    else:
        frame["channel"] = draw(not_a_string)
    return json.dumps(frame)


valid_messages = st.lists(st.lists(text, min_size=0, max_size=5), min_size=1, max_size=4)


async def scenario(
    messages: list[list[str]], bad_events: list[str | bytes], bad_frames: list[str | bytes]
) -> None:
    running, relay = await start_relay()
    async with (
        relay,
        running.connect("/subscribe?channel=c&deltas=1") as sub,
        running.connect("/produce?channel=c") as producer,
        running.connect("/produce") as noise,
    ):
        assert (await recv_json(sub))["type"] == "subscribed"
        expected = {f"m{i}": "".join(deltas) for i, deltas in enumerate(messages)}
        pending_bad = list(bad_events)
        for i, deltas in enumerate(messages):
            for delta in deltas:
                await producer.send(json.dumps({"id": f"m{i}", "delta": delta}))
                if pending_bad:
                    await producer.send(pending_bad.pop())
        for frame in bad_events:
            await noise.send(frame)
        for frame in bad_frames:
            await sub.send(frame)
        for frame in pending_bad:
            await producer.send(frame)
        for i in range(len(messages)):
            await producer.send(json.dumps({"id": f"m{i}", "final": True}))

        replies = [await recv_json(producer) for _ in range(len(bad_events) + len(messages))]
        errors = [r for r in replies if r["type"] == "error"]
        acks = [r for r in replies if r["type"] == "ack"]
        assert len(errors) == len(bad_events) and len(acks) == len(messages)
        noise_errors = [await recv_json(noise) for _ in bad_events]
        assert all(e["type"] == "error" for e in noise_errors)

        got: dict[str, str] = {}
        sub_errors = 0
        while len(got) < len(messages) or sub_errors < len(bad_frames):
            frame = await recv_json(sub)
            if frame["type"] == "message":
                assert frame["id"] not in got
                got[frame["id"]] = frame["text"]
            elif frame["type"] == "error":
                sub_errors += 1
        assert got == expected and sub_errors == len(bad_frames)
        assert relay.server is not None and relay.server.is_serving()
    TRIED["bad_frames"] += 2 * len(bad_events) + len(bad_frames)
    TRIED["examples"] += 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=valid_messages,
    bad_events=st.lists(bad_event(), min_size=1, max_size=12),
    bad_frames=st.lists(bad_subscriber_frame(), min_size=1, max_size=8),
)
def test_relay_survives_random_bad_frames_beside_valid_streams(
    messages: list[list[str]], bad_events: list[str | bytes], bad_frames: list[str | bytes]
) -> None:
    asyncio.run(scenario(messages, bad_events, bad_frames))
    if os.environ.get("FUZZ_REPORT"):
        print(f"fuzz: {TRIED['bad_frames']} bad frames over {TRIED['examples']} examples")
