"""Abuse played against real relay processes: ``python -m bench.abuse`` (from the repository root).

Each case starts a fresh relay process (``python -m token_relay --port 0``) of the installation
under test, reads its resident set size (RSS) before the abuse, samples it every 50 ms while it
lasts (the peak), and again once the abuse has stopped and the process has had half a second to
settle; then it stops the process. Every case is bounded in time, runs in its own ``try`` (a
failure is reported as ``error: ...`` for that case and the run goes on), and stops every
process it started. Whether the relay was still alive at the end, and how many warnings or
tracebacks it logged, is reported for every case.

* ``slowloris``: the relay runs with a soft ``RLIMIT_NOFILE`` of 1,024; 3,000 sockets from
  127.0.0.1 trickle ``GET /subscribe?channel=c HTTP/1.1`` one byte every 0.5 s for 10 s,
  while a canary opens a real subscriber every 0.2 s, both from the attacker's address and from
  another one (127.0.0.2). Figures: what became of the attack sockets, the canaries' success
  rate, and the seconds from closing every attack socket until a canary gets in again.
* ``held_posts``: the relay runs with a soft ``RLIMIT_NOFILE`` of 1,024 and
  ``--max-connections-per-ip 20``; 1,000 streaming ``POST /produce`` requests from 127.0.0.1
  send their heads and hold their bodies open, each opened again 0.1 s after the relay ends it,
  from a process of their own, while a canary subscriber from 127.0.0.2 tries every 0.2 s for
  10 s. Figures: what became of the requests, the relay's open descriptors, its CPU seconds,
  and the canaries' success rate and latency (median and worst of the successes).
* ``bad_requests``: 2,100 requests a peer gets wrong from 127.0.0.1, 30 at a time
  (``?rewind=²`` on a handshake, ``?rewind=`` of 5,000 digits on ``/sse``, a path that does not
  exist), while a canary subscribes from 127.0.0.2 every 0.2 s. Figures: what each got, the
  log lines, bytes and tracebacks the relay wrote meanwhile, its CPU seconds, and the canaries.
* ``forged_resume``: an SSE stream of channel ``s`` resumed with a ``Last-Event-ID`` that also
  names 200 channels it doesn't follow (about 11,000 characters), then one message on ``s``.
  Figures: the status, and the bytes of each event's ``id:`` line.
* ``junk_channel_keys``: a relay on a redis-server; one subscriber subscribes to and
  unsubscribes from 100 junk channels (as fast as ``--max-subscribes-per-second`` lets it).
  Figures: how many subscribes were confirmed, the keys in Redis before and after, how many
  name a junk channel, and the TTL of one of them.
* ``ping_flood``: one WebSocket peer that never reads writes up to 2,000,000 pings (for 10 s at
  most). Figures: whether the relay cut it (or stopped reading, or was still reading when the
  10 s were over), how many pings it had written, the relay's CPU seconds meanwhile, and
  whether a subscriber still gets in afterwards.
* ``junk_subscribes``: a subscriber notes the position of channel ``real``, a message is
  published to it, one connection sends 10,001 subscribe and unsubscribe pairs for
  ``junk-N`` without waiting (their answers are counted until none has come for a second), and
  a new connection resumes ``real`` from the position noted. Figure: whether it was
  ``recovered``.
* ``cancel_flood``: producer P opens message ``m`` on channel ``a`` and stops reading its
  socket; producer Q streams message ``q`` on ``b``; a subscriber of ``a`` writes 300,000
  cancels of ``m`` as fast as the socket takes them. Then P reads again. Figures: whether the
  relay closed P, whether P's message can still complete, whether Q's message reached a
  subscriber of ``b`` (and how long after its final).
* ``parked_sessions``: 400 times, one at a time, a producer sends three 1,000,000-character
  deltas of one new message and vanishes (the TCP connection is cut with no close frame).
* ``memory``: 200 producers each hold one unfinished message of 2,000,000 characters, with
  ``--max-memory-bytes 268435456`` where the relay has that flag. Figure: how many messages
  were refused with ``overloaded``.
* ``nginx_600``: two relays on one redis-server behind a real nginx running
  ``deploy/nginx.conf`` (with ``--trusted-proxy 127.0.0.1`` where the relay has that flag); 600
  subscribers from 600 source addresses, in batches of 50 (figure: how many got HTTP 429);
  then two ``POST /produce`` requests with a 1-byte body, and a subscriber through nginx every
  0.2 s for 12 s (figures: how many failed, the seconds until the first got in, and until the
  last failure ended: nginx may take a relay out of rotation only after a first success).
* ``worker_kill``: ``--workers 2`` on a redis-server; one worker is killed with SIGKILL.
  Figures: whether the supervisor logged and restarted it, and the seconds until there are two
  workers again and a subscriber gets in.
* ``webhook_answer``: a webhook receiver answers each POST with 200 and a 256 MiB body that
  it writes as fast as the relay reads it; three messages are POSTed to it, one after
  another (``--webhook-timeout 60``). A canary producer sends a message every 0.1 s to a
  canary subscriber meanwhile. Figures: the messages delivered, the answer bytes the receiver
  wrote, the relay's CPU seconds, and the canary's round trips (p50 and worst, in ms).
* ``dead_letters``: ``--webhook-max-pending-bytes 8388608 --max-memory-bytes 67108864
  --history-size 1``, a webhook URL that refuses connections and ``--webhook-max-age 0.5``;
  176 messages of 500,000 characters on 16 channels die as dead letters (sent at most 16
  ahead of the dead), with the same canary. Figures: the dead letters kept and dropped,
  ``relay_memory_bytes`` at the end, the relay's CPU seconds and the canary's round trips.
* ``chunked_json``: one ``POST /produce`` of 40 MiB of JSON in 64 KiB chunks with no
  ``Content-Length`` (the relay's ``--max-body-bytes`` is its default, 1 MiB).
* ``ndjson_trickle``: one NDJSON line of a million bytes in 32-byte chunks, then its final.
* ``body_resets``: 1,000 NDJSON ``POST /produce`` requests, one after another, each reset
  (``SO_LINGER`` 0) after a first line that opens a message. Figures: the
  ``http_producer`` gauge before and after, the ``aborted`` frames a subscriber got within 2 s
  of the last reset, and the relay's CPU seconds.

``chunked_json`` and ``ndjson_trickle`` run a canary beside the attack: a real producer and
subscriber passing one small message after another on their own channel. Figures: the
canary's median and worst latency (send to delivery) while the attack lasts, the attack's
answer and how long it took, and the relay's CPU seconds meanwhile.

``parked_sessions`` and ``memory`` run the relay with ``--max-message-chars 4194304``, which
both installations know: with the default of 1 MiB the second delta of every message would
abort it (``message_too_large``) and the relay would hold no unfinished text of that size.

To compare two installations, run it twice, the second time with the other one's interpreter
(the bench itself always runs here; only the relay processes use ``--relay-python``)::

    python -m bench.abuse --json new.json
    python -m bench.abuse --relay-python /path/to/other/venv/bin/python --json old.json

Flags are passed to a relay only if its ``--help`` names them, so an older relay, which
rejects flags it does not know, still runs every case (with its own defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import itertools
import json
import multiprocessing
import os
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.harness import Nginx, RedisServer, ServiceProcess, cpu_seconds, rss_bytes

from .wire import (
    CHUNK_BYTES,
    CLOSE,
    PING,
    TEXT,
    FrameParser,
    check_upgrade,
    client_frame,
    upgrade_request,
)

MIB = 1024 * 1024
SETTLE_SECONDS = 0.5
SAMPLE_SECONDS = 0.05
NGINX_CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "nginx.conf"
BIG_MESSAGES = ("--max-message-chars", "4194304")
Figures = dict[str, Any]


# ------------------------------------------------------------------ relays and their memory


@dataclass(frozen=True)
class Installation:
    """A relay installation: its interpreter and the flags its ``--help`` names."""

    python: str
    flags: frozenset[str]

    def supports(self, flag: str) -> bool:
        """Whether this relay knows ``flag``."""
        return flag in self.flags

    def only_known(self, *pairs: tuple[str, str]) -> list[str]:
        """The ``(flag, value)`` pairs this relay knows, flattened into arguments."""
        return [part for flag, value in pairs if self.supports(flag) for part in (flag, value)]


def installation(python: str) -> Installation:
    """Ask ``python -m token_relay --help`` which flags it knows."""
    help_text = subprocess.run(
        [python, "-m", "token_relay", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return Installation(python, frozenset(re.findall(r"--[a-z][a-z0-9-]*", help_text)))


@contextlib.asynccontextmanager
async def relays(
    inst: Installation, out: Figures, *flags: Sequence[str], nofile: int | None = None
) -> AsyncIterator[list[ServiceProcess]]:
    """One relay process per sequence of flags, started together and killed on the way out;
    ``nofile`` lowers their soft ``RLIMIT_NOFILE`` (this process's own is restored at once).
    Records in ``out`` whether each was still alive at the end and how much it warned."""
    processes = [
        ServiceProcess("token_relay", *args, name=f"relay{n}", python=inst.python)
        for n, args in enumerate(flags)
    ]
    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, saved[1]))
        try:
            await asyncio.gather(*(process.start() for process in processes))
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, saved)
        yield processes
    finally:
        out["relay_alive_at_end"] = all(process.alive for process in processes)
        codes = [process.process.returncode for process in processes if process.process]
        if any(code is not None for code in codes):
            out["relay_exit_codes"] = codes
        await asyncio.gather(*(process.stop() for process in processes))
        warnings = [line for process in processes for line in process.warnings]
        out["relay_log_warnings"] = len(warnings)
        if warnings:
            out["relay_first_warning"] = warnings[0][:200]


def total_rss(processes: Sequence[ServiceProcess]) -> int | None:
    """The RSS of every process together, or ``None`` once one of them has gone."""
    try:
        sizes = [rss_bytes(process.pid) for process in processes if process.alive]
    except OSError:
        return None
    return sum(sizes) if len(sizes) == len(processes) else None


class RssWatch:
    """RSS before an abuse, its peak while it lasts (sampled), and after it has settled."""

    def __init__(self, processes: Sequence[ServiceProcess], out: Figures) -> None:
        self.processes, self.out = processes, out
        self.before = total_rss(processes) or 0
        self.peak = self.before
        self._sampling = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        while (size := total_rss(self.processes)) is not None:
            self.peak = max(self.peak, size)
            await asyncio.sleep(SAMPLE_SECONDS)

    async def settled(self) -> None:
        """Wait :data:`SETTLE_SECONDS`, then record before, peak and settled growth in MiB."""
        await asyncio.sleep(SETTLE_SECONDS)
        after = total_rss(self.processes)
        self._sampling.cancel()
        self.out["rss_before_mib"] = round(self.before / MIB, 1)
        self.out["rss_growth_mib"] = (
            None if after is None else round((after - self.before) / MIB, 1)
        )
        self.out["rss_peak_growth_mib"] = round((self.peak - self.before) / MIB, 1)


async def metric(port: int, name: str) -> float | None:
    """The sum of a metric's samples in ``GET /metrics``, or ``None`` if it is not there;
    ``name`` may name one sample's labels too (``relay_connections{role="http_producer"}``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        if length:
            body = await asyncio.wait_for(reader.readexactly(int(length.group(1))), 5)
        else:
            body = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    pattern = re.compile(rf"(?m)^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$")
    values = [float(value) for value in pattern.findall(body.decode(errors="replace"))]
    return sum(values) if values else None


# ------------------------------------------------------------------ clients


async def try_subscribe(
    url: str,
    source: str | None = None,
    timeout: float = 3.0,  # noqa: ASYNC109 - a bound on one handshake, passed on to connect
    channel: str = "canary",
) -> str:
    """Open a real subscriber and wait for its ``subscribed`` frame: ``"ok"``, ``"429"`` (an
    HTTP status), ``"timeout"`` or the exception's name."""
    try:
        async with (
            asyncio.timeout(timeout + 1),
            connect(
                f"{url}/subscribe?channel={channel}",
                open_timeout=timeout,
                close_timeout=0.5,
                compression=None,
                proxy=None,
                local_addr=(source, 0) if source else None,
            ) as ws,
        ):
            frame = json.loads(await ws.recv())
            return "ok" if frame.get("type") == "subscribed" else f"frame {frame.get('type')}"
    except InvalidStatus as exc:
        return str(exc.response.status_code)
    except TimeoutError:
        return "timeout"
    except Exception as exc:
        return type(exc).__name__


async def _client(url: str, **options: Any) -> ClientConnection:
    """A client connection of the cases: no size limit, no compression, no proxy."""
    return await connect(
        url,
        open_timeout=5,
        close_timeout=1,
        max_size=None,
        compression=None,
        proxy=None,
        **options,
    )


async def producer(url: str, channel: str) -> ClientConnection:
    """A producer connection past its ``session`` frame."""
    ws = await _client(f"{url}/produce?channel={channel}", ping_interval=None)
    await asyncio.wait_for(ws.recv(), 5)  # the session frame
    return ws


async def subscriber(url: str, query: str) -> tuple[ClientConnection, dict[str, Any]]:
    """A subscriber connection and, with a ``?channel=``, its first frame (``subscribed``)."""
    ws = await _client(f"{url}/subscribe?{query}")
    first: dict[str, Any] = {}
    if "channel=" in query:
        first = json.loads(await asyncio.wait_for(ws.recv(), 5))
    return ws, first


async def frame_where(
    ws: ClientConnection,
    wanted: Callable[[dict[str, Any]], bool],
    timeout: float,  # noqa: ASYNC109 - a bound on the whole search
    seen: collections.Counter[str] | None = None,
) -> dict[str, Any] | None:
    """The first frame ``wanted`` accepts within ``timeout`` (others are counted in ``seen``,
    by error code or type), or ``None``."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while True:
                frame: dict[str, Any] = json.loads(await ws.recv())
                if wanted(frame):
                    return frame
                if seen is not None:
                    seen[str(frame.get("code") or frame.get("type"))] += 1
    return None


def is_error(code: str) -> Callable[[dict[str, Any]], bool]:
    """A :func:`frame_where` test for an error frame with ``code``."""
    return lambda frame: frame.get("type") == "error" and frame.get("code") == code


class RawPeer:
    """A WebSocket client on a bare asyncio stream: pre-built frames out, as fast as the socket
    takes them, and (once :meth:`read` is called) the frames that come back counted, by error
    code or by type."""

    def __init__(self, port: int, target: str) -> None:
        self.port, self.target = port, target
        self.counts: collections.Counter[str] = collections.Counter()
        self.closed: str | None = None
        """How the relay ended the connection, once it has."""
        self.last_progress = 0.0
        """When the socket last took a chunk, ``time.monotonic()``."""
        self._reading: asyncio.Task[None] | None = None

    async def open(self, receive_buffer: int | None = None) -> None:
        """Connect and upgrade; ``receive_buffer`` sets the socket's ``SO_RCVBUF`` first."""
        sock = socket.socket()
        try:
            if receive_buffer is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            sock.setblocking(False)
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", self.port)), 5)
        except BaseException:
            sock.close()
            raise
        self.reader, self.writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
        protocol, request = upgrade_request(self.port, self.target)
        self.writer.write(request)
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        check_upgrade(protocol, head, self.target)

    @property
    def transport(self) -> asyncio.Transport:
        """The socket's transport."""
        transport = self.writer.transport
        assert isinstance(transport, asyncio.Transport)
        return transport

    def read(self) -> None:
        """Read and count frames from now on, in a task."""
        self._reading = asyncio.create_task(self._read())

    async def _read(self) -> None:
        parser = FrameParser()
        try:
            while data := await self.reader.read(CHUNK_BYTES):
                for opcode, payload in parser.feed(data):
                    if opcode == TEXT:
                        frame = json.loads(payload)
                        self.counts[str(frame.get("code") or frame.get("type"))] += 1
                    elif opcode == CLOSE:
                        code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                        self.closed = f"close frame {code}"
                        return
            self.closed = "EOF"
        except OSError as exc:
            self.closed = type(exc).__name__

    async def write(self, data: bytes, deadline: float) -> tuple[str, int]:
        """Write ``data`` in chunks, waiting whenever the socket is full: ``("done", n)``,
        ``("cut", n)`` once the relay has closed the connection, or, if ``deadline``
        (``time.monotonic()``) came first, ``("stalled", n)`` when the socket had taken
        nothing for a second (the relay stopped reading) and ``("deadline", n)`` otherwise;
        ``n`` is the bytes written."""
        view, written = memoryview(data), 0
        self.last_progress = time.monotonic()
        while written < len(view):
            if self.closed or self.transport.is_closing():
                return "cut", written
            chunk = view[written : written + CHUNK_BYTES]
            try:
                self.writer.write(chunk)
                await asyncio.wait_for(self.writer.drain(), max(deadline - time.monotonic(), 0))
            except TimeoutError:
                stalled = time.monotonic() - self.last_progress > 1.0
                return ("stalled" if stalled else "deadline"), written
            except OSError:
                return "cut", written
            written += len(chunk)
            self.last_progress = time.monotonic()
        return "done", written

    async def quiet(self, idle: float = 1.0, limit: float = 20.0) -> float:
        """Wait until no frame has come for ``idle`` s (or the connection is closed), for
        ``limit`` s at most; returns the seconds waited."""
        started = last_change = time.monotonic()
        total = self.counts.total()
        while not self.closed and time.monotonic() - started < limit:
            await asyncio.sleep(0.05)
            if self.counts.total() != total:
                total, last_change = self.counts.total(), time.monotonic()
            elif time.monotonic() - last_change >= idle:
                break
        return round(time.monotonic() - started, 2)

    async def close(self) -> None:
        """Cut the connection (no close frame) and stop reading."""
        self.transport.abort()
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading


async def canaries(
    url: str, sources: Sequence[str | None], seconds: float, every: float = 0.2
) -> dict[str | None, list[str]]:
    """A subscriber from each of ``sources`` every ``every`` s for ``seconds``: outcomes."""
    outcomes: dict[str | None, list[asyncio.Task[str]]] = {source: [] for source in sources}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for source in sources:
            outcomes[source].append(asyncio.create_task(try_subscribe(url, source)))
        await asyncio.sleep(every)
    return {source: list(await asyncio.gather(*tasks)) for source, tasks in outcomes.items()}


@dataclass
class Window:
    """Subscribers tried one after another: what each got, and when."""

    outcomes: list[str]
    first_success_s: float | None
    """Seconds from the start until the first success ended, ``None`` if none did."""
    last_failure_s: float | None
    """Seconds from the start until the last failure ended, ``None`` if none did."""


async def time_to_serve(
    url: str,
    timeout: float,  # noqa: ASYNC109 - a bound on the whole window
    every: float = 0.2,
    source: Callable[[int], str | None] = lambda n: None,
    full: bool = False,
) -> Window:
    """A subscriber every ``every`` s (the n-th from ``source(n)``) for ``timeout`` s, or, unless
    ``full``, until one gets in."""
    started = time.monotonic()
    successes: list[float] = []
    failures: list[float] = []

    async def attempt(n: int) -> str:
        outcome = await try_subscribe(url, source(n))
        (successes if outcome == "ok" else failures).append(time.monotonic() - started)
        return outcome

    tasks: list[asyncio.Task[str]] = []
    while time.monotonic() - started < timeout and (full or not successes):
        tasks.append(asyncio.create_task(attempt(len(tasks))))
        await asyncio.sleep(every)
    outcomes = list(await asyncio.gather(*tasks))
    first = round(min(successes), 2) if successes else None
    return Window(outcomes, first, round(max(failures), 2) if failures else None)


def rate(outcomes: Sequence[str]) -> dict[str, int]:
    """Successes out of tries, as the table shows them."""
    return {"successes": outcomes.count("ok"), "tries": len(outcomes)}


def tally(outcomes: Sequence[str]) -> dict[str, int]:
    """How many times each outcome came."""
    return dict(collections.Counter(outcomes).most_common())


# ------------------------------------------------------------------ 1. slowloris

SLOW_HEAD = b"GET /subscribe?channel=c HTTP/1.1\r\nHost: r\r\n"


async def slowloris(inst: Installation, out: Figures) -> None:
    """3,000 trickled request heads against a relay with 1,024 file descriptors."""
    async with relays(inst, out, [], nofile=1024) as (relay,):
        watch = RssWatch([relay], out)
        stop = asyncio.Event()
        fates: collections.Counter[str] = collections.Counter()

        async def trickle() -> None:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", relay.port), 3
                )
            except (OSError, TimeoutError):
                fates["connect failed"] += 1
                return
            fate, position = "open", 0
            try:
                while not stop.is_set():
                    if position < len(SLOW_HEAD):
                        writer.write(SLOW_HEAD[position : position + 1])
                        position += 1
                    try:
                        data = await asyncio.wait_for(reader.read(256), 0.5)
                    except TimeoutError:
                        continue
                    status = re.match(rb"HTTP/1\.[01] (\d{3})", data)
                    fate = f"answered {status.group(1).decode()}" if status else "cut"
                    break
            except OSError:
                fate = "cut"
            finally:
                fates[fate] += 1
                writer.close()

        attack = [asyncio.create_task(trickle()) for _ in range(3000)]
        await asyncio.sleep(1.0)  # the connects are under way (each has 3 s)
        during = await canaries(relay.url, [None, "127.0.0.2"], seconds=10.0)
        stop.set()
        await asyncio.gather(*attack)
        out["attack_sockets"] = dict(fates.most_common())
        out["canary_success_same_addr"] = rate(during[None])
        out["canary_success_other_addr"] = rate(during["127.0.0.2"])
        out["canary_failures"] = tally([o for o in during[None] if o != "ok"])
        out["time_to_serve_again_s"] = (await time_to_serve(relay.url, 15.0)).first_success_s
        await watch.settled()


