"""The asyncio and websockets edge: sockets, timers, HTTP, metrics, logs and the CLI.

It reads frames, calls the core (:mod:`token_relay.core`) and the broker
(:mod:`token_relay.brokers`), and writes what they return.
"""
