"""The relay's settings: defaults, command-line flags and ``RELAY_*`` environment variables."""

from __future__ import annotations

import argparse
import ast
import base64
import binascii
import difflib
import functools
import inspect
import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from .errors import ConfigError
from .forwarded import parse_networks
from .grants import refusal
from .webhooks import loggable_url

__all__ = ["GROUPS", "Settings"]

MIB = 1024 * 1024
GIB = 1024 * MIB
KIB = 1024
LOG_FORMATS = ("plain", "json")
LOOPS = ("asyncio", "uvloop")
HTTP_PARSERS = ("fast", "h11")


GROUPS: dict[str, tuple[str, ...]] = {
    "network and process": (
        "host",
        "port",
        "workers",
        "loop",
        "http_parser",
        "web_root",
        "shutdown_timeout",
    ),
    "access": ("secret", "insecure", "allowed_origins", "trusted_proxies"),
    "connections": (
        "max_connections_per_ip",
        "handshake_timeout",
        "max_handshakes",
        "max_handshakes_per_ip",
        "ping_interval",
        "max_frame_bytes",
        "max_body_bytes",
    ),
    "producers": (
        "max_message_chars",
        "max_meta_bytes",
        "max_streaming_per_producer",
        "max_completed_per_producer",
        "max_events_per_second",
        "idle_timeout",
        "id_hold",
        "max_named_producers_per_ip",
    ),
    "producer sessions": (
        "session_grace",
        "max_parked_sessions",
        "max_parked_chars",
        "max_parked_per_ip",
    ),
    "subscribers": (
        "max_subscribes_per_second",
        "max_channels_per_subscriber",
        "subscriber_high_water_bytes",
        "max_subscriber_buffer_bytes",
        "delta_flush_ms",
        "sse_heartbeat",
        "ai_sdk_replay_window",
    ),
    "memory and history": (
        "max_memory_bytes",
        "history_size",
        "history_ttl",
        "max_history_channels",
    ),
    "durable streams": (
        "long_poll_timeout",
        "max_durable_streams",
        "max_durable_stream_bytes",
        "max_durable_producers",
    ),
    "broker (Redis)": ("broker", "lease_seconds"),
    "webhooks": (
        "webhooks",
        "webhook_secret",
        "webhook_channels",
        "webhook_timeout",
        "webhook_backoff",
        "webhook_max_age",
        "webhook_max_pending",
        "webhook_max_pending_bytes",
        "webhook_concurrency",
        "webhook_max_dead",
        "webhook_max_dead_bytes",
    ),
    "logging": ("log_format",),
}
"""The sections of ``--help``, each setting in one of them, in the order shown."""

USAGE = """token-relay [flags]       run the relay (the flags are below)
       token-relay schema        print the protocol's JSON Schema
       token-relay token ...     mint a connection token (token-relay token --help)
       token-relay --version"""


def _flag(name: str) -> dict[str, Any]:
    return {"flag": name}


