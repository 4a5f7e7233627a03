"""``python -m token_relay`` and ``python -m client_demo`` as real processes."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
from token_relay import ConfigError, Settings
from websockets.exceptions import ConnectionClosedOK

from ..conftest import recv_core, send_json, subscribed_pair

LISTENING = re.compile(rb"listening on port (\d+): producers (ws://\S+), subscribers (ws://\S+)")


async def _wait_for_port(process: asyncio.subprocess.Process) -> tuple[int, bytes]:
    assert process.stderr is not None
    seen = b""
    while True:
        line = await asyncio.wait_for(process.stderr.readline(), 10)
        assert line, f"relay exited before listening: {seen!r}"
        seen += line
        match = LISTENING.search(line)
        if match:
            return int(match.group(1)), seen


@pytest.fixture
async def relay_process() -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "token_relay",
        "--port",
        "0",
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        port, _ = await _wait_for_port(process)
        yield process, port
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_port_zero_prints_real_port_and_sigterm_closes_with_1001(
    relay_process: tuple[asyncio.subprocess.Process, int],
) -> None:
    process, port = relay_process
    assert port > 0
    async with subscribed_pair(f"ws://127.0.0.1:{port}") as (sub, producer):
        await send_json(producer, {"id": "m", "delta": "hi", "final": True})
        assert await recv_core(sub) == {"type": "message", "channel": "c", "id": "m", "text": "hi"}
        process.send_signal(signal.SIGTERM)
        with pytest.raises(ConnectionClosedOK) as closed:
            await recv_core(sub)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    assert await asyncio.wait_for(process.wait(), 10) == 0
    assert process.stderr is not None
    rest = await process.stderr.read()
    assert b"Traceback" not in rest
    assert b"stopped" in rest


async def test_ctrl_c_stops_cleanly(
    relay_process: tuple[asyncio.subprocess.Process, int],
) -> None:
    process, _ = relay_process
    process.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(process.wait(), 10) == 0
    assert process.stderr is not None
    assert b"Traceback" not in await process.stderr.read()


def test_schema_command_prints_generated_schema() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "token_relay", "schema"], capture_output=True, check=True, timeout=30
    )
    schema = json.loads(result.stdout)
    producer = schema["producer_to_relay"]
    event = producer["$defs"]["ProducerEvent"]
    assert event["required"] == ["id"]
    assert set(event["properties"]) == {
        "id",
        "delta",
        "chunk",
        "final",
        "channel",
        "seq",
        "meta",
        "abort",
    }
    assert event["additionalProperties"] is False
    batch = next(choice for choice in producer["anyOf"] if choice.get("type") == "array")
    assert (batch["minItems"], batch["maxItems"]) == (1, 10_000)
    server_types = {
        variant["properties"]["type"]["const"]
        for variant in schema["relay_to_client"]["$defs"].values()
        if "type" in variant.get("properties", {})
    }
    assert server_types == {
        "ack",
        "acks",
        "session",
        "error",
        "subscribed",
        "unsubscribed",
        "message",
        "delta",
        "chunks",
        "request",
        "snapshot",
        "aborted",
        "cancel",
    }
    subscriber_types = {
        variant["properties"]["type"]["const"]
        for variant in schema["subscriber_to_relay"]["$defs"].values()
        if "type" in variant.get("properties", {})
    }
    assert subscriber_types == {"subscribe", "unsubscribe", "cancel"}


def test_settings_come_from_flags_then_environment() -> None:
    env = {
        "RELAY_PORT": "9001",
        "RELAY_MAX_FRAME_BYTES": "2048",
        "RELAY_HOST": "0.0.0.0",
        "RELAY_SECRET": "s3cret",
        "RELAY_ALLOWED_ORIGIN": "https://a.example, https://b.example",
        "RELAY_IDLE_TIMEOUT": "2.5",
    }
    assert Settings.from_args([], env) == Settings(
        host="0.0.0.0",
        port=9001,
        max_frame_bytes=2048,
        secret="s3cret",
        allowed_origins=("https://a.example", "https://b.example"),
        idle_timeout=2.5,
    )
    flags = ["--allowed-origin", "https://c.example", "--insecure", "--host", "0.0.0.0"]
    from_flags = Settings.from_args(flags, {})
    assert from_flags.allowed_origins == ("https://c.example",)
    assert from_flags.insecure is True
    assert Settings.from_args(["--port", "9002"], env).port == 9002


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--port", "70000"], {}),
        (["--max-frame-bytes", "0"], {}),
        ([], {"RELAY_PORT": "x"}),
        (["--host", "0.0.0.0"], {}),
        (["--log-format", "xml"], {}),
        (["--id-hold", "-1"], {}),
    ],
)
def test_invalid_settings_are_refused(argv: list[str], env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        Settings.from_args(argv, env)


def test_invalid_setting_exits_with_a_clear_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "token_relay", "--port", "70000"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert b"port must be between 0 and 65535" in result.stderr
    assert b"Traceback" not in result.stderr


def test_client_demo_streams_four_exact_replies_one_structured() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "client_demo", "--serve", "--port", "0", "--once"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert "4 messages received, text exact: True" in out
    for reply_id in ("reply-1", "reply-2", "reply-3", "reply-4"):
        assert f"] {reply_id}:" in out
    # The structured reply: reasoning and a tool call before its text, which alone is its text.
    assert "] reply-4:\n  parts: step-start, reasoning, tool-weather, text\n  It is 21 °C" in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--workers", "2"], b"--workers 2 needs a shared broker"),
        (["--broker", "kafka://somewhere"], b"unknown broker 'kafka://somewhere'"),
    ],
)
def test_bad_broker_settings_are_refused_with_the_reason(argv: list[str], says: bytes) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "token_relay", *argv], capture_output=True, timeout=30, check=False
    )
    assert result.returncode == 2
    assert says in result.stderr
    assert b"Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--web-root", "no/such/folder"], b"--web-root 'no/such/folder' is not a folder"),
        (["--allowed-origin", "notaurl"], b"--allowed-origin 'notaurl' is not an origin"),
        (["--allowed-origin", "https://a.example/path"], b"is not an origin"),
    ],
)
def test_start_up_failures_are_one_line_naming_the_flag(argv: list[str], says: bytes) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "token_relay", "--port", "0", *argv],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr
    assert lines[0].startswith(b"error: ")


def test_a_port_in_use_is_one_line_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for extra in ([], ["--workers", "2", "--broker", "redis://127.0.0.1:1/0"]):
            result = subprocess.run(
                [sys.executable, "-m", "token_relay", "--port", str(port), *extra],
                capture_output=True,
                timeout=30,
                check=False,
            )
            assert result.returncode == 2, result.stderr
            errors = [line for line in result.stderr.splitlines() if b"error" in line]
            assert errors == [errors[-1]] and b"(--host, --port)" in errors[-1], result.stderr
            assert b"Traceback" not in result.stderr
