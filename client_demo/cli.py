"""``python -m client_demo``: a demo model gateway and chat subscriber for token-relay.

Against a running relay, it streams four replies, interleaved (the last with
reasoning and a tool call before its text), prints each completed message,
checks the text and exits::

    python -m client_demo --url ws://127.0.0.1:8765

With ``--serve`` it first starts a relay of its own that also serves the chat
demo page, prints the URL to open, and keeps answering prompts typed on the
page until Ctrl-C (``--once`` exits after the four replies instead).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from pydantic import MISSING
from token_relay import Relay, Settings
from token_relay.client import RelayProducer, RelaySubscriber
from token_relay.core.protocol import Aborted, MessageFrame, Subscribed

from . import WEB_ROOT
from .gateway import REPLIES, DemoGateway


async def demo(url: str, channel: str, *, forever: bool) -> int:
    """Run the gateway and one console subscriber; return 0 if every reply arrived exactly."""
    expected = {reply.message_id: reply.text for reply in REPLIES}
    received: dict[str, str] = {}
    async with (
        RelaySubscriber(url, [channel], deltas=False) as feed,
        RelaySubscriber(url, [f"{channel}-prompts"], deltas=False) as prompts,
        RelayProducer(url, channel=channel) as producer,
    ):
        gateway = DemoGateway(producer)
        background = [
            asyncio.create_task(gateway.watch_cancels()),
            asyncio.create_task(gateway.answer_prompts(prompts, channel)),
            asyncio.create_task(gateway.stream_all(REPLIES)),
        ]
        try:
            async for frame in feed:
                if isinstance(frame, Subscribed):
                    print(f"subscriber: subscribed to '{frame.channel}'", flush=True)
                elif isinstance(frame, MessageFrame | Aborted):
                    received[frame.id] = frame.text
                    tag = "" if isinstance(frame, MessageFrame) else f" ({frame.reason})"
                    print(f"\n[{frame.channel} #{frame.offset}] {frame.id}{tag}:")
                    if frame.parts is not MISSING:
                        kinds = ", ".join(str(part["type"]) for part in frame.parts)
                        print(f"  parts: {kinds}")
                    print(f"  {frame.text}", flush=True)
                if not forever and expected.keys() <= received.keys():
                    break
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
    exact = all(received.get(mid) == text for mid, text in expected.items())
    print(f"\n{len(expected)} messages received, text exact: {exact}")
    return 0 if exact else 1


async def main_async(args: argparse.Namespace) -> int:
    """Optionally start a relay with the demo page, then run the demo against it."""
    if not args.serve:
        return await demo(args.url, args.channel, forever=args.forever)
    settings = Settings(host=args.host, port=args.port, web_root=str(WEB_ROOT))
    async with Relay(settings) as relay:
        assert relay.server is not None
        port = relay.server.sockets[0].getsockname()[1]
        print(
            f"relay listening on ws://{args.host}:{port} (producers /produce, "
            "subscribers /subscribe)"
        )
        print(f"open the chat demo: http://{args.host}:{port}/?channel={args.channel}", flush=True)
        return await demo(f"ws://{args.host}:{port}", args.channel, forever=not args.once)


def main() -> int:
    """Parse flags and run the demo."""
    parser = argparse.ArgumentParser(
        prog="python -m client_demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default="ws://127.0.0.1:8765", help="a running relay's URL")
    parser.add_argument("--channel", default="demo", help="the channel to stream into")
    parser.add_argument(
        "--serve", action="store_true", help="start a relay of our own, serving the chat demo page"
    )
    parser.add_argument("--host", default="127.0.0.1", help="with --serve: address to bind")
    parser.add_argument("--port", type=int, default=8765, help="with --serve: port (0: any)")
    parser.add_argument(
        "--once", action="store_true", help="with --serve: exit after the four replies"
    )
    parser.add_argument(
        "--forever",
        action="store_true",
        help="without --serve: keep answering prompts until Ctrl-C",
    )
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(main_async(args))
    return 0
