"""The README's gateway example runs as printed, against a real relay."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from ..conftest import RunningRelay, recv_json

README = Path(__file__).resolve().parents[2] / "README.md"


def gateway_example() -> str:
    text = README.read_text()
    section = text[text.index("## Python client library") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


async def test_readme_gateway_example_delivers_its_reply(relay: RunningRelay) -> None:
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
