"""What an operator sees of a relay process: its log on shutdown, ``--help``, a closed pipe
and the page's URL."""

from __future__ import annotations

import pytest
from token_relay.testing import RedisServer, relay_process
from websockets.exceptions import ConnectionClosed

from ..conftest import connect, recv_core, send_json


@pytest.mark.parametrize(
    ("broker", "says", "code", "frames"),
    [
        (
            "memory",
            "stopping: aborting messages in progress (reason shutdown), closing connections "
            "with 1001",
            1001,
            [{"type": "aborted", "channel": "c", "id": "m", "text": "half", "reason": "shutdown"}],
        ),
        (
            "redis",
            "stopping: handing producers off (their sessions wait in the broker for "
            "--session-grace, to resume on another process), closing connections with 1012",
            1012,
            [],
        ),
    ],
)
async def test_sigterm_logs_what_the_relay_does_with_messages_in_progress(
    broker: str,
    says: str,
    code: int,
    frames: list[dict[str, object]],
    tmp_path: object,
    request: pytest.FixtureRequest,
) -> None:
    args: tuple[str, ...] = ()
    if broker == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        args = ("--broker", redis.url)
    relay = await relay_process(*args).start()
    try:
        async with (
            connect(f"{relay.url}/subscribe?channel=c&deltas=1") as sub,
            connect(f"{relay.url}/produce?channel=c") as producer,
        ):
            assert await recv_core(sub) == {"type": "subscribed", "channel": "c"}
            await recv_core(producer)  # the session frame
            await send_json(producer, {"id": "m", "delta": "half"})
            assert (await recv_core(sub))["delta"] == "half"
            assert await relay.terminate() == 0
            seen = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    seen.append(await recv_core(sub))
            assert closed.value.rcvd is not None and closed.value.rcvd.code == code
            assert seen == frames
        stopping = [line for line in relay.log.splitlines() if "stopping" in line]
        assert len(stopping) == 1 and stopping[0].endswith(says), relay.log
        assert "Traceback" not in relay.log
    finally:
        await relay.stop()
