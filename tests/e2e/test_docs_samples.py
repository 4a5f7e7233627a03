"""The documentation's samples run as printed, against real relays (the port substituted)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import sys
import sysconfig
import tempfile
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ..conftest import (
    NO_SWEEPS,
    RunningRelay,
    connect,
    recv_core,
    recv_json,
    send_json,
    start_relay,
)
from ..docs.blocks import ROOT, docs_block
from ..harness import Nginx, RedisServer, WebhookReceiver, eventually, free_port


async def test_the_gateway_example_delivers_its_reply(
    relay: RunningRelay, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="token_relay")
    code = docs_block("gateway-example")
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


async def test_the_token_recipe_mints_a_token_the_relay_takes() -> None:
    secret = "a-secret-of-32-bytes-or-more-for-the-docs-recipe"
    running, server = await start_relay(secret=secret)
    async with server:
        # The recipe as printed, then a look at what it loaded.
        code = docs_block("security-mint").replace("ws://127.0.0.1:8765", running.url) + (
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


# Shell samples. Each runs in bash as printed, with the ports it names substituted by free
# ones (and a private redis-server's for Redis's), from the repository's folder.


def _substitute(text: str, ports: dict[int, int]) -> str:
    for printed, real in ports.items():
        text = re.sub(rf"\b{printed}\b", str(real), text)
    return text


def _commands(block: str) -> list[str]:
    """The block's commands: one a line, continuations joined, comments left out."""
    joined = block.replace("\\\n", " ")
    lines = [re.sub(r"\s+# .*$", "", line) for line in joined.splitlines()]
    return [line for line in lines if line.strip() and not line.startswith("#")]


