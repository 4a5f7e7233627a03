"""The Durable Streams conformance suite (``@durable-streams/server-conformance-tests``, pinned
in ``tests/durable``), run by Node and vitest against a real relay process at ``/v1/stream/``.

The relay runs with a short ``--long-poll-timeout``: the suite waits for a long-poll that
times out, within vitest's five seconds per test. Each of the suite's tests is one result in
vitest's JSON report; every test in :data:`PASSING` must pass. The subscription tests run
too (``subscriptions: true``): their webhook receivers listen on 127.0.0.1, which the relay
allows as a webhook URL for development.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from ..harness import Nginx, RedisServer, npm_installed, relay_process

pytestmark = pytest.mark.asyncio(loop_scope="module")

SUITE = Path(__file__).resolve().parents[1] / "durable"
LONG_POLL_SECONDS = 1.0
SUITE_TIMEOUT = 600.0
SUITE_TESTS = 338
"""Tests in the pinned suite."""
PASSING = SUITE / "passing.txt"
"""The suite's tests the relay passes, one full name a line: each must pass."""


@pytest.fixture(scope="module")
def conformance_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/durable with its pinned packages installed (npm reaches the registry)."""
    return npm_installed(SUITE, tmp_path_factory.mktemp("durable"))


def results_of(report: dict[str, object]) -> dict[str, str]:
    """Each test's full name (its describe blocks and title, joined by `` > ``) and status,
    from vitest's JSON report."""
    found: dict[str, str] = {}
    for file in report["testResults"]:  # type: ignore[attr-defined]
        for test in file["assertionResults"]:
            found[" > ".join([*test["ancestorTitles"], test["title"]])] = test["status"]
    return found


async def run_suite(folder: Path, base_url: str) -> dict[str, str]:
    """Run the suite against ``base_url``; every test's status by its full name."""
    report = folder / "report.json"
    report.unlink(missing_ok=True)
    environment = {
        **os.environ,
        "CONFORMANCE_TEST_URL": base_url,
        "CONFORMANCE_LONG_POLL_MS": str(int(LONG_POLL_SECONDS * 1000)),
        "CONFORMANCE_SUBSCRIPTIONS": "1",
        "NO_COLOR": "1",
    }
    process = await asyncio.create_subprocess_exec(
        str(folder / "node_modules" / ".bin" / "vitest"),
        "run",
        "conformance.test.mjs",
        "--reporter=json",
        f"--outputFile={report}",
        cwd=folder,
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), SUITE_TIMEOUT)
    assert report.exists(), f"vitest wrote no report:\n{output.decode(errors='replace')[-4000:]}"
    return results_of(json.loads(report.read_text()))


async def test_the_conformance_suite_passes(conformance_suite: Path) -> None:
    relay = relay_process("--long-poll-timeout", str(LONG_POLL_SECONDS))
    await relay.start()
    try:
        results = await run_suite(conformance_suite, f"http://127.0.0.1:{relay.port}")
    finally:
        await relay.stop()
    assert len(results) == SUITE_TESTS, len(results)
    passed = {name for name, status in results.items() if status == "passed"}
    expected = set(PASSING.read_text().splitlines())
    missing = sorted(expected - passed)
    assert not missing, f"{len(passed)} passed; these should pass and did not: {missing}"
    assert relay.tracebacks == 0, relay.log


DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nginx.conf"


async def test_the_conformance_suite_passes_on_two_relays_behind_nginx(
    conformance_suite: Path, tmp_path: Path
) -> None:
    redis = RedisServer(tmp_path)
    redis.start()
    args = ("--broker", redis.url, "--long-poll-timeout", str(LONG_POLL_SECONDS))
    relays = [relay_process(*args, name="relay-a"), relay_process(*args, name="relay-b")]
    nginx: Nginx | None = None
    try:
        await asyncio.gather(*(relay.start() for relay in relays))
        nginx = Nginx(DEPLOY, [relay.port for relay in relays], tmp_path)
        nginx.start()
        results = await run_suite(conformance_suite, nginx.url.replace("ws://", "http://"))
    finally:
        if nginx is not None:
            nginx.stop()
        await asyncio.gather(*(relay.stop() for relay in relays))
        redis.kill()
    assert len(results) == SUITE_TESTS, len(results)
    passed = {name for name, status in results.items() if status == "passed"}
    expected = set(PASSING.read_text().splitlines())
    missing = sorted(expected - passed)
    assert not missing, f"{len(passed)} passed; these should pass and did not: {missing}"
    assert all(relay.tracebacks == 0 for relay in relays), [relay.log for relay in relays]
