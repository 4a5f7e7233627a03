"""The relay's exceptions.

Every exception the relay raises on purpose derives from :class:`RelayError`::

    RelayError
    ├── ConfigError        our operator's fault: a setting is invalid; the relay won't start
    ├── FrameRejected      the peer's fault: one frame broke the protocol; answer it with
    │                      an error frame and keep the connection serving
    └── BrokerUnavailable  the world's fault: the shared broker can't be reached; answer
                           ``broker_unavailable`` for what could not be done, and retry

A rejected frame is never our exception to propagate: the connection layer turns
it into an ``error`` frame and goes on with the next frame.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["BrokerUnavailable", "ConfigError", "ErrorCode", "FrameRejected", "RelayError"]


class ErrorCode(StrEnum):
    """Stable, machine-readable codes carried by ``error`` frames."""

    INVALID_JSON = "invalid_json"
    INVALID_EVENT = "invalid_event"
    INVALID_FRAME = "invalid_frame"
    UNKNOWN_FRAME = "unknown_frame"
    BINARY_NOT_SUPPORTED = "binary_not_supported"
    CHANNEL_REQUIRED = "channel_required"
    CHANNEL_MISMATCH = "channel_mismatch"
    TOO_MANY_MESSAGES = "too_many_messages"
    TOO_MANY_CHANNELS = "too_many_channels"
    MESSAGE_ABORTED = "message_aborted"
    UNKNOWN_MESSAGE = "unknown_message"
    NOT_SUBSCRIBED = "not_subscribed"
    BROKER_UNAVAILABLE = "broker_unavailable"
    FORBIDDEN = "forbidden"
    RATE_LIMITED = "rate_limited"
    MESSAGE_TOO_LARGE = "message_too_large"
    SEQ_GAP = "seq_gap"


class RelayError(Exception):
    """Root of every exception the relay raises on purpose."""


class ConfigError(RelayError):
    """A setting is invalid, so the relay refuses to start."""


class BrokerUnavailable(RelayError):
    """The broker could not be reached; what was asked of it did not happen."""


class FrameRejected(RelayError):
    """A peer's frame broke the protocol; it is answered with an error frame."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        message_id: str | None = None,
        index: int | None = None,
        *,
        expected: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.message_id = message_id
        self.index = index
        """The event's position in a batch frame, if it came in one."""
        self.expected = expected
        """For ``seq_gap``: the seq the relay expects next for that message."""
