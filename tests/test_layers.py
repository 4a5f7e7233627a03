"""The house drawn from the imports: a pure core, layers with one direction, no cycle.

Each layer is imported in a fresh interpreter and ``sys.modules`` is read, so a
dependency that sneaks in anywhere along the way shows up here.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "server" / "token_relay"
IO = ("asyncio", "websockets", "redis", "prometheus_client")


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return set(json.loads(out))


def _tops(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


@pytest.mark.parametrize(
    "statement",
    [
        "import token_relay.core",
        "from token_relay import TokenAssembler",
        "import token_relay.core.router, token_relay.core.sessions, token_relay.core.streams",
        "import token_relay.core.merge, token_relay.core.history, token_relay.core.protocol",
        "from token_relay.core import grants, hub, inflight, ratelimit, settings, events, errors",
    ],
)
def test_the_core_loads_no_io(statement: str) -> None:
    loaded = _loaded_after(statement)
    assert not _tops(loaded) & set(IO), sorted(_tops(loaded) & set(IO))
    assert not {m for m in loaded if m.startswith(("token_relay.edge", "token_relay.brokers"))}


def test_the_client_loads_no_relay() -> None:
    loaded = _loaded_after("import token_relay.client")
    assert "websockets.asyncio.client" in loaded
    assert "websockets.asyncio.server" not in loaded
    assert "prometheus_client" not in _tops(loaded)
    assert "redis" not in _tops(loaded)
    relay = {m for m in loaded if m.startswith(("token_relay.edge", "token_relay.brokers"))}
    assert relay == set()


def test_the_brokers_load_redis_only_when_asked() -> None:
    loaded = _loaded_after("import token_relay.brokers, token_relay.brokers.memory")
    assert not _tops(loaded) & {"redis", "websockets", "prometheus_client"}
    assert "token_relay.edge" not in {m.rsplit(".", 1)[0] for m in loaded}


def test_the_edge_loads_no_redis_and_no_client() -> None:
    loaded = _loaded_after("import token_relay.edge.relay, token_relay.edge.cli")
    # The edge speaks HTTP with h11 and WebSocket with websockets' sans-I/O protocol.
    assert {"h11", "websockets.protocol"} <= loaded
    assert "websockets.asyncio.server" not in loaded
    assert "redis" not in _tops(loaded)
    assert not {m for m in loaded if m.startswith("token_relay.client")}


def _imports() -> dict[str, set[str]]:
    """Module -> the token_relay modules it imports (relative imports resolved)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join(parts)
        base = parts if is_package else parts[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[: len(base) - node.level + 1]
                    module = ".".join([*anchor, *(node.module.split(".") if node.module else [])])
                else:
                    module = node.module or ""
                targets.add(module)
                targets.update(f"{module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t.startswith("token_relay")}
    modules = set(graph)
    return {name: {t for t in targets if t in modules} - {name} for name, targets in graph.items()}


LAYER = {"core": 0, "brokers": 1, "client": 1, "edge": 2}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYER else None


def test_dependencies_point_one_way() -> None:
    wrong = []
    for module, targets in _imports().items():
        source = _layer(module)
        if source is None:
            continue
        for target in targets:
            layer = _layer(target)
            if layer is None and target != "token_relay":
                continue
            if target == "token_relay" and source == "edge":
                continue  # the CLI reads the package's version
            if (
                layer is None
                or LAYER[layer] > LAYER[source]
                or {source, layer}
                == {
                    "brokers",
                    "client",
                }
            ) or (source == "client" and layer == "edge"):
                wrong.append((module, target))
    assert wrong == []


def test_no_import_cycle() -> None:
    graph = _imports()
    # Package __init__ modules import their own children; those edges are not cycles of
    # concepts, so only module-to-module edges between non-package modules count.
    packages = {name for name in graph if (PACKAGE.parent / name.replace(".", "/")).is_dir()}
    edges = {
        name: {t for t in targets if t not in packages}
        for name, targets in graph.items()
        if name not in packages
    }
    seen: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        seen[node] = 1
        path.append(node)
        for target in edges.get(node, ()):
            if seen.get(target) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, target]))
            if target not in seen:
                visit(target)
        path.pop()
        seen[node] = 2

    for node in edges:
        if node not in seen:
            visit(node)
    assert len(seen) == len(edges) > 20
