"""Delivering webhooks: POST each entry of the broker's outbox to every ``--webhook`` URL.

The rules of who goes when are :class:`~token_relay.core.webhooks.Outbox`'s; this module
does the I/O: it takes entries from the broker's :class:`~token_relay.brokers.WebhookStore`
(while this process is the one delivering), POSTs them with aiohttp, signs them per Standard
Webhooks (with the ``standardwebhooks`` library), settles what every URL is done with,
keeps dead letters, and counts it all. It never blocks the relay: the outbox is filled by
the broker and drained here, in tasks of their own.

A POST succeeds on any 2xx answer. Anything else, a network error, or no whole answer within
``--webhook-timeout`` is a failure, retried per the outbox's backoff. The status is the
answer: its body is read up to :data:`ANSWER_BYTES` (so the connection can serve the next
POST) and never kept; past that the connection is dropped, and a body that stalls is a
timeout like any other. URLs are logged as :func:`~token_relay.core.webhooks.loggable_url`
gives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from datetime import UTC, datetime

import aiohttp
from standardwebhooks import Webhook

from ..brokers import WebhookStore
from ..core.errors import BrokerUnavailable
from ..core.settings import Settings
from ..core.webhooks import (
    DeadLetter,
    Delivery,
    Outbox,
    WebhookEntry,
    loggable_url,
    scrubbed,
)
from .metrics import Metrics

__all__ = ["ANSWER_BYTES", "BUFFER", "WebhookDispatcher"]

log = logging.getLogger("token_relay.webhooks")

BUFFER = 10_000
"""Entries held here at once (taken from the outbox, not yet settled)."""

USER_AGENT = "token-relay-webhooks"

ANSWER_BYTES = 64 * 1024
"""Bytes of a receiver's answer body read at most; past them the connection is dropped."""


