"""``token-relay``: run the relay (one process or several), print the JSON Schema, mint tokens."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence

from .. import __version__
from ..brokers import open_broker
from ..core.chatframes import chat_schema
from ..core.errors import ConfigError
from ..core.grants import Role
from ..core.protocol import json_schema
from ..core.settings import Settings
from ..tokens import mint
from .logs import configure as configure_logs
from .relay import Relay
from .workers import loop_factory, run, run_workers

__all__ = ["main"]

log = logging.getLogger("token_relay")


def _mint(args: Sequence[str]) -> int:
    """``token-relay token``: print a signed connection token."""
    parser = argparse.ArgumentParser(
        prog="token-relay token",
        description="Mint an HS256 connection token for a relay started with the same secret.",
    )
    parser.add_argument("--role", choices=[role.value for role in Role], required=True)
    parser.add_argument(
        "--channel",
        action="append",
        default=[],
        help="a channel name, or a prefix ending in '*' such as 'chat-*' (repeatable; "
        "needed for produce and subscribe, not for admin)",
    )
    parser.add_argument("--ttl", type=float, default=3600.0, help="seconds until it expires")
    parser.add_argument(
        "--secret", default=os.environ.get("RELAY_SECRET", ""), help="(env RELAY_SECRET)"
    )
    options = parser.parse_args(args)
    if not options.secret:
        print("error: give --secret or set RELAY_SECRET", file=sys.stderr)
        return 2
    if options.role != Role.ADMIN.value and not options.channel:
        print(f"error: a {options.role} token needs at least one --channel", file=sys.stderr)
        return 2
    try:
        token = mint(options.secret, Role(options.role), options.channel, options.ttl)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _output(token)


def _output(text: str) -> int:
    """Print ``text`` and return the exit code: 0, or 1 if the reader went away first
    (``token-relay schema | head``), which is not worth a traceback."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Python flushes stdout again on its way out: give it somewhere to go quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--version"], ["-V"]):
        return _output(f"token-relay {__version__}")
    if args[:1] == ["schema"]:
        return _output(json.dumps({**json_schema(), **chat_schema()}, indent=2))
    if args[:1] == ["token"]:
        return _mint(args[1:])
    configure_logs("plain")
    try:
        settings = Settings.from_args(args)
        configure_logs(settings.log_format)
        if settings.insecure and settings.open_access:
            log.warning(
                "RUNNING WITHOUT AUTHENTICATION on %s: anyone who can reach this port can read "
                "and write every channel (--insecure)",
                settings.host,
            )
        relay = Relay(settings) if settings.workers == 1 else None
        event_loop = loop_factory(settings)
        if relay is None:
            open_broker(settings, "probe")  # refuse a bad --broker before forking
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if relay is None:
            return run_workers(settings)
        with (
            contextlib.suppress(KeyboardInterrupt),
            asyncio.Runner(loop_factory=event_loop) as runner,
        ):
            runner.run(run(relay))
    except OSError as exc:
        # The one start-up failure the settings cannot foresee: the address is taken or
        # cannot be bound.
        reason = exc.strerror or str(exc)
        print(
            f"error: cannot listen on {settings.host}:{settings.port} (--host, --port): {reason}",
            file=sys.stderr,
        )
        return 2
    return 0
