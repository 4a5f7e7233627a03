"""Tests for token_relay.core.errors: one tree, followed by every raise in the package."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from token_relay.core import errors
from token_relay.core.errors import Blame, RelayError

PACKAGE = Path(errors.__file__).resolve().parents[1]
# Python's own protocols: a module __getattr__ must raise AttributeError.
PROTOCOL = {"AttributeError", "StopAsyncIteration"}  # Python protocols, not errors


def _tree() -> dict[str, type[RelayError]]:
    return {
        name: cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, RelayError)
    }


def test_every_exception_sits_under_the_root_with_its_blame() -> None:
    tree = _tree()
    assert set(tree) == {
        "RelayError",
        "ConfigError",
        "UsageError",
        "PeerError",
        "FrameRejected",
        "PartRejected",
        "StreamRefused",
        "SubscriptionError",
        "InvalidToken",
        "RelayProtocolError",
        "HandshakeRefused",
        "MessageFailed",
        "BrokerUnavailable",
        "BadRequest",
        "InvalidResponse",
    }
    blames = {name: cls.blame for name, cls in tree.items()}
    assert blames["ConfigError"] is blames["UsageError"] is Blame.LOCAL
    assert blames["FrameRejected"] is blames["InvalidToken"] is Blame.PEER
    assert blames["MessageFailed"] is blames["RelayProtocolError"] is Blame.PEER
    assert blames["HandshakeRefused"] is blames["PartRejected"] is Blame.PEER
    assert blames["StreamRefused"] is Blame.PEER
    assert blames["BrokerUnavailable"] is Blame.WORLD
    assert blames["BadRequest"] is Blame.PEER and blames["InvalidResponse"] is Blame.LOCAL
    # The docstring draws the tree: every class is named in it.
    assert all(name in (errors.__doc__ or "") for name in tree)


def test_every_raise_in_the_package_raises_a_class_of_the_tree() -> None:
    allowed = set(_tree()) | PROTOCOL | {"binary_rejected", "broker_rejected"}
    strays = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
            if name and name[0].isupper() and name not in allowed:
                strays.append(f"{path.relative_to(PACKAGE)}:{node.lineno} raises {name}")
    assert strays == []