@dataclass(frozen=True, slots=True)
class Settings:
    """Every tunable of a relay process. Each limit's policy is in the README."""

    host: str = "127.0.0.1"
    """The address to listen on."""
    port: int = 8765
    """The TCP port to listen on; 0 picks a free one and the start-up line names it."""
    secret: str = ""
    """HS256 key for connection tokens; without it the relay is open (loopback only)."""
    insecure: bool = False
    """Allow running without a secret on a non-loopback address."""
    allowed_origins: tuple[str, ...] = field(default=(), metadata=_flag("--allowed-origin"))
    """Browser origins allowed to connect (repeatable); clients sending no Origin always may."""
    trusted_proxies: tuple[str, ...] = field(default=(), metadata=_flag("--trusted-proxy"))
    """A reverse proxy's address or network (CIDR), whose Forwarded or X-Forwarded-For names
    the client (repeatable); other peers' headers are ignored."""
    max_frame_bytes: int = MIB
    """A bigger incoming frame closes the connection with 1009."""
    max_meta_bytes: int = 4 * KIB
    """Bytes of JSON a message's merged ``meta`` may hold (an event's own too); an event whose
    ``meta`` would pass it gets ``invalid_event`` and changes nothing."""
    max_message_chars: int = MIB
    """Characters one message may reach; past it the message is aborted (``message_too_large``)."""
    max_streaming_per_producer: int = 1000
    """Unfinished messages per producer connection; one more gets ``too_many_messages``."""
    max_completed_per_producer: int = 1000
    """Finalized ids a producer connection remembers (LRU) for idempotent finals."""
    max_events_per_second: float = 50_000.0
    """Events per second per producer connection, in bursts of one second; then ``rate_limited``."""
    max_subscribes_per_second: float = 100.0
    """Subscribe, unsubscribe and cancel frames per subscriber connection per second, in
    bursts of a second's worth; one more gets rate_limited and changes nothing."""
    max_channels_per_subscriber: int = 100
    """Subscriptions per subscriber connection; one more gets ``too_many_channels``."""
    max_connections_per_ip: int = 256
    """Open connections per client address; one more is refused with HTTP 429."""
    subscriber_high_water_bytes: int = 256 * KIB
    """Unsent bytes to a subscriber above which its pending deltas are merged, not queued."""
    max_subscriber_buffer_bytes: int = 4 * MIB
    """Unsent bytes to one subscriber, merged backlog included; above it, close with 1013."""
    session_grace: float = 30.0
    """Seconds a vanished producer's session waits for it to reconnect; 0 ends it at once."""
    max_parked_chars: int = 64 * MIB
    """Characters of unfinished text all parked sessions may hold together; past it the
    oldest parked session ends (its messages abort)."""
    max_parked_per_ip: int = 16
    """Parked sessions per client address; one more ends that address's oldest."""
    max_named_producers_per_ip: int = 64
    """Named HTTP producers (``POST /produce?producer=NAME``) per client address, in use or
    waiting between requests; a request that would open one more is refused
    (``too_many_producers``, 429). Named producers never count as parked sessions, so
    none is ended to make room."""
    lease_seconds: float = 3.0
    """With Redis: how long a process's lease lasts (renewed three times as often). When it
    lapses, the others abort what its producers do not resume within ``session_grace``."""
    max_parked_sessions: int = 10_000
    """Producer sessions awaiting a reconnect; past it the oldest ends (its messages abort)."""
    max_memory_bytes: int = GIB
    """Bytes of text the relay may hold: messages under way and kept for finals, parked
    sessions, history and the broker's outbox (a character counts as a byte). Past it a
    new message is refused with ``overloaded``; messages under way go on."""
    delta_flush_ms: float = 0.0
    """With more than 0, a channel's deltas are held this long and merged per message."""
    history_size: int = 100
    """Completed (or aborted) messages kept per channel for resume by offset."""
    history_ttl: float = 3600.0
    """Seconds a message stays in a channel's history."""
    max_history_channels: int = 10_000
    """Channels whose history is kept; the least recently used one is dropped (new epoch)."""
    handshake_timeout: float = 5.0
    """Seconds a connection may take to send a whole request head (the opening handshake,
    or the next request on a kept-alive connection); a slower one is cut, and a kept-alive
    one that sends nothing more is closed as idle."""
    max_handshakes: int = 1024
    """Handshakes in flight at once (request heads not yet complete); one more cuts the
    oldest."""
    max_handshakes_per_ip: int = 64
    """Handshakes in flight from one address; one more is refused with HTTP 429 (trusted
    proxies are exempt)."""
    max_body_bytes: int = MIB
    """Bytes an HTTP request body may declare; a bigger one is refused with HTTP 413."""
    sse_heartbeat: float = 15.0
    """Seconds between the comment lines that keep an idle SSE stream open through proxies."""
    ai_sdk_replay_window: float = 60.0
    """Seconds after it completed that a channel's newest reply is still served whole to an
    AI SDK stream that names no ``?id=``; 0 serves a completed reply only by its id."""
    id_hold: float = 60.0
    """Seconds an id stays its producer's on a channel after its message ended; meanwhile
    another producer's event opening it gets ``id_in_use``. 0 frees it at once."""
    ping_interval: float = 20.0
    """Seconds between keepalive pings to each WebSocket peer; one silent for a whole
    interval is cut, so a half-open connection ends within two."""
    idle_timeout: float = 60.0
    """Seconds without an event after which an unfinished message is aborted."""
    shutdown_timeout: float = 10.0
    """Seconds a graceful shutdown may take before connections are cut."""
    broker: str = "memory://"
    """Where channels are shared: ``memory://`` (this process) or ``redis://HOST:PORT/DB``."""
    workers: int = 1
    """Relay processes sharing the port (SO_REUSEPORT); more than one needs a shared broker."""
    web_root: str = ""
    """A folder of static files (the demo page) to serve over HTTP; empty serves none."""
    webhooks: tuple[str, ...] = field(default=(), metadata=_flag("--webhook"))
    """A URL every completed or aborted message is POSTed to as JSON, signed per Standard
    Webhooks, at least once and in order per channel (repeatable)."""
    webhook_secret: str = ""
    """The Standard Webhooks signing secret, whsec_ and base64; empty sends no signature."""
    webhook_channels: tuple[str, ...] = field(default=(), metadata=_flag("--webhook-channel"))
    """Channels whose messages are sent: a name, or a prefix ending in * (repeatable); none
    given sends every channel."""
    webhook_timeout: float = 10.0
    """Seconds a webhook POST may take; a slower one counts as failed and is retried."""
    webhook_backoff: float = 1.0
    """Seconds before the first retry of a failed POST; doubling (with jitter) up to 300."""
    webhook_max_age: float = 3600.0
    """Seconds a message is retried for, from its completion; then it is a dead letter."""
    webhook_max_pending: int = 10_000
    """Messages waiting for their webhooks (in Redis with a Redis broker); past it a new one
    is not queued (subscribers still get it), and is counted and logged."""
    webhook_max_pending_bytes: int = 64 * MIB
    """Bytes of frames waiting for their webhooks; past it a new one is not queued."""
    webhook_concurrency: int = 16
    """POSTs in flight at once, across channels (one per channel and URL at a time)."""
    webhook_max_dead: int = 10_000
    """Dead letters kept (GET /webhooks/dead, in Redis with a Redis broker); past it the
    oldest is dropped, counted and logged."""
    webhook_max_dead_bytes: int = 16 * MIB
    """Bytes of dead letters (as JSON) kept; past it the oldest are dropped, counted and
    logged (a letter bigger than this is dropped at once)."""
    long_poll_timeout: float = 30.0
    """Seconds a Durable Streams long-poll (``GET /v1/stream/S?live=long-poll``) waits for
    data before it answers 204."""
    max_durable_streams: int = 10_000
    """Durable streams this process keeps; creating one more is refused with 507
    (``too_many_streams``)."""
    max_durable_stream_bytes: int = 64 * MIB
    """Bytes one durable stream may hold; an append past it is refused with 413
    (``stream_full``). All streams together count in ``max_memory_bytes``."""
    max_durable_producers: int = 1_000
    """Idempotent producers (``Producer-Id``) remembered per durable stream; past it the
    one that wrote least recently is forgotten."""
    loop: str = "asyncio"
    """The event loop: ``asyncio`` or ``uvloop`` (``pip install 'token-relay[fast]'``)."""
    http_parser: str = "fast"
    """How HTTP requests are read: ``fast`` (the common well-formed shape read at once, h11
    for anything else) or ``h11`` (every request, in pure Python, as a reference)."""
    log_format: str = "plain"
    """The log format: ``plain`` lines or ``json`` (one object per line)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be between 0 and 65535, not {self.port}")
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name.startswith("max_") and value < 1:
                raise ConfigError(f"{item.name} must be at least 1")
        for name in ("history_size", "workers", "subscriber_high_water_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        for name in (
            "history_ttl",
            "idle_timeout",
            "shutdown_timeout",
            "lease_seconds",
            "handshake_timeout",
            "ping_interval",
            "sse_heartbeat",
            "long_poll_timeout",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        for name in ("webhook_timeout", "webhook_backoff", "webhook_max_age"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        for name in (
            "webhook_max_pending",
            "webhook_max_pending_bytes",
            "webhook_concurrency",
            "webhook_max_dead",
            "webhook_max_dead_bytes",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        for url in self.webhooks:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigError(
                    f"--webhook {loggable_url(url)!r} is not an http:// or https:// URL"
                )
        if self.webhook_secret:
            _check_webhook_secret(self.webhook_secret)
        for pattern in self.webhook_channels:
            problem = refusal(pattern)
            if problem is not None:
                raise ConfigError(f"--webhook-channel {pattern!r}: {problem}")
        if self.session_grace < 0:
            raise ConfigError("session_grace must not be negative")
        if self.delta_flush_ms < 0:
            raise ConfigError("delta_flush_ms must not be negative")
        if self.ai_sdk_replay_window < 0:
            raise ConfigError("ai_sdk_replay_window must not be negative")
        if self.id_hold < 0:
            raise ConfigError("id_hold must not be negative")
        for cidr in self.trusted_proxies:
            try:
                parse_networks([cidr])
            except ValueError:
                raise ConfigError(
                    f"--trusted-proxy {cidr!r} is not a network: give an address or CIDR, "
                    "for example 10.0.0.0/8"
                ) from None
        for origin in self.allowed_origins:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
                raise ConfigError(
                    f"--allowed-origin {origin!r} is not an origin: give scheme://host[:port], "
                    "for example https://chat.example"
                )
        if self.loop not in LOOPS:
            raise ConfigError(f"loop must be one of {', '.join(LOOPS)}")
        if self.http_parser not in HTTP_PARSERS:
            raise ConfigError(f"http_parser must be one of {', '.join(HTTP_PARSERS)}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format must be one of {', '.join(LOG_FORMATS)}")
        if self.workers > 1 and self.broker.startswith("memory:"):
            raise ConfigError(
                f"--workers {self.workers} needs a shared broker: with memory:// each process "
                "would keep its own channels and history, so a producer and a subscriber that "
                "land on different processes would never meet. Use --broker redis://HOST:PORT/DB"
            )
        if not self.secret and not self.insecure and not _is_loopback(self.host):
            raise ConfigError(
                f"refusing to serve {self.host} without a secret: anyone who can reach it could "
                "read and write every channel. Set --secret (or RELAY_SECRET), or pass "
                "--insecure if something in front of the relay already authenticates"
            )

    @property
    def open_access(self) -> bool:
        """Whether connections need no token."""
        return not self.secret

    @classmethod
    def from_args(
        cls, argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
    ) -> Settings:
        """Build settings from flags, falling back to ``RELAY_<NAME>`` variables, then defaults."""
        parser = cls.parser(environ if environ is not None else os.environ)
        namespace = parser.parse_args(argv)
        values = {item.name: getattr(namespace, item.name) for item in fields(cls)}
        for name, fallback in getattr(parser, "list_defaults", {}).items():
            given = values[name]
            values[name] = tuple(fallback if given is None else given)
        return cls(**values)

    @classmethod
    def flag(cls, name: str) -> str:
        """The command-line flag of the setting ``name`` (``--allowed-origin``)."""
        item = next(item for item in fields(cls) if item.name == name)
        flag: str = item.metadata.get("flag", "--" + name.replace("_", "-"))
        return flag

    @classmethod
    def environment_names(cls) -> dict[str, str]:
        """Each setting's environment variable: ``RELAY_`` and its flag, one rule for all."""
        return {
            item.name: "RELAY_" + cls.flag(item.name).lstrip("-").replace("-", "_").upper()
            for item in fields(cls)
        }

    @classmethod
    def parser(cls, environ: Mapping[str, str]) -> argparse.ArgumentParser:
        """The ``token-relay`` argument parser, with defaults read from ``environ``."""
        parser = argparse.ArgumentParser(
            prog="token-relay",
            usage=USAGE,
            description="token-relay: assemble streamed model deltas and fan them out. "
            "Every flag can also be set as RELAY_<FLAG> in the environment "
            "(for example RELAY_PORT=9000; lists are comma-separated). "
            "'token-relay schema' prints the protocol's JSON Schema; "
            "'token-relay token --help' mints connection tokens.",
        )
        list_defaults: dict[str, list[str]] = {}
        parser.list_defaults = list_defaults  # type: ignore[attr-defined]
        known = cls.environment_names()
        described = descriptions()
        sections = {title: parser.add_argument_group(title) for title in GROUPS}
        group_of = {name: sections[title] for title, names in GROUPS.items() for name in names}
        shown_order = {name: index for index, name in enumerate(group_of)}
        for name in environ:
            if name.startswith("RELAY_") and name not in known.values():
                close = difflib.get_close_matches(name, known.values(), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise ConfigError(
                    f"unknown environment variable {name}: every flag --NAME is RELAY_NAME{hint}"
                )
        # A setting in no section is a KeyError here: every setting has its flag.
        for item in sorted(fields(cls), key=lambda item: shown_order[item.name]):
            group = group_of[item.name]
            flag = cls.flag(item.name)
            env_name = known[item.name]
            default: Any = item.default
            raw = environ.get(env_name)
            if isinstance(default, bool):
                if raw is not None:
                    default = raw.strip().lower() in ("1", "true", "yes", "on")
                group.add_argument(
                    flag,
                    dest=item.name,
                    action="store_true",
                    default=default,
                    help=f"{described.get(item.name, '')} (env {env_name})",
                )
                continue
            if isinstance(default, tuple):
                if raw is not None:
                    default = [part.strip() for part in raw.split(",") if part.strip()]
                # Flags replace the environment's list rather than add to it.
                list_defaults[item.name] = list(default)
                group.add_argument(
                    flag,
                    dest=item.name,
                    action="append",
                    default=None,
                    metavar="VALUE",
                    help=f"{described.get(item.name, '')} (env {env_name}, comma-separated)",
                )
                continue
            kind: type[int] | type[float] | type[str] = type(default)
            if raw is not None:
                try:
                    default = kind(raw)
                except ValueError:
                    raise ConfigError(
                        f"{env_name}={raw!r} is not a valid {kind.__name__}"
                    ) from None
            shown = "(set)" if item.name == "secret" and default else default
            given = f", default {shown!s}" if shown != "" else ""
            group.add_argument(
                flag,
                dest=item.name,
                type=kind,
                default=default,
                metavar=item.name.upper() if kind is str else "N",
                help=f"{described.get(item.name, '')} (env {env_name}{given})",
            )
        return parser


@functools.cache
def descriptions() -> dict[str, str]:
    """Each setting's docstring, on one line: the one description, shown by ``--help``."""
    tree = ast.parse(inspect.getsource(Settings))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found: dict[str, str] = {}
    for node, following in zip(body, [*body[1:], None], strict=True):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            found[node.target.id] = " ".join(following.value.value.replace("``", "").split())
    return found


def _check_webhook_secret(secret: str) -> None:
    body = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(body + "==", validate=False)
    except (binascii.Error, ValueError):
        key = b""
    if not secret.startswith("whsec_") or len(key) < 16:
        raise ConfigError(
            "--webhook-secret must be whsec_ followed by base64 of at least 16 random bytes, "
            "for example whsec_" + base64.b64encode(os.urandom(24)).decode()
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
