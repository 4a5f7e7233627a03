"""The webhook outbox's rules, step by step: lanes in order, concurrency, retries with
backoff and jitter, dead letters at max age, several URLs, stable ids and bodies; and URLs
as logs show them."""

from __future__ import annotations

import json

import pytest
from token_relay.core.webhooks import (
    MAX_BACKOFF,
    Outbox,
    WebhookEntry,
    backoff_delay,
    loggable_url,
    scrubbed,
    webhook_id,
)

A, B = "http://a/hook", "http://b/hook"


def _entry(key: int, channel: str = "c", completed: float = 1000.0) -> WebhookEntry:
    frame = {"type": "message", "channel": channel, "id": f"m{key}", "text": "t",
             "offset": key, "epoch": "E"}  # fmt: skip
    return WebhookEntry(str(key), channel, json.dumps(frame), "", completed)


def test_a_lane_sends_one_at_a_time_in_order_and_lanes_run_side_by_side() -> None:
    outbox = Outbox((A,), concurrency=10, backoff=1.0, max_age=60.0)
    for key, channel in ((1, "c"), (2, "c"), (3, "d")):
        outbox.add(_entry(key, channel), now=0.0)
    first = outbox.due(0.0)
    assert [d.entry.key for d in first] == ["1", "3"]  # c's second waits for its first
    assert outbox.due(0.0) == []
    assert outbox.succeeded(first[0]) is first[0].entry
    assert [d.entry.key for d in outbox.due(0.0)] == ["2"]
    assert len(outbox) == 2


def test_concurrency_bounds_posts_in_flight_across_lanes() -> None:
    outbox = Outbox((A,), concurrency=2, backoff=1.0, max_age=60.0)
    for key in range(5):
        outbox.add(_entry(key, f"ch{key}"), now=0.0)
    flying = outbox.due(0.0)
    assert len(flying) == 2 and outbox.in_flight == 2
    outbox.succeeded(flying[0])
    assert len(outbox.due(0.0)) == 1


def test_a_failure_is_retried_after_backoff_with_jitter_and_blocks_its_lane() -> None:
    outbox = Outbox((A,), concurrency=10, backoff=1.0, max_age=60.0)
    outbox.add(_entry(1, completed=1000.0), now=0.0)
    outbox.add(_entry(2, completed=1000.0), now=0.0)
    (delivery,) = outbox.due(0.0)
    assert outbox.failed(delivery, "http_error 500", now=0.0, wall=1000.0, jitter=0.0) == (
        "retry",
        None,
    )
    assert outbox.next_due() == 0.5  # half of the first ceiling, jitter 0
    assert outbox.due(0.4) == []  # and entry 2 waits behind it
    (again,) = outbox.due(0.5)
    assert again is delivery and again.attempts == 1
    outbox.failed(again, "timeout", now=0.5, wall=1000.5, jitter=0.999)
    assert outbox.next_due() == pytest.approx(0.5 + 2.0, abs=0.01)  # ceiling 2 s, jitter ~1


def test_backoff_doubles_to_its_ceiling() -> None:
    assert [backoff_delay(n, 1.0, 0.0) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff_delay(1, 1.0, 0.5) == 0.75
    assert backoff_delay(40, 1.0, 0.0) == MAX_BACKOFF / 2


def test_past_max_age_a_failure_is_dead_and_the_lane_moves_on() -> None:
    outbox = Outbox((A,), concurrency=10, backoff=10.0, max_age=30.0)
    outbox.add(_entry(1, completed=1000.0), now=0.0)
    outbox.add(_entry(2, completed=1000.0), now=0.0)
    (delivery,) = outbox.due(0.0)
    outbox.failed(delivery, "http_error 500", now=0.0, wall=1025.0, jitter=0.9)
    # The next try would land past the max age: it comes at the max age, once more.
    assert outbox.next_due() == 5.0
    (last,) = outbox.due(5.0)
    outcome, entry = outbox.failed(last, "http_error 502", now=5.0, wall=1030.0, jitter=0.0)
    assert (outcome, entry is last.entry) == ("dead", True)
    assert last.error == "http_error 502" and last.attempts == 2
    assert [d.entry.key for d in outbox.due(5.0)] == ["2"]


def test_every_url_has_its_own_lane_and_an_entry_is_done_when_all_are() -> None:
    outbox = Outbox((A, B), concurrency=10, backoff=1.0, max_age=60.0)
    outbox.add(_entry(1), now=0.0)
    to_a, to_b = outbox.due(0.0)
    assert {to_a.url, to_b.url} == {A, B}
    assert outbox.succeeded(to_a) is None  # B still owes it
    assert outbox.succeeded(to_b) is not None
    # A revived dead letter goes to its one URL only.
    revived = _entry(2)
    revived.url = B
    outbox.add(revived, now=0.0)
    assert [d.url for d in outbox.due(0.0)] == [B]


def test_an_entry_taken_twice_is_sent_once_and_clear_forgets_everything() -> None:
    outbox = Outbox((A,), concurrency=10, backoff=1.0, max_age=60.0)
    outbox.add(_entry(1), now=0.0)
    outbox.add(_entry(1), now=0.0)
    assert len(outbox) == 1 and len(outbox.due(0.0)) == 1
    flying = outbox.due(0.0)
    outbox.clear()
    assert len(outbox) == 0 and outbox.due(0.0) == [] and flying == []


def test_ids_and_bodies_are_stable() -> None:
    one, same = _entry(7), _entry(7)
    assert one.id == same.id == webhook_id("c", "E", 7)
    assert one.body == same.body
    assert webhook_id("c", "E", 7) != webhook_id("c", "E", 8) != webhook_id("c", "F", 7)
    assert json.loads(one.body) == {"type": "message", "channel": "c", "id": "m7",
                                    "text": "t", "meta": {}, "offset": 7, "epoch": "E"}  # fmt: skip
    assert one.id.startswith("msg_") and one.id.isascii()


def test_a_url_is_logged_without_userinfo_query_or_fragment() -> None:
    assert loggable_url("https://user:pw@hooks.example.com:8443/in/x?key=SECRET#frag") == (
        "https://hooks.example.com:8443/in/x"
    )
    assert loggable_url("http://[::1]:9/hook?key=SECRET") == "http://[::1]:9/hook"
    assert loggable_url("http://h/hook") == "http://h/hook"
    assert loggable_url("http://h?key=SECRET") == "http://h"


def test_urls_in_an_error_text_are_scrubbed() -> None:
    text = "400, message='Bad status line', url='http://u:p@h:1/x?key=SECRET&a=b'"
    assert scrubbed(text) == "400, message='Bad status line', url='http://h:1/x'"
    assert scrubbed("Cannot connect to host h:1 ssl:default") == (
        "Cannot connect to host h:1 ssl:default"
    )
