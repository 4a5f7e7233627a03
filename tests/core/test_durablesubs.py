"""Tests for token_relay.core.durablesubs: subscriptions, their wakes, fencing and leases,
played step by step with exact values."""

from __future__ import annotations

import itertools
import json

import pytest
from token_relay.core.durable import offset_text
from token_relay.core.durablesubconfig import MAX_EXPLICIT_CHARS, SubscriptionConfig, config_of
from token_relay.core.durablesubs import Subscriptions, Wake, dump, load
from token_relay.core.errors import SubscriptionError

HOOK = "https://worker.example/hooks"


class Streams:
    """Tails by path, as the store would say them."""

    def __init__(self, **tails: int) -> None:
        self.tails = {path.replace("__", "/"): tail for path, tail in tails.items()}

    def __call__(self, path: str) -> int | None:
        return self.tails.get(path)


def _subscriptions() -> Subscriptions:
    counter = itertools.count(1)
    return Subscriptions(key=b"k" * 32, new_id=lambda: str(next(counter)), limit=3)


def _config(**fields: object) -> SubscriptionConfig:
    body: dict[str, object] = {"type": "webhook", "pattern": "events/*", "webhook": {"url": HOOK}}
    body.update(fields)
    return config_of(json.dumps(body).encode())


def _refusal(call: object, *args: object) -> SubscriptionError:
    with pytest.raises(SubscriptionError) as caught:
        call(*args)  # type: ignore[operator]
    return caught.value


def test_the_same_configuration_reconfirms_and_another_conflicts() -> None:
    subscriptions = _subscriptions()
    tails = Streams(events__a=3, other__b=1)
    made, created = subscriptions.put("s", _config(streams=["x", "y"]), 0.0, ["events/a"], tails)
    assert created and made.links["events/a"].acked == 3
    again, created = subscriptions.put("s", _config(streams=["y", "x", "y"]), 1.0, [], tails)
    assert (again is made, created) == (True, False)
    conflict = _refusal(subscriptions.put, "s", _config(description="d"), 1.0, [], tails)
    assert (conflict.status, conflict.code) == (409, "CONFLICT")


def test_subscriptions_are_bounded() -> None:
    subscriptions = _subscriptions()
    for name in "abc":
        subscriptions.put(name, _config(), 0.0, [], Streams())
    refused = _refusal(subscriptions.put, "d", _config(), 0.0, [], Streams())
    assert (refused.status, refused.code) == (507, "TOO_MANY_SUBSCRIPTIONS")


def test_an_append_wakes_an_idle_subscription_once() -> None:
    subscriptions = _subscriptions()
    tails = Streams()
    subscriptions.put("s", _config(lease_ttl_ms=1000), 0.0, [], tails)
    tails.tails["events/a"] = 2
    (wake,) = subscriptions.appended("events/a", 0, 10.0, tails)
    assert (wake.subscription_id, wake.wake_id, wake.generation, wake.url) == ("s", "w_1", 1, HOOK)
    assert wake.streams == (
        {
            "path": "events/a",
            "link_type": "glob",
            "acked_offset": offset_text(0),
            "tail_offset": offset_text(2),
            "has_pending": True,
        },
    )
    tails.tails["events/a"] = 3
    assert subscriptions.appended("events/a", 2, 10.5, tails) == []  # a wake is in flight
    assert subscriptions.appended("other/b", 0, 10.5, tails) == []  # not linked


def test_done_acks_the_snapshot_and_wakes_again_for_what_came_after() -> None:
    subscriptions = _subscriptions()
    tails = Streams(events__a=2)
    subscriptions.put("s", _config(), 0.0, [], tails)
    (wake,) = subscriptions.appended("events/a", 0, 1.0, tails)
    tails.tails["events/a"] = 5  # after the snapshot
    following = subscriptions.delivered(wake, True, 2.0, tails)
    assert subscriptions.get("s").links["events/a"].acked == 2
    assert following is not None and following.generation == 2
    assert following.streams[0]["acked_offset"] == offset_text(2)
    assert subscriptions.delivered(following, True, 3.0, tails) is None
    assert subscriptions.get("s").current is None


