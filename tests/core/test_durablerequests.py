"""Tests for token_relay.core.durablerequests: the protocol's header values."""

from __future__ import annotations

import pytest
from token_relay.core.durable import Expiry
from token_relay.core.durableproducers import MAX_PRODUCER_NUMBER, Producer
from token_relay.core.durablerequests import (
    CURSOR_EPOCH,
    CURSOR_INTERVAL,
    MAX_VALUE_LENGTH,
    bounded,
    closed_of,
    cursor,
    expiry_of,
    producer_of,
    sub_offset_of,
)
from token_relay.core.errors import StreamRefused


def test_a_ttl_is_whole_seconds_without_sign_or_leading_zero() -> None:
    assert expiry_of("3600", "") == Expiry(ttl=3600)
    assert expiry_of("0", "") == Expiry(ttl=0)
    for bad in ("+3600", "03600", "3600.0", "3.6e3", "-1", "abc", "٣", "1" * 13):
        with pytest.raises(StreamRefused) as caught:
            expiry_of(bad, "")
        assert (caught.value.status, caught.value.code) == (400, "bad_ttl")


def test_an_expiry_time_is_rfc_3339() -> None:
    assert expiry_of("", "2030-01-02T03:04:05Z") == Expiry(
        expires_at=1893553445.0, expires_at_text="2030-01-02T03:04:05Z"
    )
    assert expiry_of("", "2030-01-02T04:04:05.500+01:00").expires_at == 1893553445.5
    for bad in ("tomorrow", "2030-01-02", "2030-13-02T03:04:05Z", "1893553445"):
        with pytest.raises(StreamRefused) as caught:
            expiry_of("", bad)
        assert caught.value.code == "bad_expires_at"


def test_ttl_and_expiry_time_together_are_refused() -> None:
    with pytest.raises(StreamRefused) as caught:
        expiry_of("60", "2030-01-02T03:04:05Z")
    assert caught.value.code == "bad_expiry"
    assert expiry_of("", "") == Expiry()


def test_only_true_closes() -> None:
    assert closed_of("true") and closed_of("TRUE") and closed_of(" True ")
    for other in ("", "false", "yes", "1"):
        assert not closed_of(other)


def test_producer_headers_come_all_three_or_none() -> None:
    assert producer_of(None, None, None) is None
    assert producer_of("p", "1", "2") == Producer("p", 1, 2)
    largest = str(MAX_PRODUCER_NUMBER)
    assert producer_of("p", largest, "0") == Producer("p", MAX_PRODUCER_NUMBER, 0)
    for headers in (
        ("p", "1", None),
        (None, "1", "2"),
        ("", "0", "0"),
        ("p", "-1", "0"),
        ("p", "1.5", "0"),
        ("p", "0", "abc"),
        ("p", str(MAX_PRODUCER_NUMBER + 1), "0"),
        ("p", "01", "0"),
    ):
        with pytest.raises(StreamRefused) as caught:
            producer_of(*headers)
        assert (caught.value.status, caught.value.code) == (400, "bad_producer"), headers


def test_a_sub_offset_is_a_whole_number() -> None:
    assert sub_offset_of("") == 0
    assert sub_offset_of("7") == 7
    for bad in ("-1", "x", "1.0"):
        with pytest.raises(StreamRefused):
            sub_offset_of(bad)


def test_the_cursor_is_the_interval_and_never_goes_back() -> None:
    now = CURSOR_EPOCH + 1000 * CURSOR_INTERVAL + 5
    assert cursor(now, "", 7) == "1000"
    assert cursor(now, "999", 7) == "1000"
    assert cursor(now, "1000", 7) == "1007"
    assert cursor(now, "5000", 3) == "5003"
    assert cursor(now, "5000", 0) == "5001"
    assert cursor(now, "junk", 7) == "1000"


def test_kept_values_are_bounded() -> None:
    assert bounded("Stream-Seq", None) is None
    assert bounded("Stream-Seq", "s" * MAX_VALUE_LENGTH) == "s" * MAX_VALUE_LENGTH
    for name, code in (("Stream-Seq", "bad_stream_seq"), ("Content-Type", "bad_content_type")):
        with pytest.raises(StreamRefused) as caught:
            bounded(name, "s" * (MAX_VALUE_LENGTH + 1))
        assert (caught.value.status, caught.value.code) == (400, code)
    assert producer_of("p" * MAX_VALUE_LENGTH, "0", "0") is not None
    with pytest.raises(StreamRefused):
        producer_of("p" * (MAX_VALUE_LENGTH + 1), "0", "0")
