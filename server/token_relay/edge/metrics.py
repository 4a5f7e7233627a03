"""Prometheus metrics of one relay process, served at ``GET /metrics``.

Metrics touched once per event or per frame (frames in and out, merged deltas,
the timing histograms) are plain Python numbers, exported by a custom collector
when ``/metrics`` is scraped: ``prometheus_client``'s own counters take a lock
on every increment, which cost about a sixth of the relay's time per event.
Rare events (connections, errors, message outcomes) use its ordinary metrics.

With ``--workers N`` a scrape reaches one worker, so every worker writes its metrics
to a folder the supervisor shares among them, once a second, and each scrape returns
every worker's, with a ``worker`` label: the answering worker's as of now, the others'
as of their last write (at most :data:`PUBLISH_SECONDS` old). A worker that died and
was restarted starts its counters again under the same label, which Prometheus reads
as a counter reset.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

__all__ = ["PUBLISH_SECONDS", "Metrics", "Tallies", "Tally", "Timings"]

PUBLISH_SECONDS = 1.0
"""How often a worker writes its metrics for the others to serve."""
STALE_SECONDS = 10.0
"""A worker's file older than this is not served (the worker is gone)."""
FOLD_AT = 256
"""Observations a histogram holds unsorted, at most, before it counts them in its buckets."""

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_GAP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Tally:
    """A counter without a lock: the relay's event loop is its only writer."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        """Add ``amount``."""
        self.value += amount


class Tallies:
    """:class:`Tally` counters by one label's value, as a labelled counter is used:
    ``labels(value).inc()``. The values are the caller's few fixed names."""

    __slots__ = ("_by_value",)

    def __init__(self) -> None:
        self._by_value: dict[str, Tally] = {}

    def labels(self, value: str) -> Tally:
        """The counter for ``value``, made at its first use."""
        tally = self._by_value.get(value)
        if tally is None:
            tally = self._by_value[value] = Tally()
        return tally

    def items(self) -> list[tuple[str, Tally]]:
        """Every value's counter, in the order first used."""
        return list(self._by_value.items())