def _callback(wake: Wake, done: bool = True, offset: int = 2) -> dict[str, object]:
    return {
        "wake_id": wake.wake_id,
        "generation": wake.generation,
        "acks": [{"stream": "events/a", "offset": offset_text(offset)}],
        "done": done,
    }


def test_a_callback_acks_and_a_stale_one_is_fenced() -> None:
    subscriptions = _subscriptions()
    tails = Streams(events__a=2)
    subscriptions.put("s", _config(), 0.0, [], tails)
    (wake,) = subscriptions.appended("events/a", 0, 1.0, tails)
    assert subscriptions.delivered(wake, False, 1.5, tails) is None  # answered, not done
    assert subscriptions.ack("s", wake.token, _callback(wake, done=False), 2.0, tails) == (
        False,
        None,
    )
    assert subscriptions.ack("s", wake.token, _callback(wake), 3.0, tails) == (False, None)
    stale = _refusal(subscriptions.ack, "s", wake.token, _callback(wake), 4.0, tails)
    assert (stale.status, stale.code) == (409, "FENCED")
    assert subscriptions.get("s").links["events/a"].acked == 2


def test_a_wake_must_be_named_by_its_own_token_id_and_generation() -> None:
    subscriptions = _subscriptions()
    tails = Streams(events__a=2)
    subscriptions.put("s", _config(), 0.0, [], tails)
    (wake,) = subscriptions.appended("events/a", 0, 1.0, tails)
    forged = wake.token[:-2] + ("AA" if not wake.token.endswith("AA") else "BB")
    assert _refusal(subscriptions.ack, "s", forged, _callback(wake), 2.0, tails).status == 401
    assert _refusal(subscriptions.ack, "s", "", _callback(wake), 2.0, tails).status == 401
    wrong_id = {**_callback(wake), "wake_id": "w_other"}
    assert _refusal(subscriptions.ack, "s", wake.token, wrong_id, 2.0, tails).code == "FENCED"
    wrong_generation = {**_callback(wake), "generation": 7}
    refused = _refusal(subscriptions.ack, "s", wake.token, wrong_generation, 2.0, tails)
    assert refused.code == "FENCED"
    assert subscriptions.get("s").links["events/a"].acked == 0


def test_a_webhook_lease_that_runs_out_wakes_again() -> None:
    subscriptions = _subscriptions()
    tails = Streams(events__a=2)
    subscriptions.put("s", _config(lease_ttl_ms=1000), 0.0, [], tails)
    (wake,) = subscriptions.appended("events/a", 0, 10.0, tails)
    assert subscriptions.due(10.9, tails) == []
    (again,) = subscriptions.due(11.0, tails)
    assert (again.generation, again.wake_id) == (2, "w_2")
    assert _refusal(subscriptions.ack, "s", wake.token, _callback(wake), 11.0, tails).code == (
        "FENCED"
    )


def test_a_failed_webhook_is_retried_with_the_same_wake() -> None:
    subscriptions = _subscriptions()
    tails = Streams(events__a=2)
    subscriptions.put("s", _config(lease_ttl_ms=1000), 0.0, [], tails)
    (wake,) = subscriptions.appended("events/a", 0, 10.0, tails)
    subscriptions.delivered(wake, False, 10.1, tails, failed=True)
    subscriptions.retry("s", 15.0)
    assert subscriptions.get("s").failed
    assert subscriptions.due(14.0, tails) == []  # the lease waits for the retry
    assert subscriptions.due(15.0, tails) == [wake]
    subscriptions.delivered(wake, True, 15.1, tails)
    assert not subscriptions.get("s").failed
    assert subscriptions.get("s").links["events/a"].acked == 2


def _pull(**fields: object) -> SubscriptionConfig:
    body = {"type": "pull-wake", "pattern": "**", "wake_stream": "wake/pool", "lease_ttl_ms": 1000}
    body.update(fields)
    return config_of(json.dumps(body).encode())


