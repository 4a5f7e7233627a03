"""Redis commands packed by hiredis are the bytes redis-py's own packer makes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from token_relay.brokers import open_broker
from token_relay.brokers.redis import PACKING, RedisBroker, packing
from token_relay.core.settings import Settings

from ..harness import RedisServer
from .test_contract import Recorder, message_body

ARGUMENTS = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",))),  # any text that encodes to UTF-8
    st.binary(),
    st.integers(min_value=-(2**70), max_value=2**70),
)


NAMES = st.one_of(
    st.sampled_from(["EVALSHA", "PUBLISH", "XADD", "PING", "GET"]),
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1),
)


@given(NAMES, st.lists(ARGUMENTS))
def test_commands_pack_to_the_bytes_redis_py_makes(name: str, args: list[Any]) -> None:
    assert packing.hiredis_pack is not None, "hiredis comes with the [redis] extra"
    ours, theirs = PACKING[Connection](), Connection()
    assert b"".join(ours.pack_command(name, *args)) == b"".join(theirs.pack_command(name, *args))
    assert ours.pack_commands([(name, *args)] * 2) == theirs.pack_commands([(name, *args)] * 2)


@given(st.lists(st.lists(ARGUMENTS), max_size=5))
def test_the_writers_scripts_pack_together_to_the_bytes_redis_py_makes(
    batch: list[list[Any]],
) -> None:
    commands = [("EVALSHA", "f" * 40, len(args), *args) for args in batch]
    theirs = Connection()
    expected = b"".join(b"".join(theirs.pack_command(*command)) for command in commands)
    assert packing.packed_together(commands) == [expected]


@pytest.mark.parametrize("odd", [1.5, 1e16, True, None])
def test_a_script_with_another_argument_is_packed_by_redis_py(odd: Any) -> None:
    commands = [("EVALSHA", "f" * 40, 1, "k"), ("EVALSHA", "f" * 40, 1, odd)]
    assert packing.packed_together(commands) is None


@pytest.mark.parametrize(
    "command",
    [
        ("CLIENT SETINFO", "LIB-NAME", "redis-py"),  # a name of two words: split, as redis-py does
        ("PING\r",),
        ("SET", "k", 1.5),  # a float: formatted as redis-py formats it
        ("SET", "k", 1e16),
    ],
)
def test_commands_hiredis_would_pack_differently_go_to_redis_py(command: tuple[Any, ...]) -> None:
    assert packing.packed(command) is None
    ours, theirs = PACKING[Connection](), Connection()
    assert ours.pack_command(*command) == theirs.pack_command(*command)


def test_a_bool_is_refused_as_redis_py_refuses_it() -> None:
    with pytest.raises(Exception) as ours:
        PACKING[Connection]().pack_command("SET", "k", True)
    with pytest.raises(Exception) as theirs:
        Connection().pack_command("SET", "k", True)
    assert type(ours.value) is type(theirs.value)


def test_every_connection_kind_packs_with_hiredis() -> None:
    for kind in (Connection, SSLConnection, UnixDomainSocketConnection):
        assert issubclass(PACKING[kind], kind)
        assert PACKING[kind].pack_command is not kind.pack_command


async def test_the_broker_talks_to_redis_through_the_packing_connections(
    redis_server: RedisServer,
) -> None:
    broker = open_broker(Settings(broker=redis_server.url), "packing")
    await broker.start(Recorder())
    try:
        assert isinstance(broker, RedisBroker)
        pool = broker._connections.pool
        assert pool is not None and pool.connection_class is PACKING[Connection]
        # The round trip works: a completed message is numbered and published.
        frame = json.loads(await broker.terminal("c", "owner", "m", message_body("c", "m", "tëxt")))
        assert (frame["id"], frame["text"], frame["offset"]) == ("m", "tëxt", 1)
    finally:
        await broker.close()
