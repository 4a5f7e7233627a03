"""Tests for token_relay.edge.metrics: the counters kept without locks, as exported."""

from __future__ import annotations

from prometheus_client import generate_latest
from token_relay.edge.metrics import Metrics


def _exported(metrics: Metrics) -> list[str]:
    return generate_latest(metrics.registry).decode().splitlines()


def test_messages_are_exported_by_outcome_as_counted() -> None:
    metrics = Metrics()
    exported = [line for line in _exported(metrics) if line.startswith("relay_messages_total")]
    assert exported == ['relay_messages_total{outcome="completed"} 0.0']  # from the start
    for _ in range(3):
        metrics.completed.inc()
    metrics.messages.labels("producer_disconnected").inc()
    metrics.messages.labels("producer_disconnected").inc(2)
    lines = _exported(metrics)
    assert 'relay_messages_total{outcome="completed"} 3.0' in lines
    assert 'relay_messages_total{outcome="producer_disconnected"} 3.0' in lines
    assert "# TYPE relay_messages_total counter" in lines
    assert metrics.messages.labels("completed") is metrics.completed
