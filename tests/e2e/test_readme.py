"""The README's gateway example runs as printed, against a real relay."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from pathlib import Path

import pytest

from ..conftest import RunningRelay, connect, recv_core, recv_json, send_json, start_relay
from ..harness import eventually

README = Path(__file__).resolve().parents[2] / "README.md"


def gateway_example() -> str:
    text = README.read_text()
    section = text[text.index("## Python client library") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


async def test_readme_gateway_example_delivers_its_reply(
    relay: RunningRelay, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="token_relay")
    code = gateway_example()
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    async with relay.connect("/subscribe?channel=chat-42") as sub:
        await recv_json(sub)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code.replace("ws://127.0.0.1:8765", relay.url),
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 0
        assert out.decode().strip() == "delivered: reply-1"
        message = await recv_json(sub)
        assert (message["type"], message["text"]) == ("message", "Hello, world")

    # The gateway's clean exit is logged as the normal close it is, not as an error.
    def closes() -> list[object]:
        return [
            getattr(record, "code", None)
            for record in caplog.records
            if (getattr(record, "event", None), getattr(record, "role", None))
            == ("close", "producer")
        ]

    await eventually(lambda: bool(closes()), what="the producer's close logged")
    assert closes() == [1000]


def _table_names(heading: str) -> set[str]:
    """The back-quoted names in the first column of the table under ``heading``."""
    text = README.read_text()
    section = text[text.index(heading) :]
    rows = re.findall(r"^\| (`[^|]+`(?:, `[^|]+`)*) \|", section.split("\n## ")[0], re.M)
    return {name for row in rows for name in re.findall(r"`([^`{]+)", row)}


def test_every_flag_error_code_and_metric_is_in_the_readme() -> None:
    import dataclasses

    from token_relay.core.errors import ErrorCode
    from token_relay.core.settings import Settings
    from token_relay.edge.metrics import Metrics

    flags = {
        f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        for f in dataclasses.fields(Settings)
    }
    assert flags - _table_names("| flag | default |") == set()
    assert {code.value for code in ErrorCode} - _table_names("| code | sent to | when |") == set()
    exported = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in Metrics().registry.collect()
    }
    assert exported - _table_names("| metric | what |") == set()


def security_example() -> str:
    text = README.read_text()
    section = text[text.index("## Security") :].split("\n## ")[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


async def test_readme_token_recipe_mints_a_token_the_relay_takes() -> None:
    secret = "a-secret-of-32-bytes-or-more-for-the-readme-recipe"
    running, server = await start_relay(secret=secret)
    async with server:
        # The recipe as printed, then a look at what it loaded.
        code = security_example().replace("ws://127.0.0.1:8765", running.url) + (
            "import sys\n"
            "print(sorted(m for m in sys.modules if m.startswith('token_relay.edge')"
            " or m in ('asyncio', 'websockets')))\n"
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "RELAY_SECRET": secret},
        )
        out, _ = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 0
        url, loaded = out.decode().splitlines()
        assert loaded == "[]"
        assert url.startswith(f"{running.url}/subscribe?channel=chat-42&token=")
        async with connect(url) as sub:
            assert await recv_core(sub) == {"type": "subscribed", "channel": "chat-42"}
            await send_json(sub, {"type": "subscribe", "channel": "chat-43"})
            refused = await recv_json(sub)
            assert (refused["type"], refused["code"]) == ("error", "forbidden")
