"""token-relay: assemble streamed model deltas into exact messages and fan them out.

The package is layered, and imports point one way only::

    core  <-  brokers  <-  edge (asyncio, websockets, the CLI)
    core  <-  client

``from token_relay import TokenAssembler`` loads only the pure core. The relay
(:class:`Relay`) and the client library (:class:`RelayProducer`,
:class:`RelaySubscriber`) are loaded when first named.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .core.assembler import TokenAssembler
from .core.errors import (
    BrokerUnavailable,
    ConfigError,
    ErrorCode,
    FrameRejected,
    MessageFailed,
    RelayError,
)
from .core.settings import Settings

if TYPE_CHECKING:
    from .client import RelayProducer, RelaySubscriber
    from .edge.relay import Relay

try:
    __version__ = version("token-relay")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "BrokerUnavailable",
    "ConfigError",
    "ErrorCode",
    "FrameRejected",
    "MessageFailed",
    "Relay",
    "RelayError",
    "RelayProducer",
    "RelaySubscriber",
    "Settings",
    "TokenAssembler",
    "__version__",
]

_LAZY = {
    "Relay": "token_relay.edge.relay",
    "RelayProducer": "token_relay.client",
    "RelaySubscriber": "token_relay.client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'token_relay' has no attribute {name!r}")
    return getattr(import_module(module), name)
