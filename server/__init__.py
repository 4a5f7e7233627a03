"""token-relay: assemble streamed model deltas into exact messages and fan them out."""

from .assembler import TokenAssembler
from .client import MessageFailed, RelayProducer, RelaySubscriber
from .errors import ConfigError, ErrorCode, FrameRejected, RelayError
from .relay import Relay
from .settings import Settings

__all__ = [
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
]
