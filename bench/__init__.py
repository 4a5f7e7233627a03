"""Benchmark harness for token-relay: ``python -m bench`` (run from the repository root).

Set up with ``pip install -e '.[bench]'`` and a ``redis-server`` on the PATH. The run
prints one table, every row measured in the same run (medians over ``--repeat``
repetitions), then the targets, met or missed and by how much. ``--json PATH`` writes every
raw measurement, ``--chart PATH`` a PNG of bar charts, ``--quick`` is a smoke run of under
a minute; the full run takes a few minutes on two cores.

Cases, each server in its own process:

1. **assembler** (:mod:`bench.assembly`, in this process): ``TokenAssembler.apply()``
   events/s against a naive ``str +=`` assembler and a bare dict + list loop (the floor),
   on short and on 10,000-character messages.
2. **ingest** (:mod:`bench.ingest`): delta events/s from one producer through one relay
   until its subscriber holds every completed message. The producer's frames are built
   ahead as raw WebSocket frames (:mod:`bench.wire`) and written in big chunks
   (:mod:`bench.producer`). Side by side: a no-op websockets server that only reads
   (:mod:`bench.noop_server`, the ceiling) and a python-socketio relay doing the same job
   (:mod:`bench.sio_server`, the peer).
3. **batched ingest**: the same with 100 events per JSON array frame.
4. **fan-out** (:mod:`bench.fanout`): from a final until 1,000 and 10,000 subscribers all
   hold the message, with and without deltas; the subscribers are bare asyncio protocols
   in a few client processes (:mod:`bench.subscribers`).
5. **latency** (:mod:`bench.workload`): final to message at a fixed, moderate rate.
6. **memory** (:mod:`bench.memory`): relay RSS per idle subscriber and per in-flight
   10,000-character message, each on a fresh relay.
7. **Redis**: throughput and latency on a single instance, one instance through Redis,
   and across two instances through Redis.

Every message is checked: exact text, exactly once, in order. Every process the run starts
is stopped when it ends, fails or is interrupted (Ctrl-C, SIGTERM).
"""
