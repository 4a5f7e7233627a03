"""The pure core: the rules of assembly, sessions, channels and history.

Nothing here imports asyncio, websockets, redis or prometheus_client, or reads a
clock: every call that needs the time takes ``now``. The edge
(:mod:`token_relay.edge`) feeds it frames and writes what it returns.
"""