class Timings:
    """A histogram without a lock, with fixed bucket bounds in seconds.

    One is observed per delta, so an observation only appends to a short list; the list
    is sorted into the buckets once it holds :data:`FOLD_AT` values, and whenever the
    histogram is read. The counts and the sum are the same as observing one by one.
    """

    __slots__ = ("_counts", "_pending", "_total", "bounds")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._total = 0.0
        self._pending: list[float] = []

    def observe(self, seconds: float) -> None:
        """Record one duration."""
        pending = self._pending
        pending.append(seconds)
        if len(pending) >= FOLD_AT:
            self._fold()

    def observe_zeros(self, times: int) -> None:
        """Record ``times`` durations of 0.0 (as many :meth:`observe` calls would)."""
        self._counts[bisect_left(self.bounds, 0.0)] += times

    @property
    def counts(self) -> list[int]:
        """Observations per bucket: at or below each bound and above the one before, then
        above the last bound."""
        self._fold()
        return list(self._counts)

    @property
    def total(self) -> float:
        """The sum of every observation."""
        self._fold()
        return self._total

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets: (upper bound, observations at or below it)."""
        running = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return buckets

    def _fold(self) -> None:
        pending = self._pending
        if not pending:
            return
        total = self._total
        for seconds in pending:  # in the order observed: the same sum, to the last bit
            total += seconds
        self._total = total
        pending.sort()
        counts, below = self._counts, 0
        for index, bound in enumerate(self.bounds):
            at = bisect_right(pending, bound, below)  # at or below the bound
            counts[index] += at - below
            below = at
        counts[-1] += len(pending) - below
        pending.clear()


class _HotCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        frames_in = CounterMetricFamily("relay_frames_in", "Frames received.", labels=["role"])
        frames_in.add_metric(["producer"], m.frames_in_producer.value)
        frames_in.add_metric(["subscriber"], m.frames_in_subscriber.value)
        yield frames_in
        yield CounterMetricFamily(
            "relay_frames_out", "Frames handed to sockets.", value=m.frames_out.value
        )
        messages = CounterMetricFamily(
            "relay_messages",
            "Messages ended here, by outcome (completed or the abort reason).",
            labels=["outcome"],
        )
        for outcome, tally in m.messages.items():
            messages.add_metric([outcome], tally.value)
        yield messages
        yield CounterMetricFamily(
            "relay_deltas_coalesced",
            "Deltas merged into an earlier pending delta for a slow subscriber.",
            value=m.deltas_coalesced.value,
        )
        yield CounterMetricFamily(
            "relay_slow_consumer_closes",
            "Subscribers closed with 1013 for reading too slowly.",
            value=m.slow_closes.value,
        )
        for name, text, timings in (
            (
                "relay_time_to_first_delta_seconds",
                "From a message's first event to its first non-empty delta.",
                m.first_delta,
            ),
            (
                "relay_delta_gap_seconds",
                "Between consecutive non-empty deltas of a message.",
                m.delta_gap,
            ),
            (
                "relay_final_to_delivery_seconds",
                "From reading a final to its message being handed to the broker and local sockets.",
                m.final_to_delivery,
            ),
        ):
            yield HistogramMetricFamily(
                name, text, buckets=timings.cumulative(), sum_value=timings.total
            )


class Metrics:
    """Every metric the relay exports, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.connections = Gauge(
            "relay_connections", "Open WebSocket connections.", ["role"], registry=registry
        )
        self.errors = Counter(
            "relay_errors_total", "Error frames sent, by code.", ["code"], registry=registry
        )
        # Counted once per message: lock-free, exported by the hot collector.
        self.messages = Tallies()
        self.completed = self.messages.labels("completed")
        self.refusals = Counter(
            "relay_http_refusals_total",
            "HTTP requests and handshakes refused, by status.",
            ["status"],
            registry=registry,
        )
        self.sockets_refused = Counter(
            "relay_sockets_refused_total",
            "Sockets cut or refused before their request was read, by reason.",
            ["reason"],
            registry=registry,
        )
        self.overloaded = Counter(
            "relay_overloaded_total",
            "New messages refused with 'overloaded' (over --max-memory-bytes).",
            registry=registry,
        )
        self.memory = Gauge(
            "relay_memory_bytes",
            "Bytes of text held: messages, parked sessions, history, the broker's outbox and "
            "writes waiting for Redis, durable stream data, and "
            "with the memory broker the webhook outbox and dead letters.",
            registry=registry,
        )
        self.memory_limit = Gauge(
            "relay_memory_limit_bytes", "--max-memory-bytes.", registry=registry
        )
        self.durable_streams = Gauge(
            "relay_durable_streams",
            "Durable streams held (deleted ones that forks still read included).",
            registry=registry,
        )
        self.durable_bytes = Gauge(
            "relay_durable_bytes", "Bytes of durable stream data held.", registry=registry
        )
        self.durable_live_reads = Gauge(
            "relay_durable_live_reads",
            "Durable Streams live reads in progress, by kind (long_poll, sse).",
            ["kind"],
            registry=registry,
        )
        self.parked = Gauge(
            "relay_parked_sessions",
            "Producer sessions waiting for their producer to reconnect.",
            registry=registry,
        )
        self.broker_healthy = Gauge(
            "relay_broker_healthy", "1 while the broker is reachable, else 0.", registry=registry
        )
        self.gc_frozen = Gauge(
            "relay_gc_frozen_objects",
            "Objects of the process's start, kept out of the garbage collector's scans.",
            registry=registry,
        )
        self.handshakes = Gauge(
            "relay_handshakes_in_flight",
            "Sockets whose request head is not complete yet.",
            registry=registry,
        )
        self.webhook_attempts = Counter(
            "relay_webhook_attempts_total",
            "Webhook POSTs, by outcome (success, http_error, timeout, network_error).",
            ["outcome"],
            registry=registry,
        )
        self.webhook_deliveries = Counter(
            "relay_webhook_deliveries_total",
            "Messages done with at one webhook URL, by outcome (delivered, dead).",
            ["outcome"],
            registry=registry,
        )
        self.webhook_lag = Histogram(
            "relay_webhook_lag_seconds",
            "From a message's completion to its first successful webhook POST.",
            buckets=_GAP_BUCKETS,
            registry=registry,
        )
        self.webhook_outbox = Gauge(
            "relay_webhook_outbox",
            "Messages waiting in the webhook outbox (in Redis with a Redis broker).",
            registry=registry,
        )
        self.webhook_dead = Gauge(
            "relay_webhook_dead_letters", "Dead letters kept.", registry=registry
        )
        self.webhook_dead_bytes = Gauge(
            "relay_webhook_dead_letter_bytes",
            "Bytes of dead letters kept (as JSON; in Redis with a Redis broker).",
            registry=registry,
        )
        self.webhook_dead_dropped = Counter(
            "relay_webhook_dead_letters_dropped_total",
            "Dead letters dropped, the oldest first, past --webhook-max-dead or "
            "--webhook-max-dead-bytes.",
            registry=registry,
        )
        self.webhook_not_queued = Counter(
            "relay_webhook_not_queued_total",
            "Messages the full webhook outbox did not take (their subscribers still got them).",
            registry=registry,
        )
        self.frames_in_producer = Tally()
        self.frames_in_subscriber = Tally()
        self.frames_out = Tally()
        self.deltas_coalesced = Tally()
        self.slow_closes = Tally()
        self.first_delta = Timings(_GAP_BUCKETS)
        self.delta_gap = Timings(_GAP_BUCKETS)
        self.final_to_delivery = Timings(_LATENCY_BUCKETS)
        registry.register(_HotCollector(self))

        self.shared: tuple[Path, int] | None = None
        """With ``--workers N``: the folder the workers share, and this worker's number."""

    def share(self, directory: Path, worker: int) -> None:
        """Serve every worker's metrics, through ``directory``."""
        self.shared = (directory, worker)

    def publish(self) -> None:
        """Write this worker's metrics for the others (atomically: write, then rename)."""
        if self.shared is None:
            return
        directory, worker = self.shared
        path = directory / f"worker-{worker}.prom"
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(generate_latest(self.registry))
        partial.replace(path)

    def render(self) -> bytes:
        """The metrics in Prometheus' text format: this process's, or every worker's."""
        own = generate_latest(self.registry)
        if self.shared is None:
            return own
        directory, worker = self.shared
        texts = {worker: own.decode()}
        now = time.time()
        for path in directory.glob("worker-*.prom"):
            number = int(path.stem.removeprefix("worker-"))
            if number == worker:
                continue
            try:
                if now - path.stat().st_mtime < STALE_SECONDS:
                    texts[number] = path.read_text()
            except OSError:
                continue  # it is being replaced, or its worker's folder is gone
        registry = CollectorRegistry()
        registry.register(_Merged(texts))
        return generate_latest(registry)


class _Merged(Collector):
    """Several workers' metrics as one family per name, each sample labelled by worker."""

    def __init__(self, texts: dict[int, str]) -> None:
        self.texts = texts

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for worker, text in sorted(self.texts.items()):
            for family in text_string_to_metric_families(text):
                into = merged.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                label = str(worker)
                into.samples.extend(
                    sample._replace(labels={**sample.labels, "worker": label})
                    for sample in family.samples
                )
        return merged.values()
