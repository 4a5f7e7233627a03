"""``python -m client_demo``: a gateway streams three replies; a subscriber prints them.

Against a running relay: ``python -m client_demo --url ws://127.0.0.1:8765``.
With ``--serve`` it first starts a relay of its own on a free port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from contextlib import AsyncExitStack

from websockets.asyncio.client import connect

from server import Relay, Settings

from .gateway import REPLIES, stream_replies


async def demo(url: str, channel: str) -> int:
    """Run the gateway and one subscriber; return 0 if every reply arrived exactly."""
    expected = {reply.message_id: reply.text for reply in REPLIES}
    async with (
        connect(f"{url}/subscribe?channel={channel}") as subscriber,
        connect(f"{url}/produce?channel={channel}") as producer,
    ):
        confirmation = json.loads(await subscriber.recv())
        print(f"subscriber: {confirmation}")
        gateway = asyncio.create_task(stream_replies(producer))
        received: dict[str, str] = {}
        while len(received) < len(expected):
            frame = json.loads(await subscriber.recv())
            if frame["type"] == "message":
                received[frame["id"]] = frame["text"]
                print(f"\n[{frame['channel']}] {frame['id']}:\n  {frame['text']}")
        await gateway
    exact = received == expected
    print(f"\n{len(received)} messages received, text exact: {exact}")
    return 0 if exact else 1


async def main_async(args: argparse.Namespace) -> int:
    """Optionally start a relay, then run the demo against it."""
    async with AsyncExitStack() as stack:
        url = args.url
        if args.serve:
            server = await stack.enter_async_context(await Relay(Settings(port=0)).start())
            port = server.sockets[0].getsockname()[1]
            url = f"ws://127.0.0.1:{port}"
            print(f"relay started at {url}")
        return await demo(url, args.channel)
    return 1


def main() -> int:
    """Parse flags and run the demo."""
    parser = argparse.ArgumentParser(prog="python -m client_demo", description=__doc__)
    parser.add_argument("--url", default="ws://127.0.0.1:8765", help="the relay's base URL")
    parser.add_argument("--channel", default="demo", help="the channel to stream into")
    parser.add_argument("--serve", action="store_true", help="start a relay of our own first")
    return asyncio.run(main_async(parser.parse_args()))


sys.exit(main())
