"""Whether a subscription state knows, without asking anyone, that there is no subscription
(``surely_none``): each append asks it before it looks for the subscriptions it concerns,
so it must never say so when :meth:`any` would find one, or would look."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from token_relay.brokers.redis.durablesubs import RECHECK, SUBS, RedisSubscriptions
from token_relay.edge.durablehooks import LocalSubscriptions


class _Store:
    """A Redis store's part the state reads: its ``subscribed`` flag and ``HLEN``."""

    def __init__(self, subscriptions: int) -> None:
        self.subscribed = False
        self.subscriptions = subscriptions
        self.commands: list[tuple[Any, ...]] = []

    async def command(self, *command: Any) -> Any:
        self.commands.append(command)
        assert command == ("HLEN", SUBS)
        return self.subscriptions


@given(
    st.lists(
        st.tuples(st.floats(min_value=0, max_value=3 * RECHECK), st.integers(0, 2), st.booleans()),
        max_size=12,
    )
)
async def test_a_redis_state_is_surely_empty_only_when_any_would_say_so_without_redis(
    steps: list[tuple[float, int, bool]],
) -> None:
    now = [100.0]
    store = _Store(0)
    state = RedisSubscriptions(store, 10, "/v1/stream/", clock=lambda: now[0])  # type: ignore[arg-type]
    for advance, subscriptions, written in steps:
        now[0] += advance
        store.subscriptions = subscriptions
        if written:
            store.subscribed = subscriptions > 0  # this process's own write
        asked = len(store.commands)
        if state.surely_none():
            assert not await state.any()
            assert len(store.commands) == asked
        else:
            await state.any()


async def test_a_local_state_is_surely_empty_until_a_subscription_is_made() -> None:
    state = LocalSubscriptions(lambda path: None, list)
    assert state.surely_none() and not await state.any()
    async with state.hold() as held:
        held.core.subscriptions["s"] = object()  # type: ignore[assignment]
    assert not state.surely_none() and await state.any()