# ------------------------------------------------------------------ 1b. held requests

HELD_POST = (
    b"POST /produce?channel=held HTTP/1.1\r\nHost: r\r\nContent-Type: application/x-ndjson\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
HELD_POSTS = 1000


async def timed_subscribe(url: str, source: str) -> tuple[str, float]:
    """:func:`try_subscribe`, and the seconds it took."""
    started = time.monotonic()
    outcome = await try_subscribe(url, source)
    return outcome, time.monotonic() - started


async def hold_posts(port: int, count: int, seconds: float) -> dict[str, int]:
    """``count`` streaming ``POST /produce`` requests held open for ``seconds``, each opened
    again 0.1 s after the relay ends it: what became of them."""
    stop = asyncio.Event()
    fates: collections.Counter[str] = collections.Counter()

    async def hold() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), 3
                )
            except (OSError, TimeoutError):
                fates["connect failed"] += 1
                await asyncio.sleep(0.1)
                continue
            try:
                writer.write(HELD_POST)
                reading = asyncio.ensure_future(reader.read(256))
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait([reading, stopping], return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                if not reading.done():
                    reading.cancel()
                    fates["held to the end"] += 1
                    return
                data = b"" if reading.exception() else reading.result()
                status = re.match(rb"HTTP/1\.[01] (\d{3})", data)
                fates[f"answered {status.group(1).decode()}" if status else "cut"] += 1
                await asyncio.sleep(0.1)  # then try again
            finally:
                writer.transport.abort()

    attack = [asyncio.create_task(hold()) for _ in range(count)]
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*attack)
    return dict(fates.most_common())