def test_a_pull_wake_is_claimed_by_one_worker_then_acked() -> None:
    subscriptions = _subscriptions()
    tails = Streams(wake__pool=0)
    subscriptions.put("p", _pull(), 0.0, ["wake/pool"], tails)
    assert "wake/pool" not in subscriptions.get("p").links  # never its own wake stream
    tails.tails["events/a"] = 1
    (wake,) = subscriptions.appended("events/a", 0, 1.0, tails)
    assert (wake.wake_stream, wake.pending, wake.url) == ("wake/pool", ("events/a",), None)
    tails.tails["wake/pool"] = 1
    assert subscriptions.appended("wake/pool", 0, 1.0, tails) == []
    assert subscriptions.due(100.0, tails) == []  # no lease before a claim
    claimed = subscriptions.claim("p", "worker-1", 100.0, tails)
    assert claimed is wake
    busy = _refusal(subscriptions.claim, "p", "worker-2", 100.5, Streams())
    assert (busy.status, busy.code, busy.details) == (
        409,
        "ALREADY_CLAIMED",
        {"current_holder": "worker-1", "generation": 1},
    )
    done = _callback(wake, offset=1)
    assert subscriptions.ack("p", wake.token, done, 100.6, tails) == (False, None)
    nothing = _refusal(subscriptions.claim, "p", "worker-2", 101.0, tails)
    assert (nothing.status, nothing.code) == (404, "NO_PENDING_WORK")


def test_a_released_pull_wake_wakes_again_and_a_claim_lease_runs_out() -> None:
    subscriptions = _subscriptions()
    tails = Streams(events__a=1)
    subscriptions.put("p", _pull(), 0.0, [], tails)
    (wake,) = subscriptions.appended("events/a", 0, 1.0, tails)
    subscriptions.claim("p", "worker-1", 2.0, tails)
    again = subscriptions.release("p", wake.token, _callback(wake), 2.5, tails)
    assert again is not None and again.generation == 2
    subscriptions.claim("p", "worker-2", 3.0, tails)
    (after_lease,) = subscriptions.due(4.0, tails)
    assert after_lease.generation == 3
    assert subscriptions.get("p").current is not None
    assert subscriptions.get("p").current.holder is None  # type: ignore[union-attr]


def test_explicit_links_add_and_remove_beside_glob_links() -> None:
    subscriptions = _subscriptions()
    tails = Streams(events__a=4, manual__b=2)
    subscriptions.put("s", _config(streams=["manual/a"]), 0.0, ["events/a"], tails)
    subscriptions.add_streams("s", ["manual/b", "events/a"], tails)
    links = subscriptions.get("s").links
    assert {path: (link.kind, link.acked) for path, link in links.items()} == {
        "events/a": ("explicit", 4),
        "manual/a": ("explicit", 0),
        "manual/b": ("explicit", 2),
    }
    subscriptions.remove_stream("s", "events/a")  # its glob link stays
    subscriptions.remove_stream("s", "manual/b")
    subscriptions.remove_stream("s", "never/linked")
    assert {path: link.kind for path, link in links.items()} == {
        "events/a": "glob",
        "manual/a": "explicit",
    }
    subscriptions.deleted("events/a")
    assert list(links) == ["manual/a"]
    subscriptions.delete("s")
    assert _refusal(subscriptions.get, "s").code == "NOT_FOUND"


def test_an_explicit_link_that_a_pattern_also_matches_stays_when_unlinked() -> None:
    subscriptions = _subscriptions()
    tails = Streams()
    subscriptions.put("s", _config(streams=["events/a"]), 0.0, [], tails)
    tails.tails["events/a"] = 1
    subscriptions.appended("events/a", 0, 1.0, tails)
    subscriptions.remove_stream("s", "events/a")
    assert subscriptions.get("s").links["events/a"].kind == "glob"


def test_a_stream_made_again_at_an_explicit_path_is_read_from_its_start() -> None:
    subscriptions = _subscriptions()
    tails = Streams(manual__a=9)
    subscriptions.put("s", _config(pattern=None, streams=["manual/a"]), 0.0, [], tails)
    subscriptions.deleted("manual/a")
    tails.tails["manual/a"] = 2  # a new stream, shorter than the old one
    (wake,) = subscriptions.appended("manual/a", 0, 1.0, tails)
    assert wake.streams[0]["acked_offset"] == offset_text(0)


def test_adding_too_many_explicit_streams_adds_none() -> None:
    subscriptions = _subscriptions()
    subscriptions.put("s", _config(streams=["x"]), 0.0, [], Streams())
    many = [f"m/{n}" for n in range(1000)]
    refused = _refusal(subscriptions.add_streams, "s", many, Streams())
    assert (refused.status, refused.code) == (400, "INVALID_REQUEST")
    assert list(subscriptions.get("s").links) == ["x"]


