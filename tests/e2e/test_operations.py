"""What an operator sees of a relay process: its log on shutdown, ``--help``, a closed pipe
and the page's URL."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from token_relay.core.settings import GROUPS, Settings
from websockets.exceptions import ConnectionClosed

from ..conftest import recv_core, send_json, subscribed_pair
from ..harness import RedisServer, ServiceProcess, eventually, relay_process


@pytest.mark.parametrize(
    ("broker", "says", "code", "frames"),
    [
        (
            "memory",
            "stopping: aborting messages in progress (reason shutdown), closing connections "
            "with 1001",
            1001,
            [{"type": "aborted", "channel": "c", "id": "m", "text": "half", "reason": "shutdown"}],
        ),
        (
            "redis",
            "stopping: handing producers off (their sessions wait in the broker for "
            "--session-grace, to resume on another process), closing connections with 1012",
            1012,
            [],
        ),
    ],
)
async def test_sigterm_logs_what_the_relay_does_with_messages_in_progress(
    broker: str,
    says: str,
    code: int,
    frames: list[dict[str, object]],
    tmp_path: object,
    request: pytest.FixtureRequest,
) -> None:
    args: tuple[str, ...] = ()
    if broker == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        args = ("--broker", redis.url)
    relay = await relay_process(*args).start()
    try:
        async with subscribed_pair(relay, deltas=True) as (sub, producer):
            await send_json(producer, {"id": "m", "delta": "half"})
            assert (await recv_core(sub))["delta"] == "half"
            assert await relay.terminate() == 0
            seen = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    seen.append(await recv_core(sub))
            assert closed.value.rcvd is not None and closed.value.rcvd.code == code
            assert seen == frames
        stopping = [line for line in relay.log.splitlines() if "stopping" in line]
        assert len(stopping) == 1 and stopping[0].endswith(says), relay.log
        assert "Traceback" not in relay.log
    finally:
        await relay.stop()


async def test_sigterm_with_redis_unreachable_logs_that_nothing_is_handed_off(
    redis_server: RedisServer,
) -> None:
    relay = await relay_process("--broker", redis_server.url).start()
    try:
        redis_server.kill()
        await eventually(_readyz_is(relay, 503), timeout=30, what="the relay to see Redis gone")
        assert await relay.terminate() == 0
        stopping = [line for line in relay.log.splitlines() if "stopping" in line]
        assert len(stopping) == 1, relay.log
        assert stopping[0].endswith(
            "stopping: aborting messages in progress (reason shutdown; the broker is "
            "unreachable, so nothing can be handed off), closing connections with 1001"
        )
    finally:
        await relay.stop()


def _readyz_is(relay: ServiceProcess, status: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await relay.http_status("/readyz") == status

    return check


@pytest.mark.parametrize(
    ("argv", "exit_code"),
    [
        (["schema"], 1),
        (["--version"], 1),
        (["token", "--role", "admin", "--secret", "a-secret-of-32-bytes-or-more-...."], 1),
        (["token", "--role", "subscribe", "--channel", "chat-42", "--secret", "s" * 32], 1),
        # The docs promise an exit status for schema, token and --version only.
        (["--help"], None),
        (["token", "--help"], None),
    ],
)
def test_output_to_a_reader_that_went_away_is_no_traceback(
    argv: list[str], exit_code: int | None
) -> None:
    # As `token-relay schema | head` whose head exits before the relay writes.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "token_relay", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=30,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.stderr == b""
    if exit_code is None:
        assert result.returncode in (0, 1)
    else:
        assert result.returncode == exit_code


WEB_ROOT = Path(__file__).resolve().parents[2] / "client_demo" / "web"


async def test_serving_a_web_root_logs_the_page_url() -> None:
    relay = await relay_process("--web-root", str(WEB_ROOT)).start()
    try:
        url = f"http://127.0.0.1:{relay.port}/"
        line = f"token-relay serving the page in {WEB_ROOT}: open {url}\n"
        await eventually(lambda: line in relay.log, what="the page's URL logged")
        page = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        assert page == (WEB_ROOT / "index.html").read_bytes()
    finally:
        await relay.stop()


async def test_without_a_web_root_no_page_url_is_logged() -> None:
    relay = await relay_process().start()
    try:
        assert await relay.terminate() == 0
        assert "token-relay stopped" in relay.log
        assert "serving the page" not in relay.log
    finally:
        await relay.stop()


def test_help_lists_every_flag_once_in_its_section_with_no_empty_default() -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    result = subprocess.run(
        [sys.executable, "-m", "token_relay", "--help"],
        capture_output=True,
        env={**environment, "COLUMNS": "100"},
        timeout=30,
        check=True,
    )
    text = result.stdout.decode()
    sections: dict[str, list[str]] = {}
    section = ""
    options: dict[str, str] = {}  # each flag's help, joined
    flag = ""
    for line in text.splitlines():
        if re.fullmatch(r"[a-z][^:]*:", line):
            section = line[:-1]
            sections[section] = []
        elif match := re.match(r"  (?:-h, )?(--[a-z-]+)", line):
            flag = match.group(1)
            assert flag not in options, f"{flag} listed twice"
            sections[section].append(flag)
            options[flag] = line
        elif line.startswith("   ") and flag:
            options[flag] += " " + line.strip()
    expected = {title: [Settings.flag(name) for name in names] for title, names in GROUPS.items()}
    assert sections == {"options": ["--help"], **expected}
    every = {Settings.flag(item.name) for item in dataclasses.fields(Settings)}
    assert set(options) == every | {"--help"}
    assert "default )" not in " ".join(text.split())
    for flag, help_text in options.items():
        assert help_text.lower().count("repeatable") <= 1, help_text
        if flag != "--help":
            assert f"(env RELAY_{flag[2:].replace('-', '_').upper()}" in help_text, help_text
