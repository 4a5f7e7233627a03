"""The documentation site: it builds strictly, every code sample is run by a named test or
included from a file a test runs, and its reference pages hold what the code holds."""

from __future__ import annotations

import ast
import dataclasses
import html
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from .docs.blocks import DOCS, README, ROOT, Block, all_blocks, docs_block, pages

# The files the pages include (`--8<-- "path"`), each with the test that runs it as it is.
INCLUDED = {
    "tests/dsbridge/aisdk_chat.mjs": (
        "tests/e2e/test_durable_channels.py::"
        "test_an_ai_sdk_chat_carried_by_the_durable_streams_transport"
    ),
    "client_demo/integrations/nextjs_route.ts": (
        "tests/e2e/test_ai_sdk.py::test_the_documented_nextjs_route_answers_use_chat"
    ),
    "client_demo/integrations/nextjs_chat_page.tsx": (
        "tests/e2e/test_ai_sdk_chat_page.py::"
        "test_the_recipe_sends_resumes_stops_and_restores_a_chat"
    ),
    "client_demo/integrations/nextjs_produce_route.ts": (
        "tests/e2e/test_ai_sdk_produce.py::"
        "test_the_documented_producer_route_aborts_its_model_on_stop"
    ),
    "client_demo/integrations/fastapi_app.py": (
        "tests/e2e/test_ai_sdk.py::"
        "test_the_documented_fastapi_app_answers_use_chat_and_stops_its_model"
    ),
    "client_demo/integrations/ws_gateway.py": (
        "tests/e2e/test_ai_sdk_ws.py::test_the_gateway_recipe_answers_and_stops"
    ),
    "client_demo/integrations/openai_gateway.py": (
        "tests/e2e/test_openai_gateway.py::"
        "test_the_openai_gateway_recipe_sends_resumes_stops_and_restores_a_chat"
    ),
    "deploy/nginx.conf": "tests/e2e/test_nginx.py",
    "deploy/token-relay.service": "tests/e2e/test_deploy.py",
    "docs/reference/schema.json": (
        "tests/test_docs.py::test_the_schema_page_is_what_the_relay_prints"
    ),
}


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    # --strict turns every warning into a failure: a broken link or anchor, a page missing
    # from the navigation, an included file that does not exist.
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "index.html").exists()
    # The included samples are in the built page, whole (highlighting splits them in spans).
    built = (tmp_path / "tutorials" / "chat-app" / "index.html").read_text()
    text = html.unescape(re.sub(r"<[^>]+>", "", built))
    for path in (
        "client_demo/integrations/nextjs_chat_page.tsx",
        "client_demo/integrations/nextjs_produce_route.ts",
        "client_demo/integrations/nextjs_route.ts",
        "client_demo/integrations/fastapi_app.py",
        "client_demo/integrations/ws_gateway.py",
        "client_demo/integrations/openai_gateway.py",
    ):
        assert (ROOT / path).read_text().strip() in text, path


def test_the_readme_is_a_front_page() -> None:
    assert len(README.read_text().splitlines()) <= 250


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        assert (page.parent / target).exists(), f"{page.name}: {target}"


