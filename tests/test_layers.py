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


def _modules() -> list[str]:
    """Every module of the package, each package's ``__init__`` included (by its
    package's name)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


MODULES = _modules()
REDIS = "token_relay.brokers.redis"
"""The brokers' modules that speak to Redis (this prefix): the only ones that load it."""
SANS_IO = {
    "token_relay.edge.frames",
    "token_relay.edge.broadcast",
    "token_relay.edge.routes",
    "token_relay.edge.statuses",
}
"""The edge's modules that work without a loop or a socket: frames, routes and statuses."""
PARTS_MODULES = (
    "compaction", "fields", "message", "partialjson", "records", "refusals", "state", "texts",
    "tools",
)  # fmt: skip
CLIENT_CORE = {
    "token_relay",
    "token_relay.core",
    "token_relay.core.errors",
    "token_relay.core.protocol",
    # A structured reply's live parts, rebuilt by the relay's own pure assembler.
    "token_relay.core.assembler",
    "token_relay.core.surrogates",
    "token_relay.core.parts",
    *(f"token_relay.core.parts.{name}" for name in PARTS_MODULES),
}
"""All the client library loads of the package besides itself: the protocol, the errors,
and the pure assembler of a structured reply's parts."""


def _import(module: str) -> str:
    if module == "token_relay.__main__":  # the CLI runs on import: ask it only its version
        return (
            "import contextlib, io\n"
            "sys.argv = ['token-relay', '--version']\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    import token_relay.__main__"
        )
    return f"import {module}"


def _rule_broken(module: str, loaded: set[str]) -> list[str]:
    """What ``module`` loaded that its layer may not: empty if it keeps to its layer."""
    ours = {m for m in loaded if m.startswith("token_relay.")}
    tops = _tops(loaded)
    layer = module.split(".")[1] if "." in module else ""
    allowed_layers = {
        "": {"core"},  # the package itself: the errors (the rest is loaded when named)
        "core": {"core"},
        "brokers": {"core", "brokers"},
        "client": {"core", "client"},
        "edge": {"core", "brokers", "edge", "tokens"},
        "__main__": {"core", "brokers", "edge", "tokens"},
        "tokens": {"core", "tokens"},  # app code mints tokens without loading the relay
    }[layer]
    broken = sorted(m for m in ours if m.split(".")[1] not in allowed_layers)
    forbidden = {
        "": set(IO) | {"argparse"},
        "core": set(IO),
        "brokers": {"websockets", "prometheus_client", "h11"}
        | (set() if module.startswith(REDIS) else {"redis", "hiredis"}),
        "client": {"redis", "hiredis", "prometheus_client", "h11", "argparse"},
        "edge": {"redis", "hiredis"} | ({"asyncio"} if module in SANS_IO else set()),
        "__main__": {"redis", "hiredis"},
        "tokens": set(IO) | {"h11", "argparse"},
    }[layer]
    broken += sorted(tops & forbidden)
    if layer == "":
        broken += sorted(ours - {"token_relay.core", "token_relay.core.errors"})
    if layer == "client":
        broken += sorted({m for m in ours if not m.startswith("token_relay.client")} - CLIENT_CORE)
    if "websockets.asyncio.server" in loaded:  # the edge speaks WebSocket sans I/O
        broken.append("websockets.asyncio.server")
    return broken


def test_every_module_is_covered() -> None:
    # Every package __init__ and the modules the layers' rules single out are among them.
    packages = {"token_relay", "token_relay.core", "token_relay.brokers", "token_relay.client"}
    assert packages | {"token_relay.edge", "token_relay.core.resume"} <= set(MODULES)
    assert {"token_relay.core.webhooks", "token_relay.tokens", REDIS, *SANS_IO} <= set(MODULES)
    assert len(MODULES) > 50
    # Every folder of modules is a package whose __init__ is checked too (none is a
    # namespace package that no layer's rule would see as a whole).
    folders = {path.parent.relative_to(PACKAGE.parent) for path in PACKAGE.rglob("*.py")}
    assert {".".join(folder.parts) for folder in folders} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_each_module_loads_only_its_layer(module: str) -> None:
    loaded = _loaded_after(_import(module))
    # A module that exits as it is imported (the CLI's) leaves only what it imported.
    assert module in loaded or (
        module == "token_relay.__main__" and "token_relay.edge.cli" in loaded
    )
    assert _rule_broken(module, loaded) == []


def test_the_rules_catch_what_breaks_them() -> None:
    # The check above can fail: a core module that loads asyncio, a client that loads the
    # settings (and argparse), a broker that loads Redis unasked, a frame reader on a loop.
    assert _rule_broken("token_relay.core.hub", {"asyncio"}) == ["asyncio"]
    assert _rule_broken("token_relay.client.base", {"token_relay.core.settings", "argparse"}) == [
        "argparse",
        "token_relay.core.settings",
    ]
    assert _rule_broken("token_relay.brokers.memory", {"redis.client"}) == ["redis"]
    assert _rule_broken("token_relay.edge.frames", {"asyncio.events"}) == ["asyncio"]
    assert _rule_broken("token_relay", {"token_relay.core.settings"}) == [
        "token_relay.core.settings"
    ]
    assert _rule_broken("token_relay.core.webhooks", {"token_relay.edge.logs"}) == [
        "token_relay.edge.logs"
    ]


def test_the_client_loads_the_protocol_the_errors_and_the_parts_only() -> None:
    loaded = _loaded_after("import token_relay.client")
    assert "websockets.asyncio.client" in loaded
    assert "websockets.asyncio.server" not in loaded
    assert not _tops(loaded) & {"prometheus_client", "redis", "h11", "argparse"}
    ours = {m for m in loaded if m.startswith("token_relay")}
    assert ours == CLIENT_CORE | {
        "token_relay.client",
        "token_relay.client.base",
        "token_relay.client.producer",
        "token_relay.client.subscriber",
        "token_relay.client.ui_messages",  # pure: openai_messages, importing no SDK
    }


def test_the_package_loads_each_name_when_named() -> None:
    loaded = _loaded_after("from token_relay import TokenAssembler")
    assert {m for m in loaded if m.startswith("token_relay")} == {
        "token_relay",
        "token_relay.core",
        "token_relay.core.assembler",
        "token_relay.core.errors",
    }
    assert "token_relay.core.settings" in _loaded_after("from token_relay import Settings")


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
