"""The fault matrix's other cells, played over real sockets as :mod:`.test_fault_matrix`
plays its own, with its readers (a WebSocket subscriber resuming by offset, an SSE subscriber
resuming with ``Last-Event-ID``, and the Durable Streams readers, by SSE and by long-poll):

* HTTP producers on two relay processes on one real redis-server behind a balancer, while a
  process is killed (SIGKILL) or stopped (SIGTERM, a rolling restart) and started again,
  each in turn: serverless gateways posting whole replies one-shot (``POST
  /produce?channel=C``, the same body posted again on a cut or a 5xx, as their retry does),
  and named producers (``&producer=NAME``) posting each reply as NDJSON chunks over several
  requests, sending again everything after the last ack (with ``seq``) when a request fails;
* the AI SDK's resumable stream (``GET /ai-sdk/{channel}/stream``) read through the process
  that is killed or stopped while a producer streams the reply through the other one, read
  on (``?id=``) when cut: it ends with the exact reply, no part twice;
* ``--workers 2`` on Redis, one worker killed (SIGKILL) and started again by its supervisor,
  each in turn, while gateways stream through the shared port and the readers follow it.

Each reader must end with every acked reply exactly once, with its exact text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from ..harness import RedisServer, SseReader, eventually, relay_process
from .test_fault_matrix import (
    Seen,
    _cluster,
    _exactly_once,
    _flags,
    _gateway,
    _judge,
    _report,
    _restarts,
    _text,
    _ws_reader,
)
from .test_workers import _pids

GATEWAYS = 4
CHUNK = 5
"""Events per request of a named producer's reply."""


def _retryable(status: int) -> bool:
    return status >= 500


async def _one_shot_gateway(
    port: int, channel: str, number: int, until: list[float], acked: dict[str, float],
    problems: list[str],
) -> None:  # fmt: skip
    """Whole replies, one ``POST`` each, posted again as they were on a cut or a 5xx."""
    loop = asyncio.get_running_loop()
    url = f"http://127.0.0.1:{port}/produce?channel={channel}"
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=20) as http:
        reply = 0
        while not until or loop.time() < until[0]:
            message_id = f"o{number}-r{reply}"
            body = json.dumps({"id": message_id, "delta": _text(message_id), "final": True})
            for _ in range(200):
                try:
                    answer = await http.post(url, content=body.encode(), headers=headers)
                except httpx.HTTPError:
                    await asyncio.sleep(0.02)
                    continue
                if not _retryable(answer.status_code):
                    break
                await asyncio.sleep(0.02)
            frames = answer.json()
            if answer.status_code != 200 or [a["id"] for a in frames["acks"]] != [message_id]:
                problems.append(f"{message_id}: {answer.status_code} {frames}")
                return
            acked[message_id] = loop.time()
            reply += 1
            await asyncio.sleep(0.05)


def _ndjson(events: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(event).encode() + b"\n" for event in events)


async def _named_gateway(
    port: int, channel: str, number: int, until: list[float], acked: dict[str, float],
    problems: list[str], retries: list[int],
) -> None:  # fmt: skip
    """Each reply as NDJSON chunks of ``CHUNK`` events, one request each, under the
    gateway's name, every event with its ``seq``. A request that fails (a cut, a 5xx, a
    409 ``producer_moved``) sends again everything after the last ack: the reply from seq
    1 (the duplicates are dropped)."""
    loop = asyncio.get_running_loop()
    url = f"http://127.0.0.1:{port}/produce?channel={channel}&producer=gw-{number}"
    headers = {"Content-Type": "application/x-ndjson"}
    async with httpx.AsyncClient(timeout=20) as http:
        reply = 0
        while not until or loop.time() < until[0]:
            message_id = f"n{number}-r{reply}"
            tokens = [token + " " for token in _text(message_id).split(" ")[:-1]]
            events: list[dict[str, Any]] = [
                {"id": message_id, "delta": token, "seq": seq}
                for seq, token in enumerate(tokens, 1)
            ]
            events.append({"id": message_id, "final": True, "seq": len(tokens) + 1})
            sent = 0
            failures = 0
            while sent < len(events):
                chunk = events[sent : sent + CHUNK]
                try:
                    answer = await http.post(url, content=_ndjson(chunk), headers=headers)
                except httpx.HTTPError:
                    answer = None
                if answer is None or answer.status_code == 409 or _retryable(answer.status_code):
                    failures += 1
                    retries[0] += 1
                    if failures > 200:
                        problems.append(f"{message_id}: gave up")
                        return
                    sent = 0
                    await asyncio.sleep(0.02)
                    continue
                frames = answer.json()
                if answer.status_code != 200 or frames["errors"]:
                    problems.append(f"{message_id} seq {chunk[0]['seq']}: {answer.status_code} "
                                    f"{frames}")  # fmt: skip
                    return
                sent += len(chunk)
                if sent == len(events):
                    if [a["id"] for a in frames["acks"]] != [message_id]:
                        problems.append(f"{message_id}: final not acked: {frames}")
                        return
                    acked[message_id] = loop.time()
                await asyncio.sleep(0.02)
            reply += 1


