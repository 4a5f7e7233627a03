"""The HTTP status of each error code, in one table, for every HTTP surface that answers one.

An HTTP surface answers a refusal with the ``error`` frame a WebSocket would have been
sent, under the status this table gives its code. Each surface names the codes it maps
(the others are 400), so a code that surface can't meet never changes its answers:

* ``POST /cancel`` and Stop (``POST /ai-sdk/{channel}/stop``): :data:`CANCEL_CODES`;
* an AI SDK stream whose join is refused: :data:`JOIN_CODES`;
* ``POST /produce``: :data:`PRODUCE_CODES`, the first one met among its errors, in that
  order (200 when none is, the other refusals being in its ``errors``).
"""

from __future__ import annotations

from collections.abc import Collection

from ..core.errors import ErrorCode

__all__ = [
    "CANCEL_CODES",
    "HTTP_STATUS",
    "JOIN_CODES",
    "PRODUCE_CODES",
    "produce_status",
    "status_of",
]

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_JSON: 400,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.UNKNOWN_MESSAGE: 404,
    ErrorCode.PRODUCER_BUSY: 409,
    ErrorCode.PRODUCER_MOVED: 409,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.MESSAGE_TOO_LARGE: 413,
    ErrorCode.PART_TOO_LARGE: 413,
    ErrorCode.LINE_TOO_LONG: 413,
    ErrorCode.TOO_MANY_PRODUCERS: 429,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.RELAY_STOPPING: 503,
    ErrorCode.BROKER_UNAVAILABLE: 503,
}
"""The status of each code an HTTP surface maps."""

CANCEL_CODES = (ErrorCode.FORBIDDEN, ErrorCode.UNKNOWN_MESSAGE, ErrorCode.BROKER_UNAVAILABLE)
JOIN_CODES = (ErrorCode.FORBIDDEN, ErrorCode.BROKER_UNAVAILABLE)
PRODUCE_CODES = (
    ErrorCode.BODY_TOO_LARGE,
    ErrorCode.TOO_MANY_PRODUCERS,
    ErrorCode.PRODUCER_BUSY,
    ErrorCode.PRODUCER_MOVED,
    ErrorCode.RATE_LIMITED,
    ErrorCode.RELAY_STOPPING,
    ErrorCode.BROKER_UNAVAILABLE,
    ErrorCode.MESSAGE_TOO_LARGE,
    ErrorCode.PART_TOO_LARGE,
    ErrorCode.LINE_TOO_LONG,
    ErrorCode.INVALID_JSON,
)
"""The codes that set the status of a producer request, the first met first."""


def status_of(code: str, among: Collection[ErrorCode]) -> int:
    """The status of a refusal with ``code``, for a surface that maps the codes ``among``;
    400 for any other."""
    return HTTP_STATUS[ErrorCode(code)] if code in among else 400


def produce_status(codes: Collection[str]) -> int:
    """The status of a producer request whose errors carry ``codes``: that of the first of
    :data:`PRODUCE_CODES` among them, else 200."""
    if not codes:
        return 200
    for code in PRODUCE_CODES:
        if code in codes:
            return HTTP_STATUS[code]
    return 200
