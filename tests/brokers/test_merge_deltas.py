"""The Redis writer's runs of deltas, step by step: a message's next delta joins its queued
write (text and order per message kept, the last seq kept), and nothing joins across another
kind of write or a write the writer has taken."""

from __future__ import annotations

from token_relay.brokers.redis.writes import (
    DeltaArgs,
    OpenArgs,
    Runs,
    Write,
    delta_write,
    make_whole,
    open_write,
    taken,
    terminal_write,
)
from token_relay.core.settings import Settings


def _target(message: str) -> tuple[str, str, str]:
    return ("c", "owner", message)


def _delta(runs: Runs, queue: list[Write], message: str, text: str, seq: int = 0) -> None:
    """What ``RedisBroker.delta`` does: join the run, or queue a write that opens one."""
    if runs.join(_target(message), text, seq):
        return
    write = delta_write(_target(message), text, seq, True, 60)
    queue.append(write)
    runs.opened(_target(message), write, text, seq)


def _other(runs: Runs, queue: list[Write], name: str) -> None:
    runs.close()
    queue.append(Write(name, [], ()))


def _texts(queue: list[Write]) -> list[tuple[str, str]]:
    """Each write taken: (its message's id, its text), or (its script, "")."""
    return [
        (write.args.message_id, write.args.text)
        if isinstance(write.args, (DeltaArgs, OpenArgs))
        else (write.script, "")
        for write in map(taken, queue)
    ]


def test_a_run_of_one_messages_deltas_is_one_write_with_its_last_seq() -> None:
    runs, queue = Runs(), []
    for text, seq in (("Hel", 1), ("lo", 2), (" 👋", 0)):
        _delta(runs, queue, "m", text, seq)
    assert len(queue) == 1
    (write,) = map(taken, queue)
    assert isinstance(write.args, DeltaArgs)
    assert write.args.text == "Hello 👋" and write.args.seq == 2
    assert write.keys == ["tr:seq:c", "tr:live:c", "tr:text:owner|m", "tr:d:c", "tr:own:c"]
    assert write.message == _target("m")


def test_interleaved_messages_each_keep_their_own_text_in_order() -> None:
    runs, queue = Runs(), []
    for message, text in (("a", "1"), ("b", "x"), ("a", "2"), ("b", "y"), ("a", "")):
        _delta(runs, queue, message, text)
    assert _texts(queue) == [("a", "12"), ("b", "xy")]


def test_no_delta_joins_across_another_write_or_a_taken_one() -> None:
    runs, queue = Runs(), []
    _delta(runs, queue, "m", "a")
    _other(runs, queue, "terminal")
    _delta(runs, queue, "m", "b")
    _delta(runs, queue, "m", "c")
    _other(runs, queue, "progress")
    _delta(runs, queue, "m", "d")
    runs.close()  # the writer took the queue
    _delta(runs, queue, "m", "e")
    assert _texts(queue) == [
        ("m", "a"),
        ("terminal", ""),
        ("m", "bc"),
        ("progress", ""),
        ("m", "d"),
        ("m", "e"),
    ]


def _open(runs: Runs, queue: list[Write], message: str, seq: int = 0) -> None:
    """What ``RedisBroker.open`` does: queue the claim (any run ends); it starts a run."""
    runs.close()
    write = open_write(_target(message), seq, 60)
    queue.append(write)
    runs.opened(_target(message), write, "", seq)


def test_a_messages_first_deltas_join_its_queued_open_into_one_script() -> None:
    runs, queue = Runs(), []
    _open(runs, queue, "m", seq=1)
    for text, seq in (("Hel", 1), ("lo", 2)):
        assert runs.join(_target("m"), text, seq)
    (write,) = map(taken, queue)
    assert write.script == "open" and write.claim == _target("m")
    assert write.message == _target("m")
    # The delta's arguments, then the member the open listed.
    assert write.args == OpenArgs("Hello", "m", 60, 7 * 24 * 3600, "owner", 2, "c", "owner|m")
    assert tuple(write.args) == ("Hello", "m", 60, 604800, "owner", 2, "c", "owner|m")


def test_an_open_joins_no_delta_after_another_write() -> None:
    runs, queue = Runs(), []
    _open(runs, queue, "m")
    _other(runs, queue, "meta")
    assert not runs.join(_target("m"), "late", 0)
    _open(runs, queue, "n")
    runs.close()  # the writer took the queue
    assert not runs.join(_target("n"), "late", 0)
    assert [write.script for write in queue] == ["open", "meta", "open"]


def test_a_final_joined_to_its_queued_open_sends_terminals_arguments_then_the_text() -> None:
    runs, queue = Runs(), []
    _open(runs, queue, "m", seq=1)
    assert runs.join(_target("m"), "Hel", 2) and runs.join(_target("m"), "lo", 3)
    opening = runs.completes(_target("m"), queue[-1])
    assert opening is queue[0]
    final = terminal_write(Settings(), False, _target("m"), "{}", None, seq=4)
    make_whole(opening, final, _target("m"))
    (write,) = map(taken, queue)
    assert write.script == "whole" and write.terminal == _target("m")
    assert write.keys == [*final.keys, "tr:d:c"]
    assert write.args == (*final.args, "Hello")