def _hold_posts_process(port: int, count: int, seconds: float, results: Any) -> None:
    """:func:`hold_posts` in a process of its own, so that its work does not slow the
    canaries' own clock; what became of the requests goes to ``results``."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results.put(asyncio.run(hold_posts(port, count, seconds)))


async def held_posts(inst: Installation, out: Figures) -> None:
    """Streaming request bodies held open from one address against a relay with 1,024 file
    descriptors and ``--max-connections-per-ip 20``, reopened as the relay ends them."""
    flags = inst.only_known(("--max-connections-per-ip", "20"), ("--idle-timeout", "60"))
    async with relays(inst, out, flags, nofile=1024) as (relay,):
        watch = RssWatch([relay], out)
        cpu = cpu_seconds(relay.pid)
        spawn = multiprocessing.get_context("spawn")
        results = spawn.Queue()
        attacker = spawn.Process(
            target=_hold_posts_process, args=(relay.port, HELD_POSTS, 14.0, results)
        )
        attacker.start()
        try:
            await asyncio.sleep(2.0)  # the connects are under way
            tries: list[asyncio.Task[tuple[str, float]]] = []
            for _ in range(50):
                tries.append(asyncio.create_task(timed_subscribe(relay.url, "127.0.0.2")))
                await asyncio.sleep(0.2)
            out["relay_open_fds_at_end"] = len(os.listdir(f"/proc/{relay.pid}/fd"))
            canaries_done = await asyncio.gather(*tries)
            out["attack_requests"] = await asyncio.to_thread(results.get, True, 30)
        finally:
            await asyncio.to_thread(attacker.join, 10)
            if attacker.is_alive():
                attacker.kill()
        out["relay_cpu_s"] = round(cpu_seconds(relay.pid) - cpu, 2)
        canary_figures(canaries_done, out)
        await watch.settled()


def canary_figures(canaries_done: Sequence[tuple[str, float]], out: Figures) -> None:
    """The canaries' success rate, failures, and the median and worst latency of successes."""
    outcomes = [outcome for outcome, _ in canaries_done]
    out["canary_success_other_addr"] = rate(outcomes)
    out["canary_failures"] = tally([o for o in outcomes if o != "ok"])
    seconds = sorted(took for outcome, took in canaries_done if outcome == "ok")
    if seconds:
        out["canary_p50_ms"] = round(1000 * seconds[len(seconds) // 2], 1)
        out["canary_max_ms"] = round(1000 * seconds[-1], 1)


# ------------------------------------------------------------------ 1c. bad requests

BAD_REQUESTS = (
    b"GET /subscribe?channel=c&rewind=%C2%B2 HTTP/1.1\r\nHost: r\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    b"GET /sse?channel=c&rewind=" + b"9" * 5000 + b" HTTP/1.1\r\nHost: r\r\n\r\n",
    b"GET /nowhere HTTP/1.1\r\nHost: r\r\n\r\n",
)
BAD_ROUNDS = 700


async def bad_request(port: int, request: bytes) -> str:
    """Send one request; the status it got, ``no answer`` or ``cut``."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 3)
    except (OSError, TimeoutError):
        return "connect failed"
    try:
        writer.write(request)
        line = await asyncio.wait_for(reader.readline(), 3)
        status = re.match(rb"HTTP/1\.[01] (\d{3})", line)
        return status.group(1).decode() if status else "no answer"
    except TimeoutError:
        return "no answer (timeout)"
    except OSError:
        return "cut"
    finally:
        writer.transport.abort()


async def bad_requests(inst: Installation, out: Figures) -> None:
    """Requests a peer gets wrong, 2,100 from one address, 30 at a time, while a canary
    subscribes from another address every 0.2 s."""
    async with relays(inst, out, []) as (relay,):
        watch = RssWatch([relay], out)
        cpu = cpu_seconds(relay.pid)
        lines, size, tracebacks = relay.log_lines, relay.log_bytes, relay.tracebacks
        stop = asyncio.Event()

        async def canary() -> list[tuple[str, float]]:
            done = []
            while not stop.is_set():
                done.append(await timed_subscribe(relay.url, "127.0.0.2"))
                await asyncio.sleep(0.2)
            return done

        canaries = asyncio.create_task(canary())
        requests = [request for _ in range(BAD_ROUNDS) for request in BAD_REQUESTS]
        statuses: list[str] = []
        for start in range(0, len(requests), 30):
            batch = requests[start : start + 30]
            statuses += await asyncio.gather(*(bad_request(relay.port, r) for r in batch))
        stop.set()
        canary_figures(await canaries, out)
        out["relay_cpu_s"] = round(cpu_seconds(relay.pid) - cpu, 2)
        out["answers"] = tally(statuses)
        await asyncio.sleep(0.5)  # the log is read as it comes
        out["log_lines_written"] = relay.log_lines - lines
        out["log_bytes_written"] = relay.log_bytes - size
        out["tracebacks_logged"] = relay.tracebacks - tracebacks
        await watch.settled()


# ------------------------------------------------------------------ 1d. a forged resume token


async def sse_event_ids(port: int, token: str) -> tuple[str, list[int]]:
    """``GET /sse?channel=s`` with ``Last-Event-ID: token``: the status, and the size of the
    ``id:`` line of each event up to the first ``message``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"GET /sse?channel=s HTTP/1.1\r\nHost: r\r\nLast-Event-ID: {token}\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        status = head.split()[1].decode()
        if status != "200":
            return status, []
        sizes: list[int] = []
        while True:
            line = await asyncio.wait_for(reader.readline(), 5)
            if line.startswith(b"id: "):
                sizes.append(len(line))
            if line.startswith(b"event: message"):
                line = await asyncio.wait_for(reader.readline(), 5)
                if line.startswith(b"id: "):
                    sizes.append(len(line))
                return status, sizes
    finally:
        writer.transport.abort()


async def forged_resume(inst: Installation, out: Figures) -> None:
    """A resume token naming 200 channels the stream doesn't follow, besides its own."""
    async with relays(inst, out, []) as (relay,):
        watch = RssWatch([relay], out)
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        writer.write(b"GET /sse?channel=s HTTP/1.1\r\nHost: r\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        while not (line := await asyncio.wait_for(reader.readline(), 5)).startswith(b"id: "):
            pass
        writer.transport.abort()
        own = json.loads(base64url_decode(line[4:].strip().decode()))
        forged = {"s": own["s"], **{f"junk-{n:03d}": [n, "e" * 20] for n in range(200)}}
        token = base64url_encode(json.dumps(forged, separators=(",", ":")))
        out["forged_token_chars"] = len(token)
        watching = asyncio.create_task(sse_event_ids(relay.port, token))
        await asyncio.sleep(0.5)  # it has joined, or been refused
        producer_ws = await producer(relay.url, "s")
        await producer_ws.send(json.dumps({"id": "m", "delta": "hi", "final": True}))
        status, sizes = await watching
        await producer_ws.close()
        out["status"] = status
        out["event_id_bytes"] = sizes
        await watch.settled()


def base64url_decode(text: str) -> bytes:
    """Base64url without padding, decoded."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def base64url_encode(text: str) -> str:
    """Base64url of ``text`` without padding."""
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


# ------------------------------------------------------------------ 1e. junk channels' keys

JUNK_CHANNELS = 100


async def junk_channel_keys(inst: Installation, out: Figures) -> None:
    """100 junk channels subscribed and unsubscribed on a relay on a redis-server: the keys
    they leave behind."""
    with tempfile.TemporaryDirectory() as scratch:
        redis = RedisServer(Path(scratch))
        redis.start()
        try:
            async with relays(inst, out, ["--broker", redis.url]) as (relay,):
                from redis.asyncio import Redis

                client = Redis.from_url(redis.url)
                try:
                    before = await client.dbsize()
                    ws = await _client(f"{relay.url}/subscribe")
                    subscribed = 0
                    for n in range(JUNK_CHANNELS):
                        channel = f"junk-{n}"
                        await ws.send(json.dumps({"type": "subscribe", "channel": channel}))
                        subscribed += json.loads(await ws.recv())["type"] == "subscribed"
                        await ws.send(json.dumps({"type": "unsubscribe", "channel": channel}))
                        await ws.recv()
                    await ws.close()
                    out["junk_channels_subscribed"] = subscribed
                    keys = [key async for key in client.scan_iter("tr:*junk-*")]
                    out["keys_before"] = before
                    out["keys_after"] = await client.dbsize()
                    out["keys_naming_a_junk_channel"] = len(keys)
                    ttls = [await client.ttl(key) for key in keys[:1]]
                    out["their_ttl_s"] = ttls[0] if ttls else None
                finally:
                    await client.aclose()
        finally:
            redis.kill()


# ------------------------------------------------------------------ 2. ping flood

PINGS = 2_000_000
PINGS_PER_WRITE = 10_000


async def ping_flood(inst: Installation, out: Figures) -> None:
    """Pings from a peer that never reads a pong."""
    async with relays(inst, out, []) as (relay,):
        watch = RssWatch([relay], out)
        peer = RawPeer(relay.port, "/subscribe?channel=flood")
        await peer.open(receive_buffer=64 * 1024)
        peer.transport.pause_reading()  # never read again
        chunk = client_frame(b"flooding", PING) * PINGS_PER_WRITE
        started, cpu = time.monotonic(), cpu_seconds(relay.pid)
        deadline = started + 10.0
        sent, status = 0, "done"
        while sent < PINGS and time.monotonic() < deadline:
            status, written = await peer.write(chunk, deadline)
            sent += written // len(client_frame(b"flooding", PING))
            if status != "done":
                break
        out["pings_written"] = sent
        out["relay_cut_connection"] = status == "cut"
        out["outcome"] = {
            "done": "all written",
            "cut": "cut by the relay",
            "stalled": "relay stopped reading",
            "deadline": "10 s over, relay still reading",
        }[status]
        out["seconds_flooding"] = round(time.monotonic() - started, 2)
        out["relay_cpu_s"] = round(cpu_seconds(relay.pid) - cpu, 2)
        if status == "stalled":
            out["relay_stopped_reading_after_s"] = round(peer.last_progress - started, 2)
        await peer.close()
        out["subscriber_after"] = await try_subscribe(relay.url)
        await watch.settled()


# ------------------------------------------------------------------ 3. junk subscribes

JUNK_PAIRS = 10_001


async def junk_subscribes(inst: Installation, out: Figures) -> None:
    """Subscribes to junk channel names, then a resume of a real channel from before them."""
    async with relays(inst, out, []) as (relay,):
        watch = RssWatch([relay], out)
        watcher, first = await subscriber(relay.url, "channel=real")
        position = {"offset": first["offset"], "epoch": first["epoch"]}
        publisher = await producer(relay.url, "real")
        await publisher.send(json.dumps({"id": "m1", "delta": "hello", "final": True}))
        acked = await frame_where(publisher, lambda f: f.get("type") == "ack", 5)
        got = await frame_where(watcher, lambda f: f.get("type") == "message", 5)
        out["message_published"] = bool(acked and got)
        await publisher.close()
        await watcher.close()

        frames = b"".join(
            client_frame(json.dumps({"type": kind, "channel": f"junk-{n}"}).encode())
            for n in range(JUNK_PAIRS)
            for kind in ("subscribe", "unsubscribe")
        )
        junk = RawPeer(relay.port, "/subscribe")
        await junk.open()
        junk.read()
        status, _ = await junk.write(frames, time.monotonic() + 20)
        # Read the answers until none has come for a second: every frame has been served.
        out["junk_answers_quiet_after_s"] = await junk.quiet()
        out["junk_frames_sent"] = 2 * JUNK_PAIRS if status == "done" else status
        out["junk_answers"] = dict(junk.counts.most_common())
        out["junk_connection_closed"] = junk.closed or False
        await junk.close()

        resumer, _ = await subscriber(relay.url, "")
        await resumer.send(json.dumps({"type": "subscribe", "channel": "real", "since": position}))
        answer = await frame_where(resumer, lambda f: f.get("type") == "subscribed", 5)
        out["resume_recovered"] = None if answer is None else answer.get("recovered")
        replayed = await frame_where(resumer, lambda f: f.get("type") == "message", 1)
        out["resume_replayed_message"] = bool(replayed and replayed.get("id") == "m1")
        if answer is not None and answer.get("epoch") != position["epoch"]:
            out["resume_epoch_changed"] = True
        await resumer.close()
        await watch.settled()


# ------------------------------------------------------------------ 4. cancel flood

CANCELS = 300_000


async def cancel_flood(inst: Installation, out: Figures) -> None:
    """Cancels of a message whose producer does not read, beside another producer's stream."""
    async with relays(inst, out, []) as (relay,):
        watch = RssWatch([relay], out)
        p = await producer(relay.url, "a")
        await p.send(json.dumps({"id": "m", "delta": "unfinished"}))
        await asyncio.sleep(0.1)
        assert p.transport is not None
        p.transport.pause_reading()

        watcher, _ = await subscriber(relay.url, "channel=b")
        q = await producer(relay.url, "b")
        flooder = RawPeer(relay.port, "/subscribe?channel=a")
        await flooder.open()
        flooder.read()
        for _ in range(100):
            if flooder.counts["subscribed"]:
                break
            await asyncio.sleep(0.02)
        flooding = asyncio.Event()
        flooding.set()

        async def stream() -> tuple[int, float]:
            deltas = 0
            while flooding.is_set():
                await q.send(json.dumps({"id": "q", "delta": "token "}))
                deltas += 1
                await asyncio.sleep(0.01)
            await q.send(json.dumps({"id": "q", "final": True}))
            return deltas, time.monotonic()

        streaming = asyncio.create_task(stream())
        frame = client_frame(json.dumps({"type": "cancel", "channel": "a", "id": "m"}).encode())
        started = time.monotonic()
        status, written = await flooder.write(frame * CANCELS, started + 20)
        out["cancels_written"] = written // len(frame)
        out["flood_outcome"] = status
        out["flood_seconds"] = round(time.monotonic() - started, 2)
        flooding.clear()
        q_deltas, q_final_at = await streaming
        message = await frame_where(
            watcher, lambda f: f.get("type") == "message" and f.get("id") == "q", 10
        )
        out["q_delivered"] = bool(message and message["text"] == "token " * q_deltas)
        if message:
            out["q_final_to_message_ms"] = round((time.monotonic() - q_final_at) * 1000, 1)
        out["flooder_answers_quiet_after_s"] = await flooder.quiet()  # the flood's answers
        out["flooder_answers"] = dict(flooder.counts.most_common())
        out["flooder_closed"] = flooder.closed or False

        p.transport.resume_reading()
        cancels, closed = 0, None
        try:
            async with asyncio.timeout(8):
                while True:
                    raw = await asyncio.wait_for(p.recv(), 1.0)
                    cancels += json.loads(raw).get("type") == "cancel"
        except TimeoutError:
            pass
        except ConnectionClosed as exc:
            closed = f"close {exc.rcvd.code}" if exc.rcvd else "no close frame"
        out["p_cancels_received"] = cancels
        out["p_closed_by_relay"] = closed or False
        if closed is None:
            await p.send(json.dumps({"id": "m", "final": True}))
            ack = await frame_where(p, lambda f: f.get("type") == "ack", 5)
            out["p_message_completed"] = ack is not None
        await flooder.close()
        for ws in (p, q, watcher):
            await ws.close()
        await watch.settled()


# ------------------------------------------------------------------ 5. parked sessions

PARKED = 400
MILLION_X = "x" * 1_000_000


def delta_frame(message_id: str) -> str:
    """One event whose delta is a million characters (a frame under 1 MiB)."""
    return f'{{"id":"{message_id}","delta":"{MILLION_X}"}}'


async def synced(ws: ClientConnection, seen: collections.Counter[str]) -> bool:
    """Send a frame that is not JSON and wait for its ``invalid_json`` error: every frame sent
    before it has then been applied. Other frames on the way are counted in ``seen``."""
    await ws.send("sync")
    return await frame_where(ws, is_error("invalid_json"), 15, seen) is not None


async def parked_sessions(inst: Installation, out: Figures) -> None:
    """Producers that send three million-character deltas and vanish, one after another."""
    async with relays(inst, out, BIG_MESSAGES) as (relay,):
        watch = RssWatch([relay], out)
        seen: collections.Counter[str] = collections.Counter()
        deadline = time.monotonic() + 60
        vanished = 0
        for n in range(PARKED):
            if time.monotonic() > deadline:
                break
            ws = await producer(relay.url, "parked")
            for _ in range(3):
                await ws.send(delta_frame(f"m{n}"))
            await synced(ws, seen)
            assert ws.transport is not None
            ws.transport.abort()  # no close frame
            vanished += 1
        out["producers_vanished"] = vanished
        out["producer_errors"] = dict(seen.most_common())
        await watch.settled()
        with contextlib.suppress(Exception):
            out["parked_sessions_metric"] = await metric(relay.port, "relay_parked_sessions")
            out["memory_bytes_metric"] = await metric(relay.port, "relay_memory_bytes")


# ------------------------------------------------------------------ 6. memory

HOLDERS = 200


async def memory(inst: Installation, out: Figures) -> None:
    """Producers each holding an unfinished message of two million characters."""
    limit = inst.only_known(("--max-memory-bytes", "268435456"))
    out["max_memory_bytes_flag"] = bool(limit)
    async with relays(inst, out, [*BIG_MESSAGES, *limit]) as (relay,):
        watch = RssWatch([relay], out)
        held: list[ClientConnection] = []
        refused = 0
        codes: collections.Counter[str] = collections.Counter()
        deadline = time.monotonic() + 45
        try:
            for n in range(HOLDERS):
                if time.monotonic() > deadline:
                    break
                ws = await producer(relay.url, "memory")
                held.append(ws)
                seen: collections.Counter[str] = collections.Counter()
                for _ in range(2):
                    await ws.send(delta_frame(f"m{n}"))
                await synced(ws, seen)
                refused += bool(seen["overloaded"])
                codes.update(seen)
            out["producers"] = len(held)
            out["refused_overloaded"] = refused
            out["producer_errors"] = dict(codes.most_common())
            await watch.settled()
            with contextlib.suppress(Exception):
                out["memory_bytes_metric"] = await metric(relay.port, "relay_memory_bytes")
        finally:
            for ws in held:
                assert ws.transport is not None
                ws.transport.abort()


# ------------------------------------------------------------------ 7. nginx

CROWD = 600
BATCH = 50


def crowd_address(n: int, block: int = 1) -> str:
    """The ``n``-th of 200 source addresses per ``127.0.B.0/24``, from ``127.0.block.1``."""
    return f"127.0.{block + n // 200}.{1 + n % 200}"


async def post_with_body(port: int) -> str:
    """``POST /produce`` with a 1-byte body: the status line nginx answers, or what failed."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        return type(exc).__name__
    try:
        writer.write(
            b"POST /produce HTTP/1.1\r\nHost: r\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"
        )
        line = await asyncio.wait_for(reader.readline(), 12)
        return line.decode(errors="replace").strip() or "EOF"
    except TimeoutError:
        return "no answer in 12 s"
    except OSError as exc:
        return type(exc).__name__
    finally:
        writer.close()


async def nginx_600(inst: Installation, out: Figures) -> None:
    """600 users from 600 addresses through nginx, then bodies, then who gets in."""
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        (directory / "redis").mkdir()
        (directory / "nginx").mkdir()
        redis = RedisServer(directory / "redis")
        redis.start()
        try:
            flags = [
                "--broker",
                redis.url,
                *inst.only_known(("--trusted-proxy", "127.0.0.1")),
            ]
            out["trusted_proxy_flag"] = inst.supports("--trusted-proxy")
            async with relays(inst, out, flags, flags) as pair:
                watch = RssWatch(pair, out)
                nginx = Nginx(NGINX_CONFIG, [relay.port for relay in pair], directory / "nginx")
                await asyncio.to_thread(nginx.start)
                try:
                    await crowd_then_bodies(nginx, out)
                    await watch.settled()
                finally:
                    nginx.stop()
        finally:
            redis.kill()


async def crowd_then_bodies(nginx: Nginx, out: Figures) -> None:
    """The two phases of :func:`nginx_600`, through ``nginx``."""
    held: list[ClientConnection] = []
    outcomes: list[str] = []

    async def join(n: int) -> None:
        try:
            ws = await connect(
                f"{nginx.url}/subscribe?channel=crowd",
                open_timeout=10,
                close_timeout=1,
                compression=None,
                proxy=None,
                local_addr=(crowd_address(n), 0),
            )
        except InvalidStatus as exc:
            outcomes.append(str(exc.response.status_code))
            return
        except Exception as exc:
            outcomes.append(type(exc).__name__)
            return
        held.append(ws)
        try:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 5))
            outcomes.append("ok" if frame.get("type") == "subscribed" else "no subscribed")
        except Exception as exc:
            outcomes.append(type(exc).__name__)

    try:
        for start in range(0, CROWD, BATCH):
            await asyncio.gather(*(join(n) for n in range(start, start + BATCH)))
        out["crowd_outcomes"] = tally(outcomes)
        out["crowd_429"] = outcomes.count("429")
    finally:
        await asyncio.gather(*(ws.close() for ws in held), return_exceptions=True)
    await asyncio.sleep(0.5)

    posts = [asyncio.create_task(post_with_body(nginx.port)) for _ in range(2)]
    await asyncio.sleep(0.05)  # both written
    window = await time_to_serve(
        nginx.url, 12.0, source=lambda n: crowd_address(n, block=10), full=True
    )
    after = window.outcomes
    out["post_answers"] = list(await asyncio.gather(*posts))
    out["connects_after_bodies"] = len(after)
    out["failed_connects_after_bodies"] = len(after) - after.count("ok")
    out["failures_after_bodies"] = tally([o for o in after if o != "ok"])
    out["time_to_serve_again_s"] = window.first_success_s
    out["last_failure_after_bodies_s"] = window.last_failure_s
    errors = nginx.errors.strip().splitlines()
    out["nginx_error_log_lines"] = len(errors)
    if errors:
        out["nginx_first_error"] = errors[0][:200]


# ------------------------------------------------------------------ 9-11. request bodies


class Canary:
    """A real producer and subscriber on channel ``canary``: one small message after another
    (each 50 ms after the last arrived), timed from the producer's send to the subscriber's
    ``message`` frame, for as long as it runs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect both, then send in a task."""
        self.producer = await producer(self.url, "canary")
        self.subscriber, _ = await subscriber(self.url, "channel=canary")
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        n = 0
        while True:
            n += 1
            message_id = f"k{n}"
            sent = time.monotonic()
            await self.producer.send(json.dumps({"id": message_id, "delta": "x", "final": True}))
            got = await frame_where(self.subscriber, has_id(message_id), 10)
            if got is None:
                self.failures += 1
            else:
                self.latencies.append(time.monotonic() - sent)
            await asyncio.sleep(0.05)

    async def stop(self, out: Figures) -> None:
        """Stop, and record the latencies' count, median and worst in ``out``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.producer.close()
        await self.subscriber.close()
        ordered = sorted(self.latencies)
        out["canary_messages"] = len(ordered)
        out["canary_failures"] = self.failures
        if ordered:
            out["canary_p50_ms"] = round(1000 * ordered[len(ordered) // 2], 1)
            out["canary_max_ms"] = round(1000 * ordered[-1], 1)


def has_id(message_id: str) -> Callable[[dict[str, Any]], bool]:
    """A :func:`frame_where` test for a frame of message ``message_id``."""
    return lambda frame: frame.get("id") == message_id


CHUNKED_HEAD = (
    "POST /produce?channel={channel} HTTP/1.1\r\nHost: relay\r\nContent-Type: {kind}\r\n"
    "Transfer-Encoding: chunked\r\n\r\n"
)
JSON_BODY_BYTES = 40 * MIB
JSON_CHUNK_BYTES = 64 * 1024
TRICKLE_LINE_BYTES = 1_000_000
TRICKLE_CHUNK_BYTES = 32
RESETS = 1000


def http_chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def post_chunked(
    port: int, kind: str, chunks: Iterator[bytes], deadline: float
) -> tuple[str, int]:
    """``POST /produce`` with a chunked body of ``chunks``, written as fast as the socket
    takes them, until they are all sent, the relay answers, or ``deadline`` (monotonic): the
    answer's status line (or why none came) and the body bytes sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = asyncio.create_task(reader.readline())
    sent = 0
    try:
        writer.write(CHUNKED_HEAD.format(channel="attack", kind=kind).encode())
        for chunk in chunks:
            if answer.done() or time.monotonic() > deadline:
                break
            writer.write(http_chunk(chunk))
            sent += len(chunk)
            await asyncio.wait_for(writer.drain(), max(deadline - time.monotonic(), 0.01))
        else:
            writer.write(b"0\r\n\r\n")
        status = await asyncio.wait_for(answer, max(deadline - time.monotonic(), 0.01))
        return status.decode(errors="replace").strip() or "closed, no answer", sent
    except TimeoutError:
        return "no answer by the deadline", sent
    except OSError as exc:
        return f"cut ({type(exc).__name__})", sent
    finally:
        answer.cancel()
        writer.transport.abort()


async def body_attack(
    inst: Installation, out: Figures, attack: Callable[[ServiceProcess], Awaitable[None]]
) -> None:
    """One relay, a canary beside it, and ``attack`` against it: the relay's CPU seconds
    and RSS while it lasts, and the canary's latency."""
    async with relays(inst, out, []) as (relay,):
        watch = RssWatch([relay], out)
        canary = Canary(relay.url)
        await canary.start()
        await asyncio.sleep(0.5)  # the canary's latency before the attack, too
        cpu = cpu_seconds(relay.pid)
        await attack(relay)
        out["relay_cpu_s"] = round(cpu_seconds(relay.pid) - cpu, 2)
        await canary.stop(out)
        await watch.settled()


async def chunked_json(inst: Installation, out: Figures) -> None:
    """A chunked JSON ``POST /produce`` body of 40 MiB (no ``Content-Length``) in 64 KiB
    chunks, against the default ``--max-body-bytes`` of 1 MiB."""

    async def attack(relay: ServiceProcess) -> None:
        chunks = (b"[" * JSON_CHUNK_BYTES for _ in range(JSON_BODY_BYTES // JSON_CHUNK_BYTES))
        started = time.monotonic()
        status, sent = await post_chunked(relay.port, "application/json", chunks, started + 30)
        out["answer"] = status
        out["body_mib_sent"] = round(sent / MIB, 1)
        out["seconds_to_answer"] = round(time.monotonic() - started, 2)

    await body_attack(inst, out, attack)


async def ndjson_trickle(inst: Installation, out: Figures) -> None:
    """One NDJSON line of a million bytes in 32-byte chunks (then its final)."""

    async def attack(relay: ServiceProcess) -> None:
        line = json.dumps({"id": "t", "delta": "y" * (TRICKLE_LINE_BYTES - 23)}).encode()
        body = line + b"\n" + json.dumps({"id": "t", "final": True}).encode() + b"\n"
        chunks = (
            body[n : n + TRICKLE_CHUNK_BYTES] for n in range(0, len(body), TRICKLE_CHUNK_BYTES)
        )
        started = time.monotonic()
        status, _ = await post_chunked(relay.port, "application/x-ndjson", chunks, started + 40)
        out["answer"] = status
        out["seconds_to_answer"] = round(time.monotonic() - started, 2)

    await body_attack(inst, out, attack)


async def body_resets(inst: Installation, out: Figures) -> None:
    """1,000 NDJSON ``POST /produce`` requests, one after another, each reset (``SO_LINGER``
    0) after its first line, a delta that opens a message."""
    async with relays(inst, out, []) as (relay,):
        watch = RssWatch([relay], out)
        gauge = 'relay_connections{role="http_producer"}'
        out["http_producer_gauge_before"] = await metric(relay.port, gauge) or 0.0  # unset: 0
        watcher, _ = await subscriber(relay.url, "channel=attack")
        cpu = cpu_seconds(relay.pid)
        for n in range(RESETS):
            _, writer = await asyncio.open_connection("127.0.0.1", relay.port)
            line = json.dumps({"id": f"r{n}", "delta": "half"}).encode() + b"\n"
            head = CHUNKED_HEAD.format(channel="attack", kind="application/x-ndjson")
            writer.write(head.encode() + http_chunk(line))
            await writer.drain()
            await asyncio.sleep(0.002)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        out["relay_cpu_s"] = round(cpu_seconds(relay.pid) - cpu, 2)
        seen: collections.Counter[str] = collections.Counter()
        await frame_where(watcher, lambda frame: False, 2, seen)  # counts what comes in 2 s
        out["aborted_within_2_s_of_the_last_reset"] = seen["aborted"]
        await watcher.close()
        await watch.settled()
        out["http_producer_gauge_after"] = await metric(relay.port, gauge)


# ------------------------------------------------------------------ main

# ------------------------------------------------------------------ 8. a worker killed


async def worker_kill(inst: Installation, out: Figures) -> None:
    """``--workers 2`` on Redis: SIGKILL one worker, then count the seconds until there are
    two workers again and a new subscriber gets in (or until 15 s are over)."""
    with tempfile.TemporaryDirectory(prefix="abuse-workers-") as folder:
        redis = RedisServer(Path(folder))
        redis.start()
        try:
            flags = ["--workers", "2", "--broker", redis.url]
            async with relays(inst, out, flags) as (relay,):
                await asyncio.sleep(1.0)
                workers = children(relay.pid)
                out["workers_before"] = len(workers)
                victim = workers[-1]
                os.kill(victim, signal.SIGKILL)
                killed = time.monotonic()
                back = None
                while time.monotonic() - killed < 15:
                    now = children(relay.pid)
                    if (
                        len(now) == 2
                        and victim not in now
                        and await try_subscribe(relay.url) == "ok"
                    ):
                        back = round(time.monotonic() - killed, 2)
                        break
                    await asyncio.sleep(0.05)
                out["restart_logged"] = "starting it again" in relay.log
                out["workers_after"] = len(children(relay.pid))
                out["time_to_two_workers_s"] = back if back is not None else "never (15 s)"
        finally:
            redis.kill()


def children(pid: int) -> list[int]:
    """The worker processes of a supervisor (its children running a relay)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in command:
            found.append(int(entry.name))
    return sorted(found)


# ------------------------------------------------------------------ 9. webhooks


def is_message(message_id: str) -> Callable[[dict[str, Any]], bool]:
    """Accepts the ``message`` frame of ``message_id``."""
    return lambda frame: frame.get("type") == "message" and frame.get("id") == message_id


class RoundTrips:
    """A canary: a producer sends a message every 0.1 s to a subscriber of its own channel,
    and each one's time from send to delivery is kept (``timeout`` when over 5 s)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.times: list[float] = []
        self.failures: collections.Counter[str] = collections.Counter()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        ws = await producer(self.url, "canary")
        reader, _ = await subscriber(self.url, "channel=canary")
        try:
            for n in itertools.count():
                sent = time.monotonic()
                await ws.send(json.dumps({"id": f"c{n}", "delta": "ping", "final": True}))
                if await frame_where(reader, is_message(f"c{n}"), 5) is None:
                    self.failures["timeout"] += 1
                else:
                    self.times.append(time.monotonic() - sent)
                await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - sent)))
        except Exception as exc:
            self.failures[type(exc).__name__] += 1
        finally:
            await ws.close()
            await reader.close()

    async def stop(self, out: Figures) -> None:
        """Stop sending; record the round trips' p50 and worst (ms) and any failures."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        times = sorted(self.times)
        out["canary_round_trips"] = len(times)
        if times:
            out["canary_p50_ms"] = round(1000 * times[len(times) // 2], 1)
            out["canary_worst_ms"] = round(1000 * times[-1], 1)
        out["canary_failures"] = dict(self.failures)


class EndlessAnswers:
    """A webhook receiver answering every POST with 200 and a 256 MiB body, written until
    the relay drops the connection or has read it all."""

    def __init__(self) -> None:
        self.written = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/hook"

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length:\s*(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 268435456\r\n\r\n")
                block = b"x" * (1024 * 1024)
                for _ in range(256):
                    writer.write(block)
                    await writer.drain()
                    self.written += len(block)
        writer.close()


async def webhook_answer(inst: Installation, out: Figures) -> None:
    """Answers of 256 MiB to three webhook POSTs, with a canary round trip meanwhile."""
    receiver = EndlessAnswers()
    url = await receiver.start()
    flags = ["--webhook", url, "--webhook-channel", "attack", "--webhook-timeout", "60"]
    try:
        async with relays(inst, out, flags) as (relay,):
            canary = RoundTrips(relay.url)
            watch = RssWatch([relay], out)
            cpu = cpu_seconds(relay.pid)
            ws = await producer(relay.url, "attack")
            delivered = 0.0
            deadline = time.monotonic() + 40
            for n in range(3):
                await ws.send(json.dumps({"id": f"m{n}", "delta": "x", "final": True}))
                while time.monotonic() < deadline and delivered < n + 1:
                    await asyncio.sleep(0.1)
                    delivered = await metric(relay.port, "relay_webhook_deliveries_total") or 0
            await ws.close()
            out["delivered"] = int(delivered)
            out["answer_mib_written"] = round(receiver.written / MIB, 1)
            out["relay_cpu_s"] = round(cpu_seconds(relay.pid) - cpu, 2)
            await canary.stop(out)
            await watch.settled()
    finally:
        assert receiver.server is not None
        receiver.server.close()


DEAD = 176
DEAD_CHARS = 500_000


async def dead_letters(inst: Installation, out: Figures) -> None:
    """176 dead letters of 500,000 characters, with a canary round trip meanwhile."""
    refused = socket.socket()
    refused.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    port = refused.getsockname()[1]
    flags = [
        *BIG_MESSAGES, "--webhook", f"http://127.0.0.1:{port}/hook",
        "--webhook-channel", "attack-*", "--webhook-max-age", "0.5", "--webhook-backoff", "0.05",
        "--webhook-max-pending-bytes", "8388608", "--max-memory-bytes", "67108864",
        "--history-size", "1",
    ]  # fmt: skip
    try:
        async with relays(inst, out, flags) as (relay,):
            canary = RoundTrips(relay.url)
            watch = RssWatch([relay], out)
            cpu = cpu_seconds(relay.pid)
            text = "y" * DEAD_CHARS
            deadline = time.monotonic() + 60
            codes: collections.Counter[str] = collections.Counter()
            for first in range(0, DEAD, 8):
                dead = await metric(relay.port, "relay_webhook_deliveries_total") or 0
                while first - dead >= 16 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                    dead = await metric(relay.port, "relay_webhook_deliveries_total") or 0
                # A producer per 8 messages: a session keeps its completed messages (for
                # idempotent finals), which would take the relay over its memory bound.
                ws = await producer(relay.url, "attack-0")
                for n in range(first, min(DEAD, first + 8)):
                    event = {"channel": f"attack-{n % 16}", "id": f"m{n}", "delta": text}
                    await ws.send(json.dumps({**event, "final": True}))
                    answer = json.loads(await asyncio.wait_for(ws.recv(), 10))
                    codes[str(answer.get("code") or answer.get("type"))] += 1
                await ws.close()
            not_queued = 0.0  # the outbox was full
            while time.monotonic() < deadline and dead + not_queued < DEAD:
                await asyncio.sleep(0.05)
                dead = await metric(relay.port, "relay_webhook_deliveries_total") or 0
                not_queued = await metric(relay.port, "relay_webhook_not_queued_total") or 0
            out["producer_answers"] = dict(codes.most_common())
            out["died"] = int(dead)
            out["dead_letters_kept"] = await metric(relay.port, "relay_webhook_dead_letters")
            out["dead_letters_dropped"] = await metric(
                relay.port, "relay_webhook_dead_letters_dropped_total"
            )
            out["not_queued"] = await metric(relay.port, "relay_webhook_not_queued_total")
            out["memory_bytes_metric"] = await metric(relay.port, "relay_memory_bytes")
            out["relay_cpu_s"] = round(cpu_seconds(relay.pid) - cpu, 2)
            await canary.stop(out)
            await watch.settled()
    finally:
        refused.close()


CASES: dict[str, tuple[Callable[[Installation, Figures], Awaitable[None]], float]] = {
    "slowloris": (slowloris, 75),
    "held_posts": (held_posts, 60),
    "bad_requests": (bad_requests, 90),
    "forged_resume": (forged_resume, 30),
    "junk_channel_keys": (junk_channel_keys, 45),
    "ping_flood": (ping_flood, 45),
    "junk_subscribes": (junk_subscribes, 45),
    "cancel_flood": (cancel_flood, 60),
    "parked_sessions": (parked_sessions, 90),
    "memory": (memory, 75),
    "nginx_600": (nginx_600, 75),
    "worker_kill": (worker_kill, 45),
    "webhook_answer": (webhook_answer, 60),
    "dead_letters": (dead_letters, 100),
    "chunked_json": (chunked_json, 60),
    "ndjson_trickle": (ndjson_trickle, 75),
    "body_resets": (body_resets, 60),
}
"""Each case and the seconds it may take at most, relay start and stop included."""


async def play(inst: Installation, names: Sequence[str]) -> dict[str, Figures]:
    """Every case named, one after another; its figures, or its error, by case."""
    results: dict[str, Figures] = {}
    for name in names:
        case, limit = CASES[name]
        out: Figures = {}
        started = time.monotonic()
        bound = asyncio.timeout(limit)
        try:
            async with bound:
                await case(inst, out)
        except TimeoutError:
            out["error"] = f"timed out after {limit:g} s" if bound.expired() else "TimeoutError"
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}".strip()[:300]
        out["case_seconds"] = round(time.monotonic() - started, 1)
        results[name] = out
        print(f"{name}: done in {out['case_seconds']:g} s", file=sys.stderr, flush=True)
    return results


def show(value: Any) -> str:
    """A figure as the table prints it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict) and set(value) == {"successes", "tries"}:
        successes, tries = value["successes"], value["tries"]
        return f"{successes}/{tries} ({100 * successes / tries:.0f}%)" if tries else "0/0"
    if isinstance(value, dict):
        return ", ".join(f"{key} {show(count)}" for key, count in value.items()) or "none"
    if isinstance(value, list):
        return "; ".join(show(item) for item in value)
    return str(value)


def format_table(results: dict[str, Figures]) -> str:
    """One row per figure: case, figure, value."""
    rows = [("case", "figure", "value")]
    for case, figures in results.items():
        rows += [(case, figure, show(value)) for figure, value in figures.items()]
    widths = [max(len(row[column]) for row in rows) for column in range(2)]
    lines = [f"{c:<{widths[0]}}  {f:<{widths[1]}}  {v}" for c, f, v in rows]
    lines.insert(1, f"{'-' * widths[0]}  {'-' * widths[1]}  {'-' * 5}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Play the cases and print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.abuse",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--relay-python", default=sys.executable, help="the relay's interpreter")
    parser.add_argument("--case", action="append", choices=list(CASES), help="only these cases")
    parser.add_argument("--json", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:  # thousands of sockets of our own
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    inst = installation(args.relay_python)
    print(f"relay: {inst.python} -m token_relay", file=sys.stderr, flush=True)
    results = asyncio.run(play(inst, args.case or list(CASES)))
    print(format_table(results))
    if args.json:
        document = {"relay_python": inst.python, "cases": results}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
