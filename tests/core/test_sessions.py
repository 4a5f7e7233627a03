"""Tests for token_relay.core.sessions: attach, park, resume, expire and evict, step by step."""

from __future__ import annotations

import pytest
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.grants import OPEN, Grant, Role
from token_relay.core.protocol import ProducerEvent
from token_relay.core.sessions import MAX_PARKED_CANCELS, MAX_REQUESTS_PER_NAME, SessionTable
from token_relay.core.streams import Phase, Unfinished


def _table(grace: float = 30.0, max_parked: int = 10) -> SessionTable[str]:
    return SessionTable(
        "inst",
        grace=grace,
        max_parked=max_parked,
        max_streaming=10,
        max_completed=10,
        max_chars=100,
        rate=1000.0,
    )


def test_a_new_connection_gets_a_new_session_with_an_unguessable_token() -> None:
    table = _table()
    first, resumed, displaced = table.attach("conn1", OPEN, None, 0.0)
    second, _, _ = table.attach("conn2", OPEN, "no-such-token", 0.0)
    assert (resumed, displaced) == (False, None)
    assert first.owner == "inst.1" and second.owner == "inst.2"
    assert len(first.token) >= 32 and first.token != second.token
    assert len(table) == 2


def test_a_vanished_connection_parks_and_a_reconnect_in_time_resumes() -> None:
    table = _table(grace=5.0)
    session, _, _ = table.attach("conn1", OPEN, None, 0.0)
    session.streams.receive(ProducerEvent(id="m", delta="hal", channel="c"), 0.0)
    assert table.detach(session, "conn1", vanished=True, now=1.0) == []
    assert session.parked_until == 6.0 and table.next_expiry() == 6.0
    assert table.expire(5.9) == []
    again, resumed, displaced = table.attach("conn2", OPEN, session.token, 5.9)
    assert (again, resumed, displaced) == (session, True, None)
    assert again.connection == "conn2" and session.parked_until is None
    assert table.expire(100.0) == []
    assert again.streams.partial("m") == "hal"


def test_the_grace_runs_out_and_the_session_ends_with_its_unfinished_messages() -> None:
    table = _table(grace=5.0)
    session, _, _ = table.attach("conn1", OPEN, None, 0.0)
    session.streams.receive(ProducerEvent(id="m", delta="half", channel="c"), 0.0)
    table.detach(session, "conn1", vanished=True, now=1.0)
    assert table.expire(6.0) == [session]
    assert session.end() == [Unfinished("c", "m", "half")]
    # Gone: its token opens a new session now.
    fresh, resumed, _ = table.attach("conn2", OPEN, session.token, 7.0)
    assert not resumed and fresh is not session and len(table) == 1


def test_a_clean_close_or_no_grace_ends_the_session_at_once() -> None:
    table = _table()
    session, _, _ = table.attach("conn1", OPEN, None, 0.0)
    assert table.detach(session, "conn1", vanished=False, now=1.0) == [session]
    graceless = _table(grace=0)
    other, _, _ = graceless.attach("conn1", OPEN, None, 0.0)
    assert graceless.detach(other, "conn1", vanished=True, now=1.0) == [other]
    assert len(table) == len(graceless) == 0


def test_resuming_a_live_session_displaces_its_old_connection() -> None:
    table = _table()
    session, _, _ = table.attach("half-open", OPEN, None, 0.0)
    again, resumed, displaced = table.attach("new", OPEN, session.token, 1.0)
    assert (again, resumed, displaced) == (session, True, "half-open")
    # The displaced connection's end changes nothing: another one holds the session.
    assert table.detach(session, "half-open", vanished=True, now=2.0) == []
    assert session.connection == "new" and not table.parked


def test_a_session_resumes_only_for_the_grant_that_opened_it() -> None:
    table = _table()
    alice = Grant(Role.PRODUCE, ("chat-a",))
    session, _, _ = table.attach("conn1", alice, None, 0.0)
    table.detach(session, "conn1", vanished=True, now=1.0)
    other, resumed, _ = table.attach("conn2", Grant(Role.PRODUCE, ("*",)), session.token, 2.0)
    assert not resumed and other is not session
    mine, resumed, _ = table.attach("conn3", alice, session.token, 2.0)
    assert resumed and mine is session


def test_parking_past_the_limit_ends_the_oldest_parked_session() -> None:
    table = _table(max_parked=2)
    sessions = [table.attach(f"conn{n}", OPEN, None, 0.0)[0] for n in range(3)]
    assert table.detach(sessions[0], "conn0", vanished=True, now=1.0) == []
    assert table.detach(sessions[1], "conn1", vanished=True, now=2.0) == []
    assert table.detach(sessions[2], "conn2", vanished=True, now=3.0) == [sessions[0]]
    assert list(table.parked.values()) == sessions[1:]
    assert table.next_expiry() == 32.0