def test_links_to_streams_gone_unannounced_go_before_a_new_glob_link() -> None:
    """A stream that expired at a lookup (or that Redis forgot) is gone with no call to
    ``deleted``: its links go, as ``deleted`` would take them, when the pattern next links a
    new stream, so stream after stream made and let expire holds one link, not one each."""
    subscriptions = _subscriptions()
    tails = Streams(manual__a=4)
    subscriptions.put("s", _config(streams=["manual/a"]), 0.0, [], tails)
    links = subscriptions.get("s").links
    for n in range(1000):
        tails.tails[f"events/{n}"] = 1
        subscriptions.appended(f"events/{n}", 0, 1.0, tails)
        del tails.tails[f"events/{n}"]  # expired, seen gone at a lookup: nobody told
    del tails.tails["manual/a"]
    subscriptions.appended("events/last", 0, 1.0, Streams(events__last=1))
    assert {path: (link.kind, link.acked) for path, link in links.items()} == {
        "manual/a": ("explicit", 0),
        "events/last": ("glob", 0),
    }


def test_explicit_paths_are_bounded_in_characters_too() -> None:
    """1,000 explicit paths of 1,000 characters are within the count but a mebibyte of
    paths, naming no stream: refused whole, at the PUT and when added, so 1,000
    subscriptions never hold a gibibyte of them."""
    long = [f"{n:04d}/" + "p" * 995 for n in range(1000)]
    body = {"type": "webhook", "webhook": {"url": HOOK}, "streams": long}
    refused = _refusal(config_of, json.dumps(body).encode())
    assert (refused.status, refused.code) == (400, "INVALID_REQUEST")
    fits = long[: MAX_EXPLICIT_CHARS // 1000]
    subscriptions = _subscriptions()
    subscriptions.put("s", _config(streams=fits), 0.0, [], Streams())
    more = _refusal(subscriptions.add_streams, "s", long[len(fits) : len(fits) + 1], Streams())
    assert (more.status, more.code) == (400, "INVALID_REQUEST")
    assert sorted(subscriptions.get("s").links) == sorted(fits)
    subscriptions.add_streams("s", fits[:3], Streams())  # named again: no more characters


def test_a_subscription_dumped_as_json_and_loaded_goes_on_the_same() -> None:
    subscriptions = _subscriptions()
    tails = Streams(events__a=1)
    subscriptions.put("s", _config(streams=["x"], lease_ttl_ms=2000), 0.0, ["events/a"], tails)
    tails.tails["events/a"] = 4
    (wake,) = subscriptions.appended("events/a", 1, 5.0, tails)
    subscriptions.retry("s", 9.0)
    text = json.dumps(dump(subscriptions.get("s")))
    again = _subscriptions()
    again.key = subscriptions.key
    loaded = load(json.loads(text))
    again.subscriptions["s"] = loaded
    assert dump(loaded) == dump(subscriptions.get("s"))
    assert loaded.current is not None and loaded.current.wake == wake
    assert (loaded.links["x"].explicit, loaded.links["events/a"].acked) == (True, 1)
    (retried,) = again.due(9.0, tails)
    assert retried == wake
    request = {"wake_id": wake.wake_id, "generation": wake.generation, "done": True}
    request["acks"] = [{"stream": "events/a", "offset": offset_text(4)}]
    assert again.ack("s", wake.token, request, 9.5, tails) == (False, None)
    assert again.get("s").links["events/a"].acked == 4


def test_a_subscription_asked_again_wakes_for_data_appended_past_its_links() -> None:
    subscriptions = _subscriptions()
    tails = Streams(events__a=2)
    subscriptions.put("s", _config(), 0.0, ["events/a"], tails)
    assert subscriptions.wake("s", 1.0, tails) is None
    tails.tails["events/a"] = 5  # appended while no one knew of the subscription
    wake = subscriptions.wake("s", 2.0, tails)
    assert wake is not None and (wake.generation, wake.pending) == (1, ("events/a",))
    assert subscriptions.wake("s", 3.0, tails) is None  # one wake at a time
    assert subscriptions.wake("gone", 3.0, tails) is None