def _named_in_tests() -> dict[str, list[str]]:
    """Each block name that a test reads with ``docs_block("NAME")``, and which tests do."""
    found: dict[str, list[str]] = {}
    for source in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(source.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "docs_block"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    where = f"{source.relative_to(ROOT)}::{function.name}"
                    found.setdefault(str(node.args[0].value), []).append(where)
    return found


def _where(block: Block) -> str:
    return f"{block.page.relative_to(ROOT)}:{block.line}"


def test_every_code_block_is_run_by_a_test_or_included_from_a_tested_file() -> None:
    tested = _named_in_tests()
    names = [block.name for block in all_blocks() if block.name]
    assert len(names) == len(set(names)), "a block name is used twice"
    untested = []
    for block in all_blocks():
        if block.includes:
            for path in block.includes:
                assert path in INCLUDED, f"{_where(block)} includes {path}, which no test runs"
            continue
        if block.name is None:
            untested.append(f"{_where(block)}: no <!-- block: NAME --> comment")
        elif block.name not in tested:
            untested.append(f"{_where(block)}: no test reads docs_block({block.name!r})")
    assert untested == []


def test_every_included_file_exists_and_its_test_does() -> None:
    for path, test in INCLUDED.items():
        assert (ROOT / path).is_file(), path
        module, _, name = test.partition("::")
        source = (ROOT / module).read_text()
        assert not name or re.search(rf"def {name}\(", source), test


def test_the_supported_versions_page_names_the_pinned_clients() -> None:
    page = (DOCS / "supported-versions.md").read_text()
    pins = json.loads((ROOT / "tests" / "js" / "package.json").read_text())["dependencies"]
    ai, ai_v6 = pins["ai"], pins["ai-v6"].removeprefix("npm:ai@")
    assert f"7.x ({ai})" in page and ai.startswith("7.")
    assert f"6.x ({ai_v6})" in page and ai_v6.startswith("6.")
    for name in ("eventsource", "typescript", "@types/node"):
        assert pins[name] in page, name
    assert "Node.js | 20 (" in page and pins["@types/node"].startswith("20.")
    create_vite = re.search(
        r'CREATE_VITE = "([^"]+)"', (ROOT / "tests/e2e/test_js_client.py").read_text()
    )
    assert create_vite is not None and create_vite.group(1) in page
    app = json.loads((ROOT / "tests" / "js" / "chat-app" / "package.json").read_text())
    app_pins = {**app["dependencies"], **app["devDependencies"]}
    # The chat app's ai is the release its @ai-sdk/react depends on exactly (one ai in the
    # bundle), named beside it on the page.
    lock = json.loads((ROOT / "tests" / "js" / "chat-app" / "package-lock.json").read_text())
    react_needs = lock["packages"]["node_modules/@ai-sdk/react"]["dependencies"]["ai"]
    assert app_pins["ai"] == react_needs and app_pins["ai"].startswith("7.")
    assert f"with `ai` {react_needs} (the release it depends on exactly)" in page
    for name in ("@ai-sdk/react", "react", "vite"):
        assert f"| {app_pins[name]} |" in page, name
    durable = json.loads((ROOT / "tests" / "durable" / "package.json").read_text())
    suite = durable["dependencies"]["@durable-streams/server-conformance-tests"]
    assert f"| Durable Streams conformance suite | {suite} (" in page
    assert f"vitest {durable['dependencies']['vitest']}" in page
    requires = re.search(r'requires-python = ">=(\d+\.\d+)"', (ROOT / "pyproject.toml").read_text())
    assert requires is not None and f"| Python | {requires.group(1)} (" in page


def test_the_environment_page_lists_every_variable() -> None:
    from token_relay.core.settings import Settings

    rows = re.findall(
        r"^\| `(RELAY_\w+)` \| `(--[\w-]+)` \|$",
        (DOCS / "reference" / "environment.md").read_text(),
        re.M,
    )
    expected = [
        (variable, Settings.flag(name)) for name, variable in Settings.environment_names().items()
    ]
    assert rows == expected, "the table's rows: | `RELAY_…` | `--flag` |, in the settings' order"


def test_the_schema_page_is_what_the_relay_prints() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "token_relay", "schema"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    page = DOCS / "reference" / "schema.json"
    assert page.read_text() == printed, f"regenerate it: token-relay schema > {page}"


def _table_names(page: str, heading: str) -> set[str]:
    """The back-quoted names in the first column of the table that starts with ``heading``."""
    text = (DOCS / page).read_text()
    section = text[text.index(heading) :]
    rows = re.findall(r"^\| (`[^|]+`(?:, `[^|]+`)*) \|", section.split("\n#")[0], re.M)
    return {name for row in rows for name in re.findall(r"`([^`{]+)", row)}


def test_every_flag_error_code_and_metric_is_in_the_reference() -> None:
    from token_relay.core.errors import ErrorCode
    from token_relay.core.settings import Settings
    from token_relay.edge.metrics import Metrics

    flags = {
        f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        for f in dataclasses.fields(Settings)
    }
    assert flags - _table_names("reference/flags.md", "| flag | default |") == set()
    codes = {code.value for code in ErrorCode}
    assert codes - _table_names("reference/errors.md", "| code | sent to | when |") == set()
    exported = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in Metrics().registry.collect()
    }
    assert exported - _table_names("reference/metrics.md", "| metric | what |") == set()