def test_end_all_ends_live_and_parked_sessions() -> None:
    table = _table()
    live, _, _ = table.attach("conn1", OPEN, None, 0.0)
    parked, _, _ = table.attach("conn2", OPEN, None, 0.0)
    table.detach(parked, "conn2", vanished=True, now=1.0)
    assert set(map(id, table.end_all())) == {id(live), id(parked)}
    assert len(table) == 0 and not table.parked and table.next_expiry() is None


def test_cancels_kept_for_a_parked_session_are_bounded() -> None:
    table = _table()
    session, _, _ = table.attach("conn1", OPEN, None, 0.0)
    for n in range(MAX_PARKED_CANCELS + 5):
        session.cancels.append(f"cancel {n}")
    assert len(session.cancels) == MAX_PARKED_CANCELS
    assert session.cancels[0] == "cancel 5"


def _parked_with(table: SessionTable[str], name: str, address: str, text: str) -> None:
    session, _, _ = table.attach(name, OPEN, None, 0.0)
    session.address = address
    session.streams.receive(ProducerEvent(id="m", delta=text, channel="c"), 0.0)
    table.detach(session, name, vanished=True, now=1.0)


def test_parked_sessions_are_bounded_by_the_text_they_hold() -> None:
    table = SessionTable(
        "inst", grace=30.0, max_parked=100, max_streaming=10, max_completed=10,
        max_chars=100, rate=1000.0, max_parked_chars=25,
    )  # fmt: skip
    for n in range(5):
        _parked_with(table, f"conn{n}", f"10.0.0.{n}", "x" * 10)
    # 50 characters parked against a bound of 25: the oldest ended until it fit.
    assert table.parked_chars == 20 and len(table.parked) == 2
    assert [s.address for s in table.parked.values()] == ["10.0.0.3", "10.0.0.4"]


def test_parked_sessions_are_bounded_per_address() -> None:
    table = SessionTable(
        "inst", grace=30.0, max_parked=100, max_streaming=10, max_completed=10,
        max_chars=100, rate=1000.0, max_parked_per_address=2,
    )  # fmt: skip
    for n in range(6):
        _parked_with(table, f"conn{n}", "6.6.6.6", "a")
    _parked_with(table, "other", "7.7.7.7", "b")
    addresses = [s.address for s in table.parked.values()]
    assert addresses.count("6.6.6.6") == 2 and addresses.count("7.7.7.7") == 1
    assert table.parked_chars == 3
    # Resuming one unparks it and frees its share.
    session = next(iter(table.parked.values()))
    table.attach("back", OPEN, session.token, 2.0)
    assert table.parked_chars == 2 and len(table.parked) == 2


# ------------------------------------------------------------------ named producers


def _named_table(per_address: int = 3, max_parked: int = 10) -> SessionTable[str]:
    return SessionTable(
        "inst",
        grace=30.0,
        max_parked=max_parked,
        max_streaming=10,
        max_completed=10,
        max_chars=100,
        rate=1000.0,
        max_parked_per_address=1,
        max_named_per_address=per_address,
    )


def test_named_producers_are_never_ended_to_make_room_and_past_the_limit_are_refused() -> None:
    table = _named_table(per_address=3)
    named = []
    for n in range(3):
        session, resumed, _ = table.attach(f"r{n}", OPEN, f"name-{n}", 0.0, named=True, address="a")
        session.streams.receive(ProducerEvent(id="m", delta="x", channel="c"), 0.0)
        named.append(session)
        assert not resumed and session.token == f"name-{n}"
    # Each waits between its requests: past --max-parked-per-ip (1), none is ended.
    for n, session in enumerate(named):
        assert table.detach(session, f"r{n}", vanished=True, now=1.0) == []
    # Their text counts toward the memory in use, not toward --max-parked-chars.
    assert (table.text_chars(), table.parked_chars) == (3, 0)
    # A plain session parked from the same address still ends past its own limit.
    plain, _, _ = table.attach("ws1", OPEN, None, 1.0, address="a")
    plain.address = "a"
    plain2, _, _ = table.attach("ws2", OPEN, None, 1.0)
    plain2.address = "a"
    assert table.detach(plain, "ws1", vanished=True, now=2.0) == []
    assert table.detach(plain2, "ws2", vanished=True, now=2.0) == [plain]
    # One more name from that address is refused, and nothing changed; another address may.
    with pytest.raises(FrameRejected) as refused:
        table.attach("r3", OPEN, "name-3", 2.0, named=True, address="a")
    assert refused.value.code is ErrorCode.TOO_MANY_PRODUCERS
    assert "name-3" not in table.by_token and table.named_count == 3
    assert table.attach("r3", OPEN, "name-3", 2.0, named=True, address="b")[0].named
    # A known name resumes (it is no new one), and its message went on.
    again, resumed, _ = table.attach("r4", OPEN, "name-0", 3.0, named=True, address="a")
    assert (again, resumed, again.streams.partial("m")) == (named[0], True, "x")
    # Once one ends, the address may open a new name.
    assert table.expire(40.0) == [*named[1:], plain2]
    assert table.attach("r5", OPEN, "name-5", 40.0, named=True, address="a")[0].named
    assert table.named_count == 3


