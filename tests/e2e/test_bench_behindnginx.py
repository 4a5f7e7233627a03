"""``python -m bench.behindnginx`` runs where users run the relay: through nginx with the
shipped ``deploy/nginx.conf``, to two relay processes on one real ``redis-server``, every
request of every load answered as it should be (the bench refuses a run with any other)."""

from __future__ import annotations

import asyncio
import re
import sys

from bench.behindnginx import LOADS


async def test_the_bench_behind_nginx_runs_every_load_through_the_shipped_config() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.behindnginx",
        "--quick",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    text = out.decode()
    assert "nginx.conf" in text.splitlines()[0]
    for load in LOADS:
        row = re.search(rf"^{re.escape(load)} +([\d,]+)$", text, re.M)
        assert row is not None, text
        assert int(row.group(1).replace(",", "")) > 0
