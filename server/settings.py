"""The relay's settings: defaults, command-line flags and ``RELAY_*`` environment variables."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from .errors import ConfigError

__all__ = ["Settings"]

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Settings:
    """Every tunable of a relay process. Each limit's policy is in the README."""

    host: str = "127.0.0.1"
    port: int = 8765
    max_frame_bytes: int = MIB
    """A bigger incoming frame closes the connection with 1009."""
    max_streaming_per_producer: int = 1000
    """Unfinished messages per producer connection; one more gets ``too_many_messages``."""
    max_completed_per_producer: int = 1000
    """Finalized ids a producer connection remembers (LRU) for idempotent finals."""
    max_channels_per_subscriber: int = 100
    """Subscriptions per subscriber connection; one more gets ``too_many_channels``."""
    max_subscriber_buffer_bytes: int = 4 * MIB
    """Unsent bytes queued to one subscriber; above it the subscriber is closed with 1013."""
    history_size: int = 100
    """Completed (or aborted) messages kept per channel for resume by offset."""
    history_ttl: float = 3600.0
    """Seconds a message stays in a channel's history."""
    max_history_channels: int = 10_000
    """Channels whose history is kept; the least recently used one is dropped (new epoch)."""
    idle_timeout: float = 60.0
    """Seconds without an event after which an unfinished message is aborted."""
    broker: str = "memory://"
    """Where channels are shared: ``memory://`` (this process) or ``redis://HOST:PORT/DB``."""
    workers: int = 1
    """Relay processes sharing the port (SO_REUSEPORT); more than one needs a shared broker."""
    web_root: str = ""
    """A folder of static files (the demo page) to serve over HTTP; empty serves none."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be between 0 and 65535, not {self.port}")
        for field in fields(self):
            if field.name.startswith("max_") and getattr(self, field.name) < 1:
                raise ConfigError(f"{field.name} must be at least 1")
        if self.workers > 1 and self.broker.startswith("memory:"):
            raise ConfigError(
                f"--workers {self.workers} needs a shared broker: with memory:// each process "
                "would keep its own channels and history, so a producer and a subscriber that "
                "land on different processes would never meet. Use --broker redis://HOST:PORT/DB"
            )
        for name in ("history_size", "workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        for name in ("history_ttl", "idle_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")

    @classmethod
    def from_args(
        cls, argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
    ) -> Settings:
        """Build settings from flags, falling back to ``RELAY_<NAME>`` variables, then defaults."""
        parser = cls.parser(environ if environ is not None else os.environ)
        namespace = parser.parse_args(argv)
        return cls(**{field.name: getattr(namespace, field.name) for field in fields(cls)})

    @classmethod
    def parser(cls, environ: Mapping[str, str]) -> argparse.ArgumentParser:
        """The ``python -m server`` argument parser, with defaults read from ``environ``."""
        parser = argparse.ArgumentParser(
            prog="python -m server",
            description="token-relay: assemble streamed model deltas and fan them out. "
            "Every flag can also be set as RELAY_<FLAG> in the environment "
            "(for example RELAY_PORT=9000). 'python -m server schema' prints the "
            "protocol's JSON Schema.",
        )
        for field in fields(cls):
            env_name = "RELAY_" + field.name.upper()
            default: object = field.default
            kind: type[int] | type[float] | type[str] = (
                int if isinstance(default, int) else float if isinstance(default, float) else str
            )
            raw = environ.get(env_name)
            if raw is not None:
                try:
                    default = kind(raw)
                except ValueError:
                    raise ConfigError(
                        f"{env_name}={raw!r} is not a valid {kind.__name__}"
                    ) from None
            parser.add_argument(
                "--" + field.name.replace("_", "-"),
                dest=field.name,
                type=kind,
                default=default,
                metavar=field.name.upper() if kind is str else "N",
                help=f"(env {env_name}, default {default})",
            )
        return parser
