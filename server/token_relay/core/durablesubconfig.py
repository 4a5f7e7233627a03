"""A Durable Streams subscription's configuration: its JSON body validated
(:class:`SubscriptionConfig`), its webhook URL checked against SSRF, and its glob.

A subscription names streams by a glob over their stream-root-relative paths (``*`` one
segment, or part of one; ``**`` any number of whole segments) and by explicit paths. A
webhook URL must be ``https://`` and must not name a private, loopback, link-local or
reserved address, but for ``http://localhost`` and ``http://127.0.0.x`` (development).
Hosts are checked as written: a name is not resolved here.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Iterable
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import SubscriptionError

__all__ = [
    "DEFAULT_LEASE_MS",
    "MAX_EXPLICIT_CHARS",
    "MAX_EXPLICIT_STREAMS",
    "MAX_TEXT",
    "SubscriptionConfig",
    "config_of",
    "explicit_chars",
    "glob_match",
    "webhook_url_problem",
]

MAX_EXPLICIT_STREAMS = 1000
"""Explicit streams one subscription may link."""
MAX_TEXT = 1024
"""Characters of a pattern, a stream path, a description or a webhook URL."""
MAX_EXPLICIT_CHARS = 64 * 1024
"""Characters of one subscription's explicit stream paths together: with
:data:`MAX_EXPLICIT_STREAMS` and the subscriptions' count, what every subscription's explicit
links may hold (a path need name no stream, so nothing else bounds them)."""
DEFAULT_LEASE_MS = 30_000


class _Webhook(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    url: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]


class SubscriptionConfig(BaseModel):
    """The body of ``PUT /v1/stream/__ds/subscriptions/{id}``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    type: Literal["webhook", "pull-wake"]
    pattern: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)] | None = None
    streams: (
        Annotated[
            list[Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]],
            Field(max_length=MAX_EXPLICIT_STREAMS),
        ]
        | None
    ) = None
    webhook: _Webhook | None = None
    wake_stream: Annotated[str, Field(min_length=1, max_length=MAX_TEXT)] | None = None
    lease_ttl_ms: Annotated[int, Field(ge=1000, le=600_000)] = DEFAULT_LEASE_MS
    description: Annotated[str, Field(max_length=MAX_TEXT)] | None = None

    def digest(self) -> str:
        """The hash of the normalized configuration: a second ``PUT`` with the same one
        re-confirms the subscription."""
        normal = self.model_dump()
        normal["streams"] = sorted(set(self.streams or ()))
        return hashlib.sha256(json.dumps(normal, sort_keys=True).encode()).hexdigest()


def config_of(body: bytes) -> SubscriptionConfig:
    """A subscription's configuration, validated: 400 ``INVALID_REQUEST`` or
    ``WEBHOOK_URL_REJECTED``."""
    try:
        config = SubscriptionConfig.model_validate_json(body or b"null")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the body"
        raise SubscriptionError(400, "INVALID_REQUEST", f"{where}: {first['msg']}") from None
    if explicit_chars(config.streams or ()) > MAX_EXPLICIT_CHARS:
        raise SubscriptionError(
            400, "INVALID_REQUEST", f"streams: at most {MAX_EXPLICIT_CHARS} characters in all"
        )
    if config.pattern is None and not config.streams:
        raise SubscriptionError(400, "INVALID_REQUEST", "give a pattern, streams, or both")
    if config.type == "webhook":
        if config.webhook is None:
            raise SubscriptionError(400, "INVALID_REQUEST", "a webhook needs webhook.url")
        problem = webhook_url_problem(config.webhook.url)
        if problem is not None:
            raise SubscriptionError(400, "WEBHOOK_URL_REJECTED", problem)
    elif config.wake_stream is None:
        raise SubscriptionError(400, "INVALID_REQUEST", "a pull-wake needs wake_stream")
    return config


def explicit_chars(paths: Iterable[str]) -> int:
    """Characters of distinct explicit stream paths together (a path named twice is one
    link)."""
    return sum(len(path) for path in set(paths))


def webhook_url_problem(url: str) -> str | None:
    """Why a webhook URL is refused (SSRF), or None: ``https://`` only, but for
    ``http://localhost`` and ``http://127.0.0.x`` in development; never a private,
    link-local, loopback or otherwise local address, but for those."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        return "a webhook URL is an https:// URL"
    local = host == "localhost" or re.fullmatch(r"127\.0\.0\.\d{1,3}", host) is not None
    if local:
        return None
    if parts.scheme != "https":
        return "a webhook URL is https:// (http:// only to localhost or 127.0.0.x)"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        if host.endswith((".localhost", ".local", ".internal")):
            return "a webhook URL's host must not be a local name"
        return None
    if not address.is_global:
        return "a webhook URL must not name a private, loopback, link-local or reserved address"
    return None


def glob_match(pattern: str, path: str) -> bool:
    """Whether a stream path matches a glob: ``*`` is one segment (or part of one), ``**``
    any number of whole segments."""

    def match(pattern_parts: list[str], path_parts: list[str]) -> bool:
        if not pattern_parts:
            return not path_parts
        head, rest = pattern_parts[0], pattern_parts[1:]
        if head == "**":
            return any(match(rest, path_parts[i:]) for i in range(len(path_parts) + 1))
        if not path_parts:
            return False
        piece = re.escape(head).replace(r"\*", "[^/]*")
        return re.fullmatch(piece, path_parts[0]) is not None and match(rest, path_parts[1:])

    return match(pattern.split("/"), path.split("/"))
