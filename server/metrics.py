"""Prometheus metrics of one relay process, served at ``GET /metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_GAP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """Every metric the relay exports, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.connections = Gauge(
            "relay_connections", "Open WebSocket connections.", ["role"], registry=registry
        )
        self.frames_in = Counter(
            "relay_frames_in_total", "Frames received.", ["role"], registry=registry
        )
        self.frames_out = Counter(
            "relay_frames_out_total", "Frames handed to sockets.", registry=registry
        )
        self.errors = Counter(
            "relay_errors_total", "Error frames sent, by code.", ["code"], registry=registry
        )
        self.messages = Counter(
            "relay_messages_total",
            "Messages ended here, by outcome (completed or the abort reason).",
            ["outcome"],
            registry=registry,
        )
        self.deltas_coalesced = Counter(
            "relay_deltas_coalesced_total",
            "Deltas merged into an earlier pending delta for a slow subscriber.",
            registry=registry,
        )
        self.slow_closes = Counter(
            "relay_slow_consumer_closes_total",
            "Subscribers closed with 1013 for reading too slowly.",
            registry=registry,
        )
        self.first_delta = Histogram(
            "relay_time_to_first_delta_seconds",
            "From a message's first event to its first non-empty delta.",
            buckets=_GAP_BUCKETS,
            registry=registry,
        )
        self.delta_gap = Histogram(
            "relay_delta_gap_seconds",
            "Between consecutive non-empty deltas of a message.",
            buckets=_GAP_BUCKETS,
            registry=registry,
        )
        self.final_to_delivery = Histogram(
            "relay_final_to_delivery_seconds",
            "From reading a final to its message being handed to the broker and local sockets.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.frames_in_producer = self.frames_in.labels("producer")
        self.frames_in_subscriber = self.frames_in.labels("subscriber")
        self.completed = self.messages.labels("completed")

    def render(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)