class _Started:
    """A long-running command of a sample, started in bash, with its stderr so far."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.log: list[str] = []

    async def until(self, pattern: str, wait: float = 30) -> re.Match[str]:
        assert self.process.stderr is not None
        while True:
            for line in self.log:
                if match := re.search(pattern, line):
                    return match
            raw = await asyncio.wait_for(self.process.stderr.readline(), wait)
            assert raw, f"exited before {pattern!r}: {self.log}"
            self.log.append(raw.decode().rstrip("\n"))

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            await asyncio.wait_for(self.process.wait(), 30)


async def _start(command: str, env: dict[str, str] | None = None) -> _Started:
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        f"exec {command}",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_environment(**(env or {})),
    )
    return _Started(process)


async def _run(command: str, wait: float = 120, **kwargs: Any) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        command,
        cwd=kwargs.pop("cwd", ROOT),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=kwargs.pop("env", None) or _environment(),
        **kwargs,
    )
    out, err = await asyncio.wait_for(process.communicate(), wait)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _environment(**extra: str) -> dict[str, str]:
    """The environment of a shell sample: this virtual environment's commands on the PATH, as
    once it is activated, so ``token-relay`` is the relay installed here."""
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return {**os.environ, "PATH": path, **extra}


async def test_the_first_relay_runs_as_the_tutorial_prints_it() -> None:
    port = free_port()
    relay_line, demo_line = _commands(docs_block("first-relay-two-terminals"))
    relay = await _start(_substitute(relay_line, {8765: port}) + f" --port {port}")
    try:
        await relay.until("serving the page")
        # The log lines as printed, but for their time stamp and the port.
        stamp = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
        printed = _substitute(docs_block("first-relay-relay-log"), {8765: port}).splitlines()
        got = [re.sub(stamp, "", line) for line in relay.log]
        assert [re.sub(stamp, "", line) for line in printed] == got[: len(printed)]
        code, out, _ = await _run(demo_line + f" --url ws://127.0.0.1:{port}", 60)
        assert code == 0
    finally:
        await relay.stop()
    # Every line printed appears, in order; the replies complete in a varying order, so
    # their numbers on the channel are not compared.
    lines = [re.sub(r"#\d+", "#N", line) for line in out.splitlines()]
    at = 0
    for line in docs_block("first-relay-subscriber-output").splitlines():
        if line == "...":
            continue
        at = lines.index(re.sub(r"#\d+", "#N", line), at) + 1


async def test_the_flag_commands_run_as_printed(tmp_path: Path) -> None:
    from token_relay import __version__
    from token_relay.tokens import verify

    secret = "a-secret-of-32-bytes-or-more-for-the-flags-page"
    serve, schema, token, version = _commands(docs_block("flags-commands"))
    port = free_port()
    relay = await _start(_substitute(serve, {8765: port}))
    try:
        await relay.until(rf"listening on port {port}:")
    finally:
        await relay.stop()
    code, out, _ = await _run(schema)
    assert code == 0 and set(json.loads(out)) >= {"producer_to_relay", "relay_to_client"}
    code, out, _ = await _run(token.replace("…", secret))
    assert code == 0
    assert list(verify(out.strip(), secret).channels) == ["chat-42"]
    code, out, _ = await _run(version)
    assert code == 0 and __version__ in out


async def test_the_token_command_mints_what_security_prints() -> None:
    from token_relay.tokens import Role, verify

    secret = "a-secret-of-32-bytes-or-more-for-the-security-page"
    (command,) = _commands(docs_block("security-token-cli"))
    code, out, err = await _run(command.replace("…", secret))
    assert code == 0, err
    grant = verify(out.strip(), secret)
    assert (grant.role, list(grant.channels)) == (Role.SUBSCRIBE, ["chat-*"])


def test_the_assembler_example_holds() -> None:
    code = docs_block("library-assembler")
    assert "assert" in code
    exec(compile(code, "library-assembler", "exec"), {})


async def test_the_http_producer_curls_answer_as_printed(relay: RunningRelay) -> None:
    port = int(relay.url.rsplit(":", 1)[1])
    # The model: a stand-in printing one reply as NDJSON.
    reply = ['{"id": "r2", "delta": "Hi"}', '{"id": "r2", "final": true}']
    model = "model() { printf '%s\\n' " + " ".join(f"'{line}'" for line in reply) + "; }\n"
    async with relay.connect("/subscribe?channel=chat-42") as sub:
        await recv_json(sub)
        code, out, err = await _run(
            model + _substitute(docs_block("http-producer-curl"), {8765: port})
        )
        assert code == 0, err
        first, second = _json_values(out)
        assert first == json.loads(docs_block("http-producer-answer"))
        assert second == {
            "acks": [{"type": "ack", "id": "r2", "channel": "chat-42"}],
            "errors": [],
            "cancels": [],
        }
        texts = [(await recv_core(sub))["text"], (await recv_core(sub))["text"]]
        assert texts == ["Hello", "Hi"]


def _json_values(text: str) -> list[Any]:
    decoder = json.JSONDecoder()
    values, index = [], 0
    while index < len(text):
        if text[index].isspace():
            index += 1
            continue
        value, index = decoder.raw_decode(text, index)
        values.append(value)
    return values


@pytest.fixture
async def relay() -> AsyncIterator[RunningRelay]:
    """A relay with default settings but no SSE heartbeats nor keepalive pings: what curl
    prints of a stream is compared with the printed sample, which shows none."""
    running, server = await start_relay(**NO_SWEEPS)
    async with server:
        yield running


def _events(text: str) -> list[dict[str, Any]]:
    """A text/event-stream's events, their ``data`` decoded, an epoch named ``EPOCH``."""
    events = []
    for chunk in text.strip().split("\n\n"):
        fields: dict[str, Any] = {}
        for line in chunk.splitlines():
            name, _, value = line.partition(": ")
            fields[name] = value
        if "data" in fields and fields["data"] != "[DONE]":
            data = json.loads(fields["data"])
            if "epoch" in data:
                data["epoch"] = "EPOCH"
            fields["data"] = data
        if "id" in fields:
            fields["id"] = "ID"
        events.append(fields)
    return events