PROTOCOL_SAMPLES = [
    "producer-events",
    "producer-batch",
    "producer-session",
    "producer-acks",
    "producer-cancel",
    "producer-abort",
    "subscriber-frames",
    "subscriber-confirmations",
    "subscriber-receives",
    "error-frame",
    "producer-parts",
    "subscriber-parts",
    "subscriber-live-parts",
]


def _json_values(text: str) -> list[object]:
    """The JSON values of a sample, one after the other (a value may span lines)."""
    decoder = json.JSONDecoder()
    values, index = [], 0
    while index < len(text):
        if text[index].isspace():
            index += 1
            continue
        value, index = decoder.raw_decode(text, index)
        values.append(value)
    return values


def test_every_protocol_sample_is_a_frame_of_the_protocol() -> None:
    from token_relay.core.protocol import (
        PRODUCER_BATCH,
        PRODUCER_EVENT,
        SERVER_FRAME,
        SUBSCRIBER_FRAME,
    )

    adapters: dict[str, list[TypeAdapter[Any]]] = {
        "producer-events": [PRODUCER_EVENT],
        "producer-batch": [PRODUCER_BATCH, SERVER_FRAME],
        "producer-session": [SERVER_FRAME],
        "producer-acks": [SERVER_FRAME],
        "producer-cancel": [SERVER_FRAME],
        "producer-abort": [PRODUCER_EVENT],
        "subscriber-frames": [SUBSCRIBER_FRAME],
        "subscriber-confirmations": [SERVER_FRAME],
        "subscriber-receives": [SERVER_FRAME],
        "error-frame": [SERVER_FRAME],
        "producer-parts": [PRODUCER_EVENT],
        "subscriber-parts": [SERVER_FRAME],
        "subscriber-live-parts": [SERVER_FRAME],
    }
    assert set(adapters) == set(PROTOCOL_SAMPLES)
    samples = {
        "producer-events": docs_block("producer-events"),
        "producer-batch": docs_block("producer-batch"),
        "producer-session": docs_block("producer-session"),
        "producer-acks": docs_block("producer-acks"),
        "producer-cancel": docs_block("producer-cancel"),
        "producer-abort": docs_block("producer-abort"),
        "subscriber-frames": docs_block("subscriber-frames"),
        "subscriber-confirmations": docs_block("subscriber-confirmations"),
        "subscriber-receives": docs_block("subscriber-receives"),
        "error-frame": docs_block("error-frame"),
        "producer-parts": docs_block("producer-parts"),
        "subscriber-parts": docs_block("subscriber-parts"),
        "subscriber-live-parts": docs_block("subscriber-live-parts"),
    }
    for name, text in samples.items():
        values = _json_values(text)
        assert values, name
        for value in values:
            # Strict models, no unknown keys: a sample that drifts from the models fails here.
            # Each sample validates as one of the frames its side of the protocol sends.
            valid: list[TypeAdapter[Any]] = []
            for adapter in adapters[name]:
                try:
                    adapter.validate_json(json.dumps(value))
                    valid.append(adapter)
                except ValueError:
                    pass
            assert valid, f"{name}: {value}"


def _modules_table() -> str:
    """The layers page's table of modules, from the package's files and their docstrings."""
    package = ROOT / "server" / "token_relay"
    rows = ["| module | what it is |", "|---|---|"]
    for path in sorted(package.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        summary = " ".join(doc.split("\n\n", 1)[0].split()) or "runs the CLI"
        cell = summary.replace("|", "\\|")
        rows.append(f"| `{path.relative_to(ROOT)}` | {cell} |")
    return "\n".join(rows)


def test_the_layers_page_names_every_module_as_its_docstring_does() -> None:
    page = (DOCS / "explanation" / "layers.md").read_text()
    assert _modules_table() in page, (
        "docs/explanation/layers.md's module table is out of date; it should read:\n"
        + _modules_table()
    )
