"""Benchmark harness for token-relay: ``python -m bench`` (run from the repository root).

Set up with ``pip install -e '.[bench]'`` and a ``redis-server`` on the PATH. It prints one
table, every row measured in the same run (medians over ``--repeat`` repetitions), and the
targets; ``--json PATH`` writes every raw measurement, ``--chart PATH`` a PNG, and
``--quick`` is a smoke run. The cases (:mod:`bench.cases`): the assembler, in this process;
ingest through a relay against a no-op websockets server and a python-socketio relay
(:mod:`bench.servers`), one event a frame and batched; fan-out to 1,000 and 10,000
subscribers held by a few client processes (:mod:`bench.subscribers`); latency; relay memory;
and the Redis paths. Producer frames are built before the clock starts (:mod:`bench.wire`),
every message is checked, and every process started is stopped however the run ends.
"""
