"""The deploy kit as shipped: nginx.conf run by an unprivileged user, nginx-tls.conf serving
WSS and HTTPS with a certificate made here, and the systemd unit checked by systemd."""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from token_relay.core.settings import Settings
from websockets.asyncio.client import connect

from ..conftest import recv_core, send_json, subscribed_pair
from ..harness import Nginx, ServiceProcess, free_port, relay_process

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NOBODY = 65534


@pytest.fixture
async def relay() -> AsyncIterator[ServiceProcess]:
    process = await relay_process("--trusted-proxy", "127.0.0.1").start()
    try:
        yield process
    finally:
        await process.stop()


def _config_lines(path: Path) -> list[str]:
    """The directives of an nginx configuration, without comments and blank lines."""
    lines = (line.split("#", 1)[0].rstrip() for line in path.read_text().splitlines())
    return [line for line in lines if line.strip()]


REDIRECT = [
    "    server {",
    "        listen 8080;",
    "        return 308 https://$host:8443$request_uri;",
    "    }",
]
"""The TLS file's plain-HTTP server: a redirect to the same URL on HTTPS."""


def test_the_tls_config_is_nginx_conf_on_https_with_a_redirect() -> None:
    plain = _config_lines(DEPLOY / "nginx.conf")
    tls = _config_lines(DEPLOY / "nginx-tls.conf")
    start = tls.index(REDIRECT[0])
    assert tls[start : start + len(REDIRECT)] == REDIRECT
    del tls[start : start + len(REDIRECT)]
    assert [line for line in tls if not line.strip().startswith("ssl_")] == [
        line.replace("listen 8080;", "listen 8443 ssl;") for line in plain
    ]


