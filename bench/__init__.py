"""Benchmark harness for token-relay: ``python -m bench`` (run from the repository root).

Set up with ``pip install -e '.[bench]'`` and a ``redis-server`` on the PATH. It prints one
table, every row measured in the same run (medians over ``--repeat`` repetitions), and the
targets; ``--json PATH`` writes every raw measurement, ``--chart PATH`` a PNG, and
``--quick`` is a smoke run. The cases (:mod:`bench.cases`): the assembler, in this process;
ingest through a relay against a no-op websockets server and a python-socketio relay
(:mod:`bench.servers`), one event a frame, batched, and as NDJSON over HTTP; fan-out to 1,000
and 10,000 subscribers held by a few client processes (:mod:`bench.subscribers`), over
WebSockets and SSE, beside a bare ``os.write`` per socket (:mod:`bench.floor`) and with
``--workers 2`` on Redis; latency beside the floor; relay memory per idle WebSocket, SSE
stream and message in flight; the Redis paths; and HTTP publishing and SSE delivery beside the
``@durable-streams/server`` reference server (:mod:`bench.durable`, Node), with the Durable
Streams protocol's own figures (:mod:`bench.durableprotocol`: appends over 16 connections
with ``wrk``, append -> SSE p99, a 10 MB catch-up). Producer frames
are built before the clock starts (:mod:`bench.wire`), every message is checked, and every
process started is stopped however the run ends. ``--markdown PATH`` writes the table and the
targets as the docs' performance page shows them.
"""
