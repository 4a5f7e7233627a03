"""Tests for token_relay.core.durablesubconfig: a subscription's body validated, its webhook
URL checked against SSRF, and its glob."""

from __future__ import annotations

import pytest
from token_relay.core.durablesubconfig import config_of, glob_match, webhook_url_problem
from token_relay.core.errors import SubscriptionError


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("events/*", "events/a", True),
        ("events/*", "events/a/b", False),
        ("events/*", "other/a", False),
        ("events/**", "events", True),
        ("events/**", "events/a/b/c", True),
        ("**/log", "a/b/log", True),
        ("**", "anything/at/all", True),
        ("chat-*/in", "chat-42/in", True),
        ("chat-*/in", "chat-42/out", False),
        ("a.b/*", "axb/c", False),
    ],
)
def test_globs_match_segments(pattern: str, path: str, matches: bool) -> None:
    assert glob_match(pattern, path) is matches


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("https://worker.example/hooks", False),
        ("http://localhost:8080/hook", False),
        ("http://127.0.0.1:9/hook", False),
        ("https://93.184.216.34/hook", False),
        ("http://worker.example/hooks", True),
        ("http://10.0.0.1/hook", True),
        ("https://10.0.0.1/hook", True),
        ("https://192.168.1.2/hook", True),
        ("https://169.254.169.254/latest/meta-data", True),
        ("https://[::1]/hook", True),
        ("https://metadata.google.internal/", True),
        ("ftp://worker.example/", True),
        ("not a url", True),
    ],
)
def test_webhook_urls_are_checked_against_ssrf(url: str, refused: bool) -> None:
    assert (webhook_url_problem(url) is not None) is refused


def test_a_configuration_is_validated() -> None:
    for body, code in (
        (b"", "INVALID_REQUEST"),
        (b"[]", "INVALID_REQUEST"),
        (b'{"type": "webhook", "webhook": {"url": "https://w.example/"}}', "INVALID_REQUEST"),
        (b'{"type": "webhook", "pattern": "a/*"}', "INVALID_REQUEST"),
        (b'{"type": "pull-wake", "pattern": "a/*"}', "INVALID_REQUEST"),
        (
            b'{"type": "webhook", "pattern": "a/*", "webhook": {"url": "http://10.0.0.1/"}}',
            "WEBHOOK_URL_REJECTED",
        ),
        (b'{"type": "other", "pattern": "a/*"}', "INVALID_REQUEST"),
        (
            b'{"type": "pull-wake", "pattern": "a", "wake_stream": "w", "lease_ttl_ms": 999}',
            "INVALID_REQUEST",
        ),
        (
            b'{"type": "pull-wake", "pattern": "a", "wake_stream": "w", "extra": 1}',
            "INVALID_REQUEST",
        ),
    ):
        with pytest.raises(SubscriptionError) as caught:
            config_of(body)
        refused = caught.value
        assert (refused.status, refused.code) == (400, code), body