class WebhookDispatcher:
    """Takes the outbox's entries and POSTs them, in order per channel and URL."""

    def __init__(self, settings: Settings, store: WebhookStore, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.outbox = Outbox(
            settings.webhooks,
            concurrency=settings.webhook_concurrency,
            backoff=settings.webhook_backoff,
            max_age=settings.webhook_max_age,
        )
        self._signer = Webhook(settings.webhook_secret) if settings.webhook_secret else None
        self._client: aiohttp.ClientSession | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._flying: set[asyncio.Task[None]] = set()
        self._unsettled: list[WebhookEntry] = []
        self._stopping = False
        self._not_queued = 0
        self._dead_dropped = 0
        """Dead letters dropped so far: logged for the first ten, then once in a thousand."""
        self._wait = max(0.05, min(0.5, settings.lease_seconds / 4))
        metrics.webhook_outbox.set_function(lambda: float(self.store.depth))
        metrics.webhook_dead.set_function(lambda: float(self.store.dead_count))
        metrics.webhook_dead_bytes.set_function(lambda: float(self.store.dead_bytes))

    async def start(self) -> None:
        """Start taking and sending."""
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.settings.webhook_concurrency),
            timeout=aiohttp.ClientTimeout(total=self.settings.webhook_timeout),
            headers={"User-Agent": USER_AGENT},
            auto_decompress=False,
        )
        self._tasks = [
            asyncio.create_task(self._take_forever()),
            asyncio.create_task(self._send_forever()),
        ]

    async def stop(self, deadline: float) -> None:
        """Deliver what is queued until ``deadline`` (monotonic), then stop; with Redis the
        rest waits in Redis for the next process to deliver it."""
        while time.monotonic() < deadline and (len(self.outbox) or self._holds_more()):  # noqa: ASYNC110 - the outbox and the store are polled
            await asyncio.sleep(0.02)
        left = len(self.outbox)
        self._stopping = True
        for task in [*self._tasks, *self._flying]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._flying, return_exceptions=True)
        self._tasks = []
        if left:
            log.warning("stopping with %d webhook messages not delivered", left)
        await self.store.release()
        if self._client is not None:
            await self._client.close()

    def _holds_more(self) -> bool:
        return bool(self.store.active and self.store.depth)

    # ------------------------------------------------------------------ taking

    async def _take_forever(self) -> None:
        while not self._stopping:
            room = BUFFER - len(self.outbox)
            try:
                entries = await self.store.take(room, self._wait)
            except BrokerUnavailable as exc:
                log.info("webhook outbox unreachable (%s)", exc)
                self.outbox.clear()  # what was taken stays in the outbox, for later
                await asyncio.sleep(self._wait)
                continue
            self._count_not_queued()
            if not self.store.active:
                if len(self.outbox):
                    self.outbox.clear()  # another process delivers them now
                await asyncio.sleep(self._wait)
                continue
            now = time.monotonic()
            for entry in entries:
                self.outbox.add(entry, now)
            if entries:
                self._wake.set()
            if room <= 0 or not entries:
                await self._retry_settles()
            if room <= 0:
                await asyncio.sleep(self._wait)

    def _count_not_queued(self) -> None:
        refused = self.store.not_queued
        if refused > self._not_queued:
            self.metrics.webhook_not_queued.inc(refused - self._not_queued)
            self._not_queued = refused

    # ------------------------------------------------------------------ sending

    async def _send_forever(self) -> None:
        while not self._stopping:
            now = time.monotonic()
            for delivery in self.outbox.due(now):
                task = asyncio.create_task(self._deliver(delivery))
                self._flying.add(task)
                task.add_done_callback(self._flying.discard)
            upcoming = self.outbox.next_due()
            timeout = 1.0 if upcoming is None else max(0.0, min(1.0, upcoming - now))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _deliver(self, delivery: Delivery) -> None:
        entry = delivery.entry
        error = await self._post(delivery.url, entry)
        now, wall = time.monotonic(), time.time()
        if error is None:
            self.metrics.webhook_attempts.labels("success").inc()
            self.metrics.webhook_deliveries.labels("delivered").inc()
            self.metrics.webhook_lag.observe(max(0.0, wall - entry.completed))
            done = self.outbox.succeeded(delivery)
        else:
            kind, _, _ = error.partition(" ")
            self.metrics.webhook_attempts.labels(kind).inc()
            outcome, done = self.outbox.failed(delivery, error, now, wall, random.random())
            if outcome == "dead":
                await self._bury(delivery, wall)
            else:
                log.info(
                    "webhook %s to %s failed (%s); attempt %d, retrying",
                    entry.id,
                    loggable_url(delivery.url),
                    error,
                    delivery.attempts,
                )
        if done is not None:
            await self._settle(done)
        self._wake.set()

    async def _post(self, url: str, entry: WebhookEntry) -> str | None:
        """POST once; None on a 2xx, else what went wrong (its kind first)."""
        assert self._client is not None
        headers = {
            "Content-Type": "application/json",
            "webhook-id": entry.id,
            "webhook-timestamp": str(int(time.time())),
        }
        if self._signer is not None:
            stamp = datetime.fromtimestamp(int(headers["webhook-timestamp"]), UTC)
            headers["webhook-signature"] = self._signer.sign(entry.id, stamp, entry.body.decode())
        try:
            async with self._client.post(
                url, data=entry.body, headers=headers, allow_redirects=False
            ) as response:
                status = response.status
                if not await _read_answer(response):
                    response.close()  # past ANSWER_BYTES: the rest is never read
        except TimeoutError:
            return f"timeout after {self.settings.webhook_timeout:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            return f"network_error {type(exc).__name__}: {scrubbed(str(exc))}"
        if 200 <= status < 300:
            return None
        return f"http_error {status}"

    async def _bury(self, delivery: Delivery, wall: float) -> None:
        entry = delivery.entry
        self.metrics.webhook_deliveries.labels("dead").inc()
        log.error(
            "webhook %s to %s is a dead letter after %d attempts (%s): %r on %r",
            entry.id,
            loggable_url(delivery.url),
            delivery.attempts,
            delivery.error,
            entry.payload.id,
            entry.channel,
            extra={"event": "webhook_dead", "channel": entry.channel, "id": entry.payload.id},
        )
        letter = DeadLetter(
            webhook_id=entry.id,
            url=delivery.url,
            attempts=delivery.attempts,
            error=delivery.error,
            completed_at=entry.completed,
            died_at=wall,
            payload=entry.payload,
        )
        try:
            dropped = await self.store.bury(letter)
        except BrokerUnavailable:
            log.error("could not keep the dead letter %s: the broker is unreachable", entry.id)
            return
        if not dropped:
            return
        self.metrics.webhook_dead_dropped.inc(dropped)
        before, self._dead_dropped = self._dead_dropped, self._dead_dropped + dropped
        if before < 10 or before // 1000 != self._dead_dropped // 1000:
            log.error(
                "dead letters full (--webhook-max-dead %d, --webhook-max-dead-bytes %d): "
                "dropped the %d oldest (%d so far)",
                self.settings.webhook_max_dead,
                self.settings.webhook_max_dead_bytes,
                dropped,
                self._dead_dropped,
                extra={"event": "webhook_dead_dropped"},
            )

    async def _settle(self, entry: WebhookEntry) -> None:
        try:
            await self.store.settle(entry)
        except BrokerUnavailable:
            if len(self._unsettled) < BUFFER:
                self._unsettled.append(entry)  # delivered; remove it from Redis later

    async def _retry_settles(self) -> None:
        pending, self._unsettled = self._unsettled, []
        for entry in pending:
            await self._settle(entry)


async def _read_answer(response: aiohttp.ClientResponse) -> bool:
    """Read and forget a receiver's answer body; False if it has more than
    :data:`ANSWER_BYTES` (the caller drops the connection)."""
    declared = response.content_length
    if declared is not None and declared > ANSWER_BYTES:
        return False
    left = ANSWER_BYTES
    while left >= 0:
        chunk = await response.content.read(left + 1)
        if not chunk:
            return True
        left -= len(chunk)
    return False