async def test_the_sse_curl_streams_what_is_printed(relay: RunningRelay) -> None:
    port = int(relay.url.rsplit(":", 1)[1])
    (command,) = _commands(docs_block("sse-curl"))
    curl = await asyncio.create_subprocess_exec(
        "bash", "-c", "exec " + _substitute(command, {8765: port}), stdout=asyncio.subprocess.PIPE
    )
    assert curl.stdout is not None
    printed_so_far = b""
    try:
        await asyncio.wait_for(curl.stdout.readuntil(b"event: subscribed"), 10)
        async with relay.connect("/produce?channel=chat-42") as producer:
            await send_json(producer, {"id": "m", "delta": "Hel"})
            await send_json(producer, {"id": "m", "delta": "lo", "final": True})
            await recv_json(producer)
        # curl has printed the stream up to the end of its last event, the message.
        printed_so_far = await asyncio.wait_for(curl.stdout.readuntil(b"event: message\n"), 10)
        printed_so_far += await asyncio.wait_for(curl.stdout.readuntil(b"\n\n"), 10)
    finally:
        curl.terminate()
        out, _ = await curl.communicate()
    got = _events("event: subscribed" + (printed_so_far + out).decode())
    printed = _events(docs_block("sse-output"))
    assert printed[0] == {"retry": "1000"}
    assert got == printed[1:]


async def test_the_cancel_curl_reaches_the_producer(relay: RunningRelay) -> None:
    port = int(relay.url.rsplit(":", 1)[1])
    async with relay.connect("/produce?channel=chat-42") as producer:
        await send_json(producer, {"id": "m", "delta": "so far"})
        await asyncio.sleep(0.1)
        code, out, err = await _run(_substitute(docs_block("cancel-curl"), {8765: port}))
        assert (code, out) == (0, ""), err
        assert await recv_json(producer) == {"type": "cancel", "channel": "chat-42", "id": "m"}


async def test_the_ai_sdk_curl_streams_what_is_printed(relay: RunningRelay) -> None:
    port = int(relay.url.rsplit(":", 1)[1])
    async with relay.connect("/produce?channel=chat-42") as producer:
        await send_json(producer, {"id": "reply-1", "delta": "Hello, wo"})
        await asyncio.sleep(0.1)
        (command,) = _commands(docs_block("ai-sdk-curl"))
        curl = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            "exec " + _substitute(command, {8765: port}),
            stdout=asyncio.subprocess.PIPE,
        )
        assert curl.stdout is not None
        await asyncio.wait_for(curl.stdout.readuntil(b'"delta":"Hello, wo"}\n\n'), 10)
        await send_json(producer, {"id": "reply-1", "delta": "rld", "final": True})
        rest, _ = await asyncio.wait_for(curl.communicate(), 10)
    printed = docs_block("ai-sdk-output")
    assert printed.endswith(rest.decode().rstrip("\n") + "\n")
    assert printed.startswith('data: {"type":"start","messageId":"reply-1"}')


async def test_the_quick_start_and_the_test_command_run_as_printed() -> None:
    # As on a fresh machine (no virtual environment active), in the checkout: the quick
    # start's last command with a free port and --once, so that it ends after its replies.
    (quick_start,) = _commands(docs_block("readme-quick-start"))
    assert docs_block("first-relay-quick-start") == docs_block("readme-quick-start")
    code, out, err = await _run(quick_start + " --port 0 --once", 300, env=dict(os.environ))
    assert code == 0, err
    assert re.search(r"open the chat demo: http://127\.0\.0\.1:\d+/\?channel=demo", out + err)
    assert "4 messages received, text exact: True" in out
    # The checkout's install, as the install page prints it.
    code, out, err = await _run(
        " && ".join(_commands(docs_block("install-checkout"))), 300, env=dict(os.environ)
    )
    assert code == 0, err
    assert out.strip().endswith(__import__("token_relay").__version__)
    # The test command, given one test file (extra arguments go to pytest).
    (tests,) = _commands(docs_block("readme-tests"))
    assert docs_block("dev-scripts-test") == docs_block("readme-tests")
    code, out, err = await _run(
        tests + " tests/core/test_assembler.py -q -p no:cacheprovider", 600, env=dict(os.environ)
    )
    assert code == 0, out + err
    assert re.search(r"\d+ passed", out)