async def test_nginx_conf_runs_as_shipped_by_an_unprivileged_user(
    relay: ServiceProcess,
) -> None:
    # Only the ports change (as in every nginx test); the pid, the logs and the temporary
    # files are the file's own, under the prefix folder, which the user owns.
    prefix = Path(tempfile.mkdtemp(prefix="token-relay-nginx-"))
    try:
        nginx = Nginx(DEPLOY / "nginx.conf", [relay.port], prefix)
        errors = await asyncio.to_thread(_serve_unprivileged, nginx)
        assert errors == b""
        assert not re.search(r"\[(emerg|alert|crit|error)\]", (prefix / "error.log").read_text())
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def _serve_unprivileged(nginx: Nginx) -> bytes:
    """Run ``nginx`` (as nobody, when the tests run as root), check one request through it
    and the files it wrote, stop it; return what it wrote on stderr."""
    prefix = nginx.directory
    config = prefix / "nginx.conf"
    config.write_text(nginx.render())
    as_root = os.geteuid() == 0
    if as_root:
        os.chmod(prefix, 0o755)
        os.chown(prefix, NOBODY, NOBODY)
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    process = subprocess.Popen(
        [binary, "-p", f"{prefix}/", "-e", "stderr", "-c", str(config), "-g", "daemon off;"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        user=NOBODY if as_root else None,
        group=NOBODY if as_root else None,
        extra_groups=[] if as_root else None,
    )
    try:
        _wait_for_port(nginx.port, process)
        url = f"http://127.0.0.1:{nginx.port}/healthz"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
        assert (prefix / "nginx.pid").read_text().strip() == str(process.pid)
        assert (prefix / "error.log").exists()
        for temp in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            assert (prefix / f"{temp}_temp").is_dir()
    finally:
        process.terminate()
        _, errors = process.communicate(timeout=10)
    # (A request is logged once it has ended, on nginx's side: read the log once it exited.)
    assert 'GET /healthz HTTP/1.1" 200' in (prefix / "access.log").read_text()
    return errors


def _wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"nginx exited: {process.stderr.read() if process.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.02)
    raise AssertionError("nginx did not listen")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
async def test_nginx_tls_conf_serves_wss_and_https(relay: ServiceProcess, tmp_path: Path) -> None:
    certificate, key = tmp_path / "fullchain.pem", tmp_path / "privkey.pem"
    await asyncio.to_thread(
        subprocess.run,
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(certificate)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    # The shipped file, with the certificate made here in place of the operator's.
    text = (DEPLOY / "nginx-tls.conf").read_text()
    text = text.replace("/etc/ssl/token-relay/fullchain.pem", str(certificate))
    text = text.replace("/etc/ssl/token-relay/privkey.pem", str(key))
    # The redirect's port, here a free one; the harness gives the TLS server its own.
    plain_port = free_port()
    text = text.replace("listen 8080;", f"listen 127.0.0.1:{plain_port};")
    config = tmp_path / "nginx-tls.conf"
    config.write_text(text)
    nginx = Nginx(config, [relay.port], tmp_path / "prefix")
    config.write_text(text.replace(":8443$request_uri", f":{nginx.port}$request_uri"))
    nginx.directory.mkdir()
    await asyncio.to_thread(nginx.start)
    try:
        trust = ssl.create_default_context(cafile=str(certificate))
        base = f"wss://127.0.0.1:{nginx.port}"
        async with subscribed_pair(base, ssl=trust) as (sub, producer):
            await send_json(producer, {"id": "m", "delta": "over TLS", "final": True})
            message = await recv_core(sub)
            assert (message["type"], message["text"]) == ("message", "over TLS")

        def get(path: str) -> tuple[int, bytes]:
            url = f"https://127.0.0.1:{nginx.port}{path}"
            with urllib.request.urlopen(url, timeout=10, context=trust) as response:
                return response.status, response.read()

        assert await asyncio.to_thread(get, "/healthz") == (200, b"ok\n")

        # Plain HTTP is redirected, path and query kept, and the redirect leads to the relay.
        def plain(path: str) -> tuple[int, str]:
            connection = http.client.HTTPConnection("127.0.0.1", plain_port, timeout=10)
            try:
                connection.request("POST", path, body=b"{}")
                response = connection.getresponse()
                return response.status, response.getheader("Location") or ""
            finally:
                connection.close()

        status, location = await asyncio.to_thread(plain, "/healthz?a=1&b=%20")
        assert (status, location) == (308, f"https://127.0.0.1:{nginx.port}/healthz?a=1&b=%20")

        def follow(url: str) -> tuple[int, str, bytes]:
            with urllib.request.urlopen(url, timeout=10, context=trust) as response:
                return response.status, response.url, response.read()

        assert await asyncio.to_thread(follow, f"http://127.0.0.1:{plain_port}/healthz") == (
            200,
            f"https://127.0.0.1:{nginx.port}/healthz",
            b"ok\n",
        )
        # A client that does not trust the certificate is refused by TLS itself.
        with pytest.raises(ssl.SSLCertVerificationError):
            async with connect(f"{base}/subscribe?channel=c", ssl=ssl.create_default_context()):
                pass
    finally:
        nginx.stop()
    assert not re.search(r"\[(emerg|alert|crit)\]", nginx.errors), nginx.errors


def test_the_systemd_units_variables_are_settings_the_relay_takes() -> None:
    shipped = (DEPLOY / "token-relay.service").read_text()
    (line,) = re.findall(r"(?m)^Environment=(.*)$", shipped)
    environment = dict(pair.split("=", 1) for pair in line.split())
    # The relay.env its comments show.
    environment.update(re.findall(r"(?m)^#   (RELAY_[A-Z_]+)=(\S+)$", shipped))
    assert set(environment) >= {"RELAY_HOST", "RELAY_PORT", "RELAY_SECRET", "RELAY_BROKER"}
    settings = Settings.from_args([], environment)
    assert (settings.host, settings.port, settings.log_format) == ("127.0.0.1", 8765, "json")
    assert settings.broker.startswith("redis://") and settings.trusted_proxies == ("127.0.0.1",)


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")
def test_the_systemd_unit_verifies_and_is_sandboxed(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    shipped = (DEPLOY / "token-relay.service").read_text()
    # systemd checks that ExecStart's program exists: point it at this installation's
    # token-relay, and change nothing else.
    program = Path(sys.executable).parent / "token-relay"
    assert program.exists()
    exec_start = re.search(r"(?m)^ExecStart=(\S+)", shipped)
    assert exec_start is not None and exec_start.group(1) == "/opt/token-relay/bin/token-relay"
    unit = tmp_path / "token-relay.service"
    unit.write_text(shipped.replace(exec_start.group(1), str(program), 1))
    verify = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Any unknown key, bad value or unknown system call group is a line on stderr.
    assert (verify.returncode, verify.stderr) == (0, "")
    security = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    level = re.search(r"Overall exposure level for token-relay\.service: ([\d.]+)", security.stdout)
    assert level is not None, security.stdout + security.stderr
    assert float(level.group(1)) <= 2.0, security.stdout
    settings: dict[str, list[str]] = {}
    for line in shipped.splitlines():
        if re.match(r"[A-Z]\w+=", line):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    for key, value in {
        "DynamicUser": "yes",
        "ProtectSystem": "strict",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "SystemCallFilter": "@system-service",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    }.items():
        assert value in settings.get(key, []), key