# ---------------------------------------------------------------------- HTTP producers


@pytest.mark.parametrize("fault", ["sigkill", "sigterm"])
async def test_one_shot_posts_retried_on_a_cut_or_5xx_land_once_across_restarts(
    fault: str, redis_server: RedisServer
) -> None:
    channel, stopped = f"oneshot-{fault}", []
    async with _cluster(redis_server) as (relays, balancer):

        async def gateway(n: int, until: list[float], acked: dict[str, float], p: list[str]):
            await _one_shot_gateway(balancer.port, channel, n, until, acked, p)

        async def faults() -> int:
            return await _restarts(redis_server, relays, balancer, fault, stopped)

        wrong, summary = await _exactly_once(
            balancer.url, balancer.port, channel, gateway, faults, GATEWAYS
        )
    _report(wrong, f"{fault} one-shot: {summary}", stopped)


@pytest.mark.parametrize("fault", ["sigkill", "sigterm"])
async def test_named_producers_ndjson_chunks_continue_exactly_across_restarts(
    fault: str, redis_server: RedisServer
) -> None:
    channel, stopped, retries = f"named-{fault}", [], [0]
    async with _cluster(redis_server) as (relays, balancer):

        async def gateway(n: int, until: list[float], acked: dict[str, float], p: list[str]):
            await _named_gateway(balancer.port, channel, n, until, acked, p, retries)

        async def faults() -> int:
            return await _restarts(redis_server, relays, balancer, fault, stopped)

        wrong, summary = await _exactly_once(
            balancer.url, balancer.port, channel, gateway, faults, GATEWAYS
        )
    _report(wrong, f"{fault} named: {retries[0]} requests sent again, {summary}", stopped)


# ---------------------------------------------------------------------- --workers 2


async def test_a_worker_killed_leaves_every_reader_every_reply_once(
    redis_server: RedisServer,
) -> None:
    """One relay with ``--workers 2`` on Redis; each worker in turn SIGKILLed mid-stream
    (its supervisor starts it again), twice."""
    relay = await relay_process(*_flags(redis_server), "--workers", "2").start()
    channel = "workers"
    try:

        async def gateway(n: int, until: list[float], acked: dict[str, float], p: list[str]):
            await _gateway(relay.url, channel, n, until, acked)

        async def faults() -> int:
            count = 0
            for _ in range(2):
                for worker in (0, 1):
                    await asyncio.sleep(0.3 + 0.1 * (count % 3))
                    before = _pids(relay)
                    os.kill(before[worker], signal.SIGKILL)
                    count += 1
                    await eventually(
                        lambda worker=worker, before=before: (
                            _pids(relay).get(worker) != before[worker]
                        ),
                        10,
                        what=f"worker {worker} started again",
                    )
            return count

        wrong, summary = await _exactly_once(
            relay.url, relay.port, channel, gateway, faults, GATEWAYS
        )
    finally:
        await relay.stop()
    print(relay.log[-3000:] if wrong else "")
    _report(wrong, f"workers: {summary}", [])


# ---------------------------------------------------------------------- the AI SDK's stream


AI_CUT_AT = 8
"""The token of a reply after which the reader's process is killed or stopped."""


