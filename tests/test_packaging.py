"""The wheel as a user gets it: built from the sources, installed in a fresh virtual
environment, and used from outside the checkout."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WEB_ROOT = ROOT / "client_demo" / "web"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel`` of a copy of the sources (the build writes beside them), the test suite
    and its harness included, as they stand beside the package in a checkout."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("server/token_relay", "tests"):
        shutil.copytree(
            ROOT / folder,
            source / folder,
            ignore=shutil.ignore_patterns("__pycache__", "node_modules"),
        )
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)],
        check=True,
        timeout=300,
    )
    (built,) = dist.glob("token_relay-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtual environment with the wheel installed, and nothing of the checkout.

    Its dependencies are this environment's, named in a ``.pth`` file, so no index is
    needed: the package itself can only come from the wheel.
    """
    home = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home)], check=True)
    python = home / "bin" / "python"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(python)),
            *("install", "-q", "--no-deps", "--no-index", str(wheel)),
        ],
        check=True,
        timeout=120,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    yield home


def _run(venv: Path, code: str, cwd: Path) -> str:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
        timeout=60,
    ).stdout


def test_the_wheel_ships_the_type_marker_and_the_license(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert "token_relay/py.typed" in names
        licenses = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/licenses/LICENSE", n)]
        (license_file,) = licenses
        assert archive.read(license_file) == (ROOT / "LICENSE").read_bytes()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode().split("\n\n")[0].splitlines()
    assert "License-Expression: MIT" in headers
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")


def test_the_wheel_ships_no_test_harness(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        shipped = {archive.read(name) for name in names}
    version = wheel.name.split("-")[1]
    tops = {name.split("/")[0] for name in names}
    assert tops == {"token_relay", f"token_relay-{version}.dist-info"}
    assert not [name for name in names if name.startswith("token_relay/testing")]
    # Not one file of tests/ (the harness first of all) is in it, under any name.
    suite = [path for path in (ROOT / "tests").rglob("*.py") if path.stat().st_size > 0]
    assert ROOT / "tests" / "harness" / "processes.py" in suite
    assert [path for path in suite if path.read_bytes() in shipped] == []


def test_the_package_comes_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    where = _run(venv, "import token_relay; print(token_relay.__file__)", tmp_path)
    assert Path(where).is_relative_to(venv)


def test_mypy_checks_a_gateway_against_the_installed_package(venv: Path, tmp_path: Path) -> None:
    gateway = tmp_path / "gateway.py"
    gateway.write_text(
        "from token_relay.client import RelayProducer\n"
        "from token_relay.tokens import Role, mint\n\n\n"
        "async def main(relay: RelayProducer) -> None:\n"
        '    await relay.send("reply-1", 42)\n'
        '    token: str = mint("secret", Role.PRODUCE, ["chat-42"], ttl=60)\n'
    )
    result = subprocess.run(
        [
            *(sys.executable, "-m", "mypy", "--strict", "--no-incremental"),
            *("--python-executable", str(venv / "bin" / "python"), "--config-file", "/dev/null"),
            str(gateway),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    # mypy ran (it is a test dependency), and found exactly the one planted error.
    assert result.stdout.rstrip().endswith("Found 1 error in 1 file (checked 1 source file)"), (
        result.stdout + result.stderr
    )
    # Without py.typed, mypy says the package has no type marker and checks no call.
    assert "py.typed" not in result.stdout, result.stdout
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, result.stdout
    assert 'Argument 2 to "send" of "RelayProducer" has incompatible type "int"' in errors[0]


def test_tokens_are_minted_from_the_public_module_without_the_relay(
    venv: Path, tmp_path: Path
) -> None:
    code = (
        "import json, sys\n"
        "from token_relay.tokens import Role, mint, verify\n"
        "secret = 'a-secret-of-32-bytes-or-more-for-the-test'\n"
        "token = mint(secret, Role.SUBSCRIBE, ['chat-42'], ttl=60)\n"
        "grant = verify(token, secret)\n"
        "print(json.dumps([grant.role, list(grant.channels), sorted(sys.modules)]))\n"
    )
    role, channels, loaded = json.loads(_run(venv, code, tmp_path))
    assert (role, channels) == ("subscribe", ["chat-42"])
    assert not [m for m in loaded if m.startswith(("token_relay.edge", "token_relay.brokers"))]
    assert not {"asyncio", "websockets", "h11", "redis"} & {m.split(".")[0] for m in loaded}


async def test_the_installed_relay_serves_the_demo_page_of_a_checkout(
    venv: Path, tmp_path: Path
) -> None:
    # As docs/install.md says: the page is not in the wheel; a relay serves it from a checkout.
    process = await asyncio.create_subprocess_exec(
        str(venv / "bin" / "token-relay"),
        *("--port", "0", "--web-root", str(WEB_ROOT)),
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
    )
    assert process.stderr is not None
    try:
        url = ""
        while not url:
            line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
            assert line, "the relay exited"
            match = re.search(r"serving the page in (\S+): open (http://\S+)$", line.strip())
            if match:
                assert match.group(1) == str(WEB_ROOT)
                url = match.group(2)

        def get(path: str) -> bytes:
            with urllib.request.urlopen(url + path, timeout=10) as response:
                body: bytes = response.read()
                return body

        assert await asyncio.to_thread(get, "") == (WEB_ROOT / "index.html").read_bytes()
        client = WEB_ROOT / "token-relay-client" / "index.js"
        assert await asyncio.to_thread(get, "token-relay-client/index.js") == client.read_bytes()
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 30) == 0
