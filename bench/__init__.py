"""Benchmark harness for token-relay: ``python -m bench`` (run from the repository root).

It starts a private ``redis-server`` and three relay processes (one on the memory broker,
two sharing Redis), then measures delivery throughput and final-to-message latency on three
paths: a single instance, one instance through Redis, and across two instances.
"""