async def _ai_sdk_read(
    port_of: Callable[[int], int], channel: str, streams: list[dict[str, Any]]
) -> None:
    """A resuming reader of ``GET /ai-sdk/{channel}/stream``: the first request waits for a
    reply to start; when its stream is cut before ``[DONE]``, it asks again for that reply
    by ``?id=`` (through ``port_of(attempt)``), and the new stream replaces what it held
    (the AI SDK's own resume does so: it starts again from ``start`` under the same
    ``messageId``). Each stream, as read, is appended to ``streams``."""
    message_id: str | None = None
    attempt = 0
    while True:
        path = f"/ai-sdk/{channel}/stream" + (f"?id={message_id}" if message_id else "?wait=10")
        stream: dict[str, Any] = {"chunks": [], "text": "", "done": False, "cut": None}
        streams.append(stream)
        try:
            async with SseReader(port_of(attempt), path) as sse:
                stream["status"] = sse.status
                if sse.status != 200:
                    raise ConnectionError(f"status {sse.status}")
                while True:
                    event = await sse.next(15)
                    if event.data == "[DONE]":
                        stream["done"] = True
                        return
                    chunk = json.loads(event.data)
                    stream["chunks"].append(chunk)
                    if chunk["type"] == "start":
                        message_id = chunk["messageId"]
                    elif chunk["type"] == "text-delta":
                        stream["text"] += chunk["delta"]
        except Exception as error:  # a cut, an answer not 200, a stream ended: read on
            stream["cut"] = repr(error)
            attempt += 1
            await asyncio.sleep(0.05)


def _ai_sdk_wrong(message_id: str, streams: list[dict[str, Any]]) -> list[str]:
    """What is wrong with what the resuming reader read of reply ``message_id``."""
    text, wrong = _text(message_id), []
    read = [s for s in streams if s["chunks"]]
    for number, stream in enumerate(read):
        chunks = stream["chunks"]
        types = [chunk["type"] for chunk in chunks]
        if types[0] != "start" or chunks[0]["messageId"] != message_id:
            wrong.append(f"stream {number} starts {chunks[0]}")
        if not text.startswith(stream["text"]):
            wrong.append(f"stream {number} text {stream['text']!r} is not the reply's start")
        if "abort" in types or "error" in types:
            wrong.append(f"stream {number} ended {chunks[-1]}")
        if stream["done"] and (types[-1] != "finish" or stream["text"] != text):
            wrong.append(f"stream {number} done with {types[-1]}, text {stream['text']!r}")
    if not read or not read[-1]["done"]:
        wrong.append(f"no stream read to [DONE]: {streams}")
    if any(s["done"] for s in read[:-1]):
        wrong.append("read on after [DONE]")
    return wrong


@pytest.mark.parametrize("fault", ["sigkill", "sigterm"])
async def test_the_ai_sdk_stream_read_on_across_its_process_killed_or_stopped(
    fault: str, redis_server: RedisServer
) -> None:
    """Four replies, each streamed by a producer on one process and read through the other,
    which is killed or stopped when the reader is some tokens in; the reader reads on
    through whichever process runs."""
    from token_relay.client import RelayProducer

    channel, stopped, wrong = f"ai-{fault}", [], []
    cuts, endings = 0, []
    async with _cluster(redis_server) as (relays, balancer):
        for number in range(4):
            victim, other = number % 2, 1 - number % 2
            message_id = f"ai-{number}"
            streams: list[dict[str, Any]] = []
            first = relays[victim].port
            reading = asyncio.create_task(
                _ai_sdk_read(
                    lambda attempt, first=first: first if attempt == 0 else balancer.port,
                    channel,
                    streams,
                )
            )
            await asyncio.sleep(0.2)  # the reader waits (?wait=) for the reply to start
            async with RelayProducer(relays[other].url, channel=channel) as producer:
                tokens = _text(message_id).split(" ")[:-1]
                for at, token in enumerate(tokens):
                    await producer.send(message_id, token + " ")
                    await asyncio.sleep(0.01)
                    if at == AI_CUT_AT:
                        await eventually(lambda s=streams: bool(s and s[0]["text"]), 5)
                        if fault == "sigkill":
                            await relays[victim].kill()
                        else:
                            assert await relays[victim].terminate(15) == 0, relays[victim].log
                        stopped.append(relays[victim])
                        relays[victim] = relay_process(*_flags(redis_server))
                        await relays[victim].start()
                        balancer.backends = [relay.port for relay in relays]
                await asyncio.wait_for(producer.finish(message_id), 30)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reading, 20)
            cuts += sum(1 for s in streams if s["cut"])
            endings.append(
                [(len(s["chunks"]), s["chunks"][-1]["type"] if s["chunks"] else s.get("status"),
                  "[DONE]" if s["done"] else (s["cut"] or "")[:40]) for s in streams]
            )  # fmt: skip
            found = _ai_sdk_wrong(message_id, streams)
            if found:
                wrong += [f"{message_id}: {w}" for w in found] + [f"streams: {streams}"]
    _report(wrong, f"{fault} ai-sdk: 4 replies, {cuts} cuts, streams: {endings}", stopped)


