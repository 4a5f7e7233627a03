"""Exactness where users deploy: joins and resumes on one process, on Redis, on two processes
and on ``--workers 2``, with real redis-server and relay processes (``bench.exactness`` runs
the same checks at full scale and counts)."""

from __future__ import annotations

import pytest

from bench.exactness import (
    TOPOLOGIES,
    check_joins,
    check_resume,
    check_session,
    check_truncation,
    cluster,
)


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_joins_and_resumes_are_exact(topology: str) -> None:
    async with cluster(topology, None, "token_relay") as relays:
        # Joiners with deltas at random moments: snapshot plus deltas equals every message,
        # and no message at or below the subscribed offset arrives live.
        assert await check_joins(relays, 40, seed=7) == 0
        # A subscriber cut (no close frame) every 50-200 ms, resuming with since on a
        # random process: no offset twice, none missing.
        assert await check_resume(relays, 150, seed=7) == (0, 0)
        # A gateway (RelayProducer) cut every 300 ms: every reply is acked and arrives whole.
        assert await check_truncation(relays, None, "token_relay", 15) == (0, 15)
        if topology != "memory":
            # A producer cut mid-message resumes on the other process (or worker), sends
            # again everything since its last ack, and the message is delivered once, whole.
            for n in range(5):
                assert await check_session(relays.urls[0], relays.urls[-1], n) == ""
