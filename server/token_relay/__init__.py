"""token-relay: assemble streamed model deltas into exact messages and fan them out.

The package is layered, and imports point one way only::

    core  <-  brokers  <-  edge (asyncio, websockets, the CLI)
    core  <-  client

``import token_relay`` loads only the errors. ``from token_relay import TokenAssembler``
loads only the pure core, and the client library (:class:`RelayProducer`,
:class:`RelaySubscriber`) only the protocol and the errors besides itself. Every name
but the errors is loaded when first named: :class:`Settings` (and argparse), the
assembler, the relay (:class:`Relay`) and the client library.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .core.errors import (
    BrokerUnavailable,
    ConfigError,
    ErrorCode,
    FrameRejected,
    MessageFailed,
    RelayError,
)

if TYPE_CHECKING:
    from .client import RelayProducer, RelaySubscriber
    from .core.assembler import TokenAssembler
    from .core.settings import Settings
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
    "Settings": "token_relay.core.settings",
    "TokenAssembler": "token_relay.core.assembler",
    "Relay": "token_relay.edge.relay",
    "RelayProducer": "token_relay.client",
    "RelaySubscriber": "token_relay.client",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'token_relay' has no attribute {name!r}")
    return getattr(import_module(module), name)
