"""``python -m server``: run the relay, or print the protocol's JSON Schema."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Sequence

from .errors import ConfigError
from .protocol import json_schema
from .relay import PRODUCE_PATH, SUBSCRIBE_PATH, Relay
from .settings import Settings

__all__ = ["main", "run"]

log = logging.getLogger("token_relay")


async def run(settings: Settings) -> None:
    """Serve until SIGINT or SIGTERM, then close every connection with 1001."""
    relay = Relay(settings)
    server = await relay.start()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, server.close)
    async with relay:
        host, port = server.sockets[0].getsockname()[:2]
        display = f"[{host}]" if ":" in host else host
        log.info(
            "token-relay listening on port %d: producers ws://%s:%d%s, subscribers ws://%s:%d%s",
            port,
            display,
            port,
            PRODUCE_PATH,
            display,
            port,
            SUBSCRIBE_PATH,
        )
        await server.wait_closed()
    log.info("token-relay stopped")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["schema"]:
        print(json.dumps(json_schema(), indent=2))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        settings = Settings.from_args(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(settings))
    return 0