def test_named_producers_are_bounded_in_all_by_max_parked() -> None:
    table = _named_table(per_address=100, max_parked=2)
    table.attach("r0", OPEN, "n0", 0.0, named=True, address="a")
    table.attach("r1", OPEN, "n1", 0.0, named=True, address="b")
    with pytest.raises(FrameRejected) as refused:
        table.attach("r2", OPEN, "n2", 0.0, named=True, address="c")
    assert refused.value.code is ErrorCode.TOO_MANY_PRODUCERS


def test_requests_of_one_named_producer_attach_at_once_and_the_last_one_parks_it() -> None:
    table = _named_table()
    session, _, _ = table.attach("r1", OPEN, "gw", 0.0, named=True, address="a")
    joined, resumed, displaced = table.attach("r2", OPEN, "gw", 0.0, named=True, address="a")
    assert (joined, resumed, displaced) == (session, True, None)
    assert session.serves("r1") and session.serves("r2") and not session.serves("r3")
    assert session.connections() == ["r1", "r2"]
    # Either may end first; the session stays attached to the other.
    assert table.detach(session, "r1", vanished=True, now=1.0) == []
    assert (session.connection, session.parked_until) == ("r2", None)
    table.attach("r3", OPEN, "gw", 1.0, named=True, address="a")
    assert table.detach(session, "r3", vanished=True, now=2.0) == []
    assert session.connections() == ["r2"]
    assert table.detach(session, "r2", vanished=True, now=3.0) == []
    assert session.connection is None and session.parked_until == 33.0
    # A WebSocket resuming a session still takes it over (a half-open old connection).
    ws, _, _ = table.attach("ws", OPEN, None, 0.0)
    assert table.attach("ws2", OPEN, ws.token, 0.0)[2] == "ws"


def test_one_named_producer_has_at_most_so_many_requests_at_once() -> None:
    table = _named_table()
    session, _, _ = table.attach("r0", OPEN, "gw", 0.0, named=True, address="a")
    for n in range(1, MAX_REQUESTS_PER_NAME):
        table.attach(f"r{n}", OPEN, "gw", 0.0, named=True, address="a")
    with pytest.raises(FrameRejected) as refused:
        table.attach("one-more", OPEN, "gw", 0.0, named=True, address="a")
    assert refused.value.code is ErrorCode.PRODUCER_BUSY
    assert len(session.connections()) == MAX_REQUESTS_PER_NAME


def _structured_events() -> list[ProducerEvent]:
    return [
        ProducerEvent(id="m", delta="Hi ", channel="c"),
        ProducerEvent(id="m", chunk={"type": "reasoning-start", "id": "r"}, channel="c"),
        ProducerEvent(
            id="m", chunk={"type": "reasoning-delta", "id": "r", "delta": "hmm"}, channel="c"
        ),
        ProducerEvent(id="m", delta="there \ud83d", channel="c"),
    ]


def _entry(event: ProducerEvent) -> dict[str, object] | str:
    return event.chunk if isinstance(event.chunk, dict) else str(event.delta)


def test_an_adopted_structured_message_replays_its_log_into_the_same_parts() -> None:
    from token_relay.core.sessions import SessionState

    events = _structured_events()
    rest = [
        ProducerEvent(id="m", delta="\ude00", channel="c"),
        ProducerEvent(id="m", chunk={"type": "reasoning-end", "id": "r"}, channel="c", final=True),
    ]
    here = _table().attach("conn", OPEN, None, 0.0)[0]
    for event in events + rest:
        here.streams.receive(event, 0.0)
    # What a shared broker kept: the text before the first chunk, and the log after it.
    log = (True, [_entry(event) for event in events[1:]])
    state = SessionState("old", "other", [("m", "c", 0, "Hi ")], [], {}, {"m": log})
    moved = _table().adopt("conn2", OPEN, "token", "inst.9", state, 0.0)
    assert moved.streams.partial("m") is None  # structured: no text to hand out
    for event in rest:
        moved.streams.receive(event, 0.0)
    assert moved.streams.completed("m") == here.streams.completed("m")
    assert moved.streams.completed("m") == (
        "Hi there 😀",
        [
            {"type": "text", "text": "Hi there 😀", "state": "done"},
            {"type": "reasoning", "id": "r", "text": "hmm", "state": "done"},
        ],
    )


def test_an_adopted_structured_message_whose_log_was_cut_is_aborted() -> None:
    from token_relay.core.sessions import SessionState

    state = SessionState("old", "other", [("m", "c", 0, "Hi ")], [], {}, {"m": None})
    moved = _table().adopt("conn2", OPEN, "token", "inst.9", state, 0.0)
    assert moved.streams.phase("m") is Phase.ABORTED
    with pytest.raises(FrameRejected) as refused:
        moved.streams.receive(ProducerEvent(id="m", delta="more", channel="c"), 0.0)
    assert refused.value.code is ErrorCode.MESSAGE_ABORTED