# ---------------------------------------------------------------------- step by step


async def _keep_alive_post(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, body: bytes,
    content_type: str = "application/json",
) -> tuple[int, Any]:  # fmt: skip
    """``POST path`` on a kept-alive connection: the status and JSON answer, or (0, the
    error) if the connection failed."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: r\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    try:
        writer.write(head.encode() + body)
        status_line = await asyncio.wait_for(reader.readline(), 10)
        status = int(status_line.split()[1])
        length = 0
        while (line := await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        payload = await asyncio.wait_for(reader.readexactly(length), 10)
    except (OSError, EOFError, ValueError, IndexError, TimeoutError) as error:
        return 0, repr(error)
    return status, json.loads(payload) if payload.startswith(b"{") else payload


async def test_a_one_shot_post_that_reaches_a_stopping_process_is_acked_or_told_to_retry(
    redis_server: RedisServer,
) -> None:
    """One-shot posts, back to back on connections kept alive to one process, when it is
    sent SIGTERM (a rolling restart): each is acked, or refused in a way a gateway retries
    (a cut, a 5xx, a 409), and its retry on the other process is acked; the channel then
    holds each message exactly once. None may be answered 200 with neither its ack nor an
    error: a gateway takes that for done, and the reply would be lost."""
    flags = (*_flags(redis_server), "--max-handshakes-per-ip", "1000")
    a, b = relay_process(*flags), relay_process(*flags)
    await asyncio.gather(a.start(), b.start())
    path, connections = "/produce?channel=stopping", 100
    answers: dict[str, tuple[int, Any]] = {}

    async def gateway(number: int) -> None:
        """Posts on one kept-alive connection, one after the other, until one fails."""
        await asyncio.sleep(0.005 * number)  # within --max-handshakes-per-ip
        reader, writer = await asyncio.open_connection("127.0.0.1", a.port)
        for reply in range(10_000):
            message_id = f"s{number}-{reply}"
            body = json.dumps({"id": message_id, "delta": _text(message_id), "final": True})
            answers[message_id] = await _keep_alive_post(reader, writer, path, body.encode())
            if answers[message_id][0] != 200:
                break
        writer.close()

    async def long_poll(http: httpx.AsyncClient) -> None:
        """A reader waiting on a quiet channel: the process answers it as it stops."""
        with contextlib.suppress(httpx.HTTPError):
            await http.get(f"http://127.0.0.1:{a.port}/v1/stream/__channel/quiet",
                           params={"offset": "now", "live": "long-poll"})  # fmt: skip

    seen = Seen("websocket")
    ready = asyncio.Event()
    reading = asyncio.create_task(_ws_reader(b.url, "stopping", seen, ready))
    limits = httpx.Limits(max_connections=200)
    http = httpx.AsyncClient(timeout=20, limits=limits)
    try:
        await asyncio.wait_for(ready.wait(), 15)
        polls = asyncio.gather(*(long_poll(http) for _ in range(100)))
        flood = asyncio.gather(*(gateway(n) for n in range(connections)))
        await eventually(
            lambda: all(f"s{n}-2" in answers for n in range(connections)),
            10,
            what="posts under way on every connection",
        )
        assert a.process is not None
        a.process.terminate()
        await asyncio.wait_for(flood, 20)
        assert await a.wait(15) == 0
        silent = {m: answer for m, answer in answers.items() if answer[0] == 200
                  and [ack["id"] for ack in answer[1]["acks"]] != [m]}  # fmt: skip
        retried = {}
        for message_id, (status, answer) in answers.items():
            if status == 200:
                continue
            assert status in (0, 409) or status >= 500, (message_id, status, answer)
            if status == 503 and isinstance(answer, dict):  # refused by the stopping process
                codes = [(error["code"], error["index"]) for error in answer["errors"]]
                assert codes == [("relay_stopping", 0)], answer
            body = json.dumps({"id": message_id, "delta": _text(message_id), "final": True})
            retried[message_id] = await _keep_alive_post(
                *await asyncio.open_connection("127.0.0.1", b.port), path, body.encode()
            )
        print(
            f"{len(answers)} posts: {len(retried)} sent again after "
            f"{sorted({s for s, _ in answers.values()})}, {len(silent)} answered 200 with no "
            f"ack: {silent}"
        )
        assert all(
            status == 200 and [ack["id"] for ack in answer["acks"]] == [m]
            for m, (status, answer) in retried.items()
        ), retried
        await polls
        acked = {m for m, (s, _) in answers.items() if s == 200} | set(retried)
        acked -= set(silent)
        await eventually(lambda: acked <= seen.ids(), 10, what="every ack read")
        await asyncio.sleep(0.3)  # anything more (a duplicate) would come now
        assert _judge(seen, dict.fromkeys(acked, 0.0)) == []
        assert silent == {}, silent
    finally:
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        await http.aclose()
        await asyncio.gather(a.stop(), b.stop())


async def test_a_named_producers_chunk_that_reaches_a_stopping_process_is_applied_or_refused(
    redis_server: RedisServer,
) -> None:
    """Named producers posting their replies as NDJSON chunks (``seq`` on every event),
    back to back on connections kept alive to one process, when it is sent SIGTERM: a
    chunk is applied (200, no error), or refused in a way the gateway acts on (a cut, a 5xx,
    a 409 ``producer_moved``: it sends the reply again from seq 1 on the other process).
    No chunk may be answered 200 with its lines not applied: the gateway would go on, and
    the reply would stop at a ``seq_gap`` or, its final lost, never complete."""
    flags = (*_flags(redis_server), "--max-handshakes-per-ip", "1000")
    a, b = relay_process(*flags), relay_process(*flags)
    await asyncio.gather(a.start(), b.start())
    producers, ndjson = 60, "application/x-ndjson"
    outcomes: dict[str, str] = {}
    acked: dict[str, float] = {}
    started: set[int] = set()

    def events(message_id: str) -> list[dict[str, Any]]:
        tokens = [token + " " for token in _text(message_id).split(" ")[:-1]]
        listed: list[dict[str, Any]] = [
            {"id": message_id, "delta": token, "seq": seq} for seq, token in enumerate(tokens, 1)
        ]
        return [*listed, {"id": message_id, "final": True, "seq": len(tokens) + 1}]

    async def gateway(number: int) -> None:
        await asyncio.sleep(0.005 * number)  # within --max-handshakes-per-ip
        path = f"/produce?channel=named-stopping&producer=step-{number}"
        port = a.port
        connection = await asyncio.open_connection("127.0.0.1", port)
        for reply in range(10_000):
            message_id = f"p{number}-{reply}"
            listed, sent, again = events(message_id), 0, 0
            while sent < len(listed):
                chunk = listed[sent : sent + CHUNK]
                status, answer = await _keep_alive_post(*connection, path, _ndjson(chunk), ndjson)
                started.add(number)
                if status in (0, 409) or status >= 500:
                    # Send the reply again from seq 1, on the other process.
                    again += 1
                    if again > 20:
                        outcomes[message_id] = f"gave up after {status} {answer}"
                        return
                    connection[1].close()
                    port = b.port
                    connection = await asyncio.open_connection("127.0.0.1", port)
                    sent = 0
                    continue
                if status != 200 or answer["errors"]:
                    outcomes[message_id] = f"seq {chunk[0]['seq']}: {status} {answer}"
                    return
                sent += len(chunk)
                if sent == len(listed):
                    if [ack["id"] for ack in answer["acks"]] != [message_id]:
                        outcomes[message_id] = f"its final answered without an ack: {answer}"
                        return
                    acked[message_id] = 0.0
            if port == b.port:
                break  # one whole reply on the other process after the stop: done
        connection[1].close()

    seen = Seen("websocket")
    ready = asyncio.Event()
    reading = asyncio.create_task(_ws_reader(b.url, "named-stopping", seen, ready))
    try:
        await asyncio.wait_for(ready.wait(), 15)
        flood = asyncio.gather(*(gateway(n) for n in range(producers)))
        await eventually(lambda: len(started) == producers and len(acked) > producers, 10,
                         what="chunks under way on every connection")  # fmt: skip
        assert a.process is not None
        a.process.terminate()
        await asyncio.wait_for(flood, 30)
        assert await a.wait(15) == 0
        print(f"{len(acked)} replies acked; went wrong: {outcomes}")
        await eventually(lambda: set(acked) <= seen.ids(), 10, what="every ack read")
        await asyncio.sleep(0.3)  # anything more (a duplicate) would come now
        assert _judge(seen, acked) == []
        assert outcomes == {}
    finally:
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        await asyncio.gather(a.stop(), b.stop())
