"""token-relay: assemble streamed model deltas into exact messages and fan them out."""

from .assembler import TokenAssembler
from .errors import ConfigError, ErrorCode, FrameRejected, RelayError
from .relay import Relay
from .settings import Settings

__all__ = [
    "ConfigError",
    "ErrorCode",
    "FrameRejected",
    "Relay",
    "RelayError",
    "Settings",
    "TokenAssembler",
]
