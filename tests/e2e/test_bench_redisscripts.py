"""``python -m bench.redisscripts`` runs a message's script as the broker sends it, reads
Redis's own figures for it, and takes another installation's script to compare."""

from __future__ import annotations

import asyncio
import sys

import pytest
from token_relay.brokers.redis.scripts import WHOLE

from bench import redisscripts


def test_another_installations_script_is_read_from_its_own_interpreter() -> None:
    assert redisscripts.script_of(sys.executable) == WHOLE


def test_each_script_is_measured_by_redis_and_must_publish_every_message() -> None:
    results = asyncio.run(redisscripts.measure({"this": WHOLE, "again": WHOLE + "\n"}, 2))
    for spent, commands in results.values():
        assert spent > 0
        assert 20 <= commands <= 60  # the open, text, frame, history, hold and session
    with pytest.raises(SystemExit, match="did not publish every message"):
        asyncio.run(redisscripts.measure({"nothing": "return 0"}, 1))