async def test_the_wheel_installs_as_the_install_page_prints(tmp_path: Path) -> None:
    from token_relay import __version__

    source = tmp_path / "token-relay"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((ROOT / name).read_bytes())
    shutil.copytree(
        ROOT / "server" / "token_relay",
        source / "server" / "token_relay",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    build, make_venv, install, version = _commands(docs_block("install-wheel"))
    # `python3` is this interpreter; the new environment finds the relay's dependencies
    # through a .pth file naming this one's, so the install needs no package index.
    python = sys.executable
    for command in (build, make_venv):
        code, _, err = await _run(command.replace("python3 ", f"{python} ", 1), 300, cwd=source)
        assert code == 0, err
    site = next((source / "relay-env" / "lib").glob("python3*/site-packages"))
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    code, _, err = await _run(install, 300, cwd=source)
    assert code == 0, err
    code, out, err = await _run(version, 60, cwd=source)
    assert (code, out.strip()) == (0, f"token-relay {__version__}"), err
    where = "relay-env/bin/python -c 'import token_relay; print(token_relay.__file__)'"
    code, out, err = await _run(where, 60, cwd=source)
    assert code == 0 and str(source / "relay-env") in out, err  # the wheel's, not the checkout's


async def test_the_npm_tarball_installs_as_the_install_page_prints(tmp_path: Path) -> None:
    checkout = tmp_path / "token-relay"
    shutil.copytree(
        ROOT / "clients" / "js",
        checkout / "clients" / "js",
        ignore=shutil.ignore_patterns("node_modules"),
    )
    app = tmp_path / "your-app"
    app.mkdir()
    (app / "package.json").write_text('{"name": "your-app", "private": true}\n')
    environment = {"npm_config_audit": "false", "npm_config_fund": "false"}
    # The package's own README prints the same two commands.
    assert docs_block("install-npm") in (ROOT / "clients" / "js" / "README.md").read_text()
    pack, install = _commands(docs_block("install-npm"))
    code, _, err = await _run(pack, 120, cwd=checkout, env=_environment(**environment))
    assert code == 0, err
    install = install.replace("/path/to/token-relay", str(checkout))
    code, _, err = await _run(install, 120, cwd=tmp_path, env=_environment(**environment))
    assert code == 0, err
    manifest = json.loads(
        (app / "node_modules" / "token-relay-client" / "package.json").read_text()
    )
    version = json.loads((ROOT / "clients" / "js" / "package.json").read_text())["version"]
    assert manifest["version"] == version
    assert not (app / "node_modules" / "react").exists()  # an optional peer: not installed
    # The browser client's page installs the folder itself, the same way.
    (folder_install,) = _commands(docs_block("browser-client-install"))
    folder_install = folder_install.replace("/path/to/token-relay", str(checkout))
    code, _, err = await _run(folder_install, 120, cwd=tmp_path, env=_environment(**environment))
    assert code == 0, err
    assert (app / "node_modules" / "token-relay-client" / "src" / "index.js").exists()


def _request(sample: str) -> tuple[str, dict[str, str], Any]:
    head, _, body = sample.partition("\n\n")
    request_line, *header_lines = head.splitlines()
    headers = dict(line.split(": ", 1) for line in header_lines)
    return request_line, headers, json.loads(body)


async def test_the_webhook_posts_what_the_page_prints() -> None:
    from standardwebhooks import Webhook
    from token_relay.tokens import Role, mint

    from ..conftest import open_producer

    (command,) = _commands(docs_block("webhooks-flags"))
    secret = "a-secret-of-32-bytes-or-more-for-the-webhooks-page"
    webhook_secret = re.search(r"--webhook-secret (\S+)", command)
    assert webhook_secret is not None
    port = free_port()
    with WebhookReceiver() as receiver:
        relay = await _start(
            command.replace("https://app.example/hooks/relay", receiver.url) + f" --port {port}",
            env={"RELAY_SECRET": secret},
        )
        try:
            await relay.until(rf"listening on port {port}:")
            token = mint(secret, Role.PRODUCE, ["chat-*"], ttl=60)
            url = f"ws://127.0.0.1:{port}/produce?channel=chat-42&token={token}"
            async with open_producer(url) as producer:
                await send_json(
                    producer,
                    {
                        "id": "reply-9",
                        "delta": "Hello, world",
                        "final": True,
                        "meta": {"model": "m1"},
                    },
                )
                await recv_json(producer)
                await send_json(producer, {"id": "other", "final": True, "channel": "other-1"})
                await eventually(lambda: len(receiver.received) == 1, what="the webhook POST")
        finally:
            await relay.stop()
    (got,) = receiver.received
    request_line, headers, body = _request(docs_block("webhooks-request"))
    assert request_line == "POST /hooks/relay"
    assert {name: got.headers[name] for name in headers} != {}
    assert got.headers["content-type"] == headers["content-type"]
    assert got.headers["webhook-id"].startswith("msg_")
    assert got.headers["webhook-signature"].startswith("v1,")
    Webhook(webhook_secret.group(1)).verify(got.body, got.headers)
    received = got.json()
    for key in ("offset", "epoch"):
        assert type(received.pop(key)) is type(body.pop(key))
    assert received == body  # the other channel's message was not sent (--webhook-channel)


async def test_the_redis_commands_run_as_printed(redis_server: RedisServer) -> None:
    install, one, four = _commands(docs_block("redis-commands"))
    code, _, err = await _run(install, 300)
    assert code == 0, err
    redis_port = int(redis_server.url.rsplit(":", 1)[1].split("/")[0])
    ports = [free_port(), free_port()]
    relays = [
        await _start(_substitute(line, {6379: redis_port, 8765: port}))
        for line, port in zip((one, four), ports, strict=True)
    ]
    try:
        for relay, port in zip(relays, ports, strict=True):
            await relay.until(rf"listening on port {port}")
        # A message from the single process reaches a subscriber of the four workers.
        async with (
            connect(f"ws://127.0.0.1:{ports[1]}/subscribe?channel=chat-42") as sub,
            connect(f"ws://127.0.0.1:{ports[0]}/produce?channel=chat-42") as producer,
        ):
            await recv_json(sub)
            await recv_json(producer)
            await send_json(producer, {"id": "r", "delta": "across", "final": True})
            assert (await recv_core(sub))["text"] == "across"
    finally:
        for relay in relays:
            await relay.stop()


async def test_the_proxy_commands_run_as_printed(redis_server: RedisServer) -> None:
    redis_port = int(redis_server.url.rsplit(":", 1)[1].split("/")[0])
    first, second, folder_line, nginx_line = _commands(docs_block("proxy-commands"))
    # nginx's folder: a fresh one where the page names /var/tmp/token-relay-nginx, readable by
    # nginx's workers; the configuration as shipped, its ports made free ones.
    folder = Path(tempfile.mkdtemp(prefix="token-relay-nginx-", dir="/var/tmp"))
    os.chmod(folder, 0o755)
    backends = [free_port(), free_port()]
    nginx = Nginx(ROOT / "deploy" / "nginx.conf", backends, folder)
    (folder / "rendered.conf").write_text(nginx.render())
    ports = {6379: redis_port, 8765: backends[0], 8766: backends[1]}
    relays = [await _start(_substitute(line, ports)) for line in (first, second)]
    try:
        for relay, port in zip(relays, backends, strict=True):
            await relay.until(rf"listening on port {port}")
        for line in (folder_line, nginx_line):
            line = line.replace("/var/tmp/token-relay-nginx", str(folder))
            line = line.replace('"$PWD/deploy/nginx.conf"', str(folder / "rendered.conf"))
            code, _, err = await _run(line, 60)
            assert code == 0, err
        # nginx runs as a daemon, as the file says; clients use its port.
        await eventually(lambda: (folder / "nginx.pid").exists(), what="nginx's pid file")
        front = f"ws://127.0.0.1:{nginx.port}"

        async def through_nginx() -> bool:
            try:
                async with connect(f"{front}/subscribe?channel=chat-42") as sub:
                    frame = await recv_json(sub)
                    return bool(frame["type"] == "subscribed")
            except OSError:
                return False

        await eventually(through_nginx, what="nginx in front")
        async with (
            connect(f"{front}/subscribe?channel=chat-42") as sub,
            connect(f"{front}/produce?channel=chat-42") as producer,
        ):
            await recv_json(sub)
            await recv_json(producer)
            await send_json(producer, {"id": "r", "delta": "through nginx", "final": True})
            assert (await recv_core(sub))["text"] == "through nginx"
    finally:
        pid_file = folder / "nginx.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGQUIT)
            await eventually(lambda: not pid_file.exists(), what="nginx stopped")
        for relay in relays:
            await relay.stop()
        shutil.rmtree(folder, ignore_errors=True)


async def test_the_benchmark_commands_name_real_modules_and_flags() -> None:
    # The benchmarks take minutes and the bench extra: the suite checks each printed
    # command against its module's own command line, and runs none of them.
    commands = _commands(docs_block("bench-commands")) + _commands(docs_block("bench-exactness"))
    assert commands[0] == "pip install -e '.[bench]'"
    assert (
        "bench"
        in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    for command in commands[1:]:
        module, *arguments = command.removeprefix("python -m ").split()
        source = ROOT / (module.replace(".", "/") + ".py")
        if not source.exists():
            source = ROOT / module.replace(".", "/") / "cli.py"
        text = source.read_text()
        for flag in (argument for argument in arguments if argument.startswith("--")):
            assert f'"{flag}"' in text, f"{module} has no {flag}"


async def _follow(command: str, until: bytes) -> tuple[asyncio.subprocess.Process, bytes]:
    """Start a ``curl -N`` sample and read its output up to ``until``."""
    curl = await asyncio.create_subprocess_exec(
        "bash", "-c", "exec " + command, stdout=asyncio.subprocess.PIPE
    )
    assert curl.stdout is not None
    return curl, await asyncio.wait_for(curl.stdout.readuntil(until), 10)


async def test_a_reply_of_your_own_arrives_as_the_tutorial_says(relay: RunningRelay) -> None:
    port = int(relay.url.rsplit(":", 1)[1])
    (follow,) = _commands(_substitute(docs_block("first-relay-follow"), {8765: port}))
    curl, seen = await _follow(follow, b"event: subscribed")
    try:
        code, out, err = await _run(_substitute(docs_block("first-relay-post"), {8765: port}))
        assert code == 0, err
        answer = (
            '{"acks":[{"type":"ack","id":"hello","channel":"chat-1"}],"errors":[],"cancels":[]}'
        )
        assert json.loads(out) == json.loads(answer)
        assert f"`{answer}`" in (ROOT / "docs" / "tutorials" / "first-relay.md").read_text()
        assert curl.stdout is not None
        seen += await asyncio.wait_for(curl.stdout.readuntil(b"event: message\n"), 10)
        seen += await asyncio.wait_for(curl.stdout.readuntil(b"\n\n"), 10)
    finally:
        curl.terminate()
        await curl.wait()
    events = _events(seen.decode().split("\n\n", 1)[1])
    assert [(event["event"], event["data"].get("delta")) for event in events] == [
        ("subscribed", None),
        ("delta", "Hello, "),
        ("delta", "world"),
        ("message", None),
    ]
    assert events[-1]["data"]["text"] == "Hello, world"
    # Again with &rewind=1: the completed message comes back from history.
    curl, seen = await _follow(follow.replace("deltas=1", "deltas=1&rewind=1"), b"event: message\n")
    try:
        assert curl.stdout is not None
        seen += await asyncio.wait_for(curl.stdout.readuntil(b"\n\n"), 10)
    finally:
        curl.terminate()
        await curl.wait()
    assert _events(seen.decode())[-1]["data"]["text"] == "Hello, world"
