"""``python -m bench.structured``: ingest of a structured reply against the same characters
as plain text.

A structured reply is reasoning, one tool call's input and text, each a third of its
characters, in 3-character AI SDK chunks (``{"id", "chunk": {"type": "reasoning-delta", ...}}``);
the plain one is the same characters as top-level deltas (``{"id", "delta"}``). Each is 300
replies of 900 characters, each reply ending with a final. Two figures, characters per
second of each and their ratio (structured over plain; the target is at least 0.9):

* ``core``: the pure core only, in this process: each frame decoded
  (:func:`~token_relay.core.codec.decode_producer_frame`) and applied
  (:meth:`~token_relay.core.streams.MessageStreams.receive`); the best of ``--repeat`` passes.
* ``relay``: a relay process, one WebSocket producer writing every frame at once, timed
  until the last final's ack; the best of ``--repeat`` passes, each on a new channel.

And a join mid-reply: one reply of ``--join-chars`` characters (30,000), streamed to its
middle and left in progress, plain or structured as above; a deltas subscriber joins it,
as its snapshot (the text so far, or the compacted chunks) is made and sent:

* ``join, core``: the cut's work in this process, the snapshot made and encoded
  (:meth:`~token_relay.core.streams.MessageStreams.partial` and a plain snapshot, or
  :meth:`~token_relay.core.streams.MessageStreams.live_parts` and its snapshot); the median
  of ``--joins``;
* ``join, relay``: one subscriber connection to a relay process that subscribes (with
  ``deltas``) and unsubscribes again, timed from its ``subscribe`` frame to the snapshot's
  arrival; the median of ``--joins``.

Each is shown as joins per second (the inverse of the median), so a ratio at or above 1.0
means the structured join costs no more than the plain one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

from token_relay.core.codec import decode_producer_frame, encode_parts_snapshot
from token_relay.core.protocol import Snapshot, encode
from token_relay.core.streams import MessageStreams
from websockets.asyncio.client import connect

from .cases import check_alive, relay, started
from .wire import RawProducer, client_frame

REPLY = "The quick brown fox jumps over the lazy dog. " * 20
"""One reply's 900 characters."""
DELTA = 3
"""Characters per delta."""


