"""Benchmark harness for token-relay: ``python -m bench`` (run from the repository root).

Set up with ``pip install -e '.[bench]'`` and a ``redis-server`` on the PATH. The run prints
one table, every row measured in the same run (medians over ``--repeat`` repetitions), then
the targets, met or missed and by how much; ``--json PATH`` writes every raw measurement,
``--chart PATH`` a PNG, ``--quick`` is a smoke run of under a minute.

The cases (:mod:`bench.cases`), each server in its own process: the assembler against a
naive ``str +=`` one and a dict + list floor, in this process (:mod:`bench.assembly`); ingest
through one relay against a no-op websockets server and a python-socketio relay
(:mod:`bench.servers`), one event per frame and batched; fan-out to 1,000 and 10,000
subscribers, with and without deltas, held by a few client processes
(:mod:`bench.subscribers`); latency at a moderate rate; relay RSS per idle subscriber and per
in-flight message; and the Redis paths. Producer frames are pre-built raw WebSocket frames
written in big chunks (:mod:`bench.wire`), so the client is never the bottleneck. Every
message is checked (exact text, once, in order), and every process the run starts is
stopped when it ends, fails or is interrupted.
"""