def frames(structured: bool, replies: int, prefix: str = "m") -> list[str]:
    """The producer frames of ``replies`` replies, each ending with its final."""
    pieces = [REPLY[at : at + DELTA] for at in range(0, len(REPLY), DELTA)]
    third = len(pieces) // 3
    events: list[dict[str, Any]] = []
    for index in range(replies):
        message_id = f"{prefix}{index}"
        chunks: list[dict[str, Any]] = []
        if structured:
            chunks.append({"type": "reasoning-start", "id": "r"})
            chunks += [{"type": "reasoning-delta", "id": "r", "delta": p} for p in pieces[:third]]
            chunks.append({"type": "reasoning-end", "id": "r"})
            chunks.append({"type": "tool-input-start", "toolCallId": "c", "toolName": "w"})
            chunks += [
                {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": p}
                for p in pieces[third : 2 * third]
            ]
            chunks.append({"type": "text-start", "id": "t"})
            chunks += [{"type": "text-delta", "id": "t", "delta": p} for p in pieces[2 * third :]]
            events += [{"id": message_id, "chunk": chunk} for chunk in chunks]
        else:
            events += [{"id": message_id, "delta": piece} for piece in pieces]
        events.append({"id": message_id, "final": True})
    return [json.dumps(event, separators=(",", ":")) for event in events]


def core(structured: bool, replies: int, repeat: int) -> float:
    """Characters per second through decoding and the core, the best of ``repeat`` passes."""
    texts = frames(structured, replies)
    best = float("inf")
    for _ in range(repeat):
        streams = MessageStreams("c", max_completed=replies * 2)
        start = time.perf_counter()
        for text in texts:
            event = decode_producer_frame(text)
            assert not isinstance(event, list)
            streams.receive(event)
        best = min(best, time.perf_counter() - start)
        if len(streams._completed) != replies:
            raise SystemExit("the core did not complete every reply")
    return replies * len(REPLY) / best


async def through_relay(replies: int, repeat: int) -> dict[bool, float]:
    """Characters per second through a relay process, plain and structured, passes
    interleaved; the best of ``repeat`` each."""
    notable: list[str] = []
    server = relay("relay")
    best = {False: float("inf"), True: float("inf")}
    async with started(server, notable=notable):
        for n in range(repeat + 1):  # the first pass of each warms up
            for structured in (False, True):
                channel = f"{'s' if structured else 'p'}{n}"
                data = b"".join(
                    client_frame(text.encode()) for text in frames(structured, replies, channel)
                )
                async with RawProducer(server.port, channel) as producer:
                    start = time.perf_counter()
                    await producer.write(data)
                    await asyncio.wait_for(producer.acked(replies), 120)
                    seconds = producer.last_ack - start
                if n:
                    best[structured] = min(best[structured], seconds)
                check_alive(server)
    for line in notable:
        print(line, file=sys.stderr)
    return {kind: replies * len(REPLY) / seconds for kind, seconds in best.items()}


def _half(structured: bool, chars: int, message_id: str) -> list[str]:
    """The producer frames of the first half of one reply of ``chars`` characters."""
    global REPLY
    saved = REPLY
    try:
        REPLY = (saved * (chars // len(saved) + 1))[:chars]
        texts = frames(structured, 1, message_id)[:-1]  # no final
    finally:
        REPLY = saved
    return texts[: len(texts) // 2]


def join_core(structured: bool, chars: int, joins: int) -> float:
    """Joins per second of the cut's work in the core: the snapshot made and encoded."""
    streams = MessageStreams("c", max_chars=chars * 2)
    for text in _half(structured, chars, "m"):
        event = decode_producer_frame(text)
        assert not isinstance(event, list)
        streams.receive(event)
    times = []
    for _ in range(joins):
        start = time.perf_counter()
        plain = streams.partial("m0")
        if plain is not None:
            encode(Snapshot(channel="c", id="m0", text=plain))
        else:
            live = streams.live_parts("m0")
            assert live is not None
            encode_parts_snapshot("c", "m0", *live)
        times.append(time.perf_counter() - start)
    return 1 / statistics.median(times)


async def join_relay(chars: int, joins: int) -> dict[bool, float]:
    """Joins per second through a relay process: subscribe, snapshot received, unsubscribe."""
    notable: list[str] = []
    server = relay("relay", "--max-subscribes-per-second", "1000000")  # a join per frame
    result: dict[bool, float] = {}
    async with started(server, notable=notable):
        base = f"ws://127.0.0.1:{server.port}"
        for structured in (False, True):
            channel = "js" if structured else "jp"
            async with connect(f"{base}/produce?channel={channel}") as producer:
                for text in _half(structured, chars, "m"):
                    await producer.send(text)
                await producer.send(json.dumps({"id": "sync", "final": True}))
                while json.loads(await producer.recv()).get("id") != "sync":
                    pass
                async with connect(f"{base}/subscribe") as subscriber:
                    times = []
                    for n in range(joins + 20):  # the first 20 warm up
                        start = time.perf_counter()
                        await subscriber.send(json.dumps(
                            {"type": "subscribe", "channel": channel, "deltas": True}
                        ))  # fmt: skip
                        while (got := json.loads(await subscriber.recv()))["type"] != "snapshot":
                            if got["type"] == "error":
                                raise SystemExit(f"the join was refused: {got}")
                        if n >= 20:
                            times.append(time.perf_counter() - start)
                        await subscriber.send(
                            json.dumps({"type": "unsubscribe", "channel": channel})
                        )
                        while (got := json.loads(await subscriber.recv()))[
                            "type"
                        ] != "unsubscribed":
                            if got["type"] == "error":
                                raise SystemExit(f"the unsubscribe was refused: {got}")
            result[structured] = 1 / statistics.median(times)
            check_alive(server)
    for line in notable:
        print(line, file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.structured", description=__doc__)
    parser.add_argument("--replies", type=int, default=300, help="replies per pass (300)")
    parser.add_argument("--repeat", type=int, default=5, help="passes per figure (5)")
    parser.add_argument("--no-relay", action="store_true", help="the core figures only")
    parser.add_argument("--join-chars", type=int, default=30_000, help="a joined reply's size")
    parser.add_argument("--joins", type=int, default=200, help="joins per join figure (200)")
    args = parser.parse_args(argv)
    rows = [("core", core(False, args.replies, args.repeat), core(True, args.replies, args.repeat))]
    if not args.no_relay:
        speeds = asyncio.run(through_relay(args.replies, args.repeat))
        rows.append(("relay, WebSocket producer", speeds[False], speeds[True]))
    print(f"{'ingest of ' + str(args.replies) + ' replies':<28} {'plain':>12} {'structured':>12}")
    for what, plain, structured in rows:
        print(
            f"{what:<28} {plain / 1e6:7.2f} Mc/s {structured / 1e6:7.2f} Mc/s"
            f"   ratio {structured / plain:.2f}x"
        )
    chars, joins = args.join_chars, args.joins
    joined = [("join, core", join_core(False, chars, joins), join_core(True, chars, joins))]
    if not args.no_relay:
        rates = asyncio.run(join_relay(chars, joins))
        joined.append(("join, relay", rates[False], rates[True]))
    title = f"join mid-reply, {chars // 2} chars so far"
    print(f"{title:<28} {'plain':>12} {'structured':>12}")
    for what, plain, structured in joined:
        print(
            f"{what:<28} {plain:8.0f} j/s {structured:8.0f} j/s   ratio {structured / plain:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
