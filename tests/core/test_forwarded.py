"""Tests for token_relay.core.forwarded: the client's address behind trusted proxies."""

from __future__ import annotations

import pytest
from token_relay.core.forwarded import client_address, parse_networks, scheme

TRUSTED = parse_networks(["10.0.0.0/8", "127.0.0.1", "2001:db8::/32"])


def _xff(value: str) -> list[tuple[str, str]]:
    return [("X-Forwarded-For", value)]


def test_without_trusted_proxies_the_peer_is_the_client() -> None:
    assert client_address("10.0.0.1", _xff("1.2.3.4"), ()) == "10.0.0.1"


def test_an_untrusted_peer_s_headers_are_ignored() -> None:
    assert client_address("8.8.8.8", _xff("1.2.3.4"), TRUSTED) == "8.8.8.8"


def test_the_right_most_untrusted_hop_is_the_client() -> None:
    assert client_address("10.0.0.1", _xff("1.2.3.4"), TRUSTED) == "1.2.3.4"
    assert client_address("10.0.0.1", _xff("1.2.3.4, 10.0.0.7"), TRUSTED) == "1.2.3.4"
    # Whatever the client wrote itself, to the left, is not believed.
    assert client_address("10.0.0.1", _xff("6.6.6.6, 1.2.3.4"), TRUSTED) == "1.2.3.4"


def test_several_header_lines_are_one_list() -> None:
    headers = [("X-Forwarded-For", "5.5.5.5"), ("x-forwarded-for", "1.2.3.4, 10.1.1.1")]
    assert client_address("127.0.0.1", headers, TRUSTED) == "1.2.3.4"


def test_forwarded_wins_over_x_forwarded_for_and_is_parsed_fully() -> None:
    headers = [
        ("Forwarded", 'for="[2001:db8:cafe::17]:4711";proto=https, for=192.0.2.60:8080'),
        ("X-Forwarded-For", "9.9.9.9"),
    ]
    assert client_address("10.0.0.1", headers, TRUSTED) == "192.0.2.60"
    only_v6 = [("Forwarded", 'for="[2001:db8:cafe::17]:4711"')]
    assert client_address("10.0.0.1", only_v6, TRUSTED) == "2001:db8:cafe::17"
    assert client_address("10.0.0.1", [("Forwarded", "For=198.51.100.17")], TRUSTED) == (
        "198.51.100.17"
    )


def test_an_unparseable_hop_stops_the_walk_at_the_last_trusted_address() -> None:
    assert client_address("10.0.0.1", _xff("1.2.3.4, unknown"), TRUSTED) == "10.0.0.1"
    assert client_address("10.0.0.1", [("Forwarded", "for=_hidden")], TRUSTED) == "10.0.0.1"


def test_all_hops_trusted_gives_the_left_most() -> None:
    assert client_address("10.0.0.1", _xff("10.9.9.9, 10.0.0.5"), TRUSTED) == "10.9.9.9"
    assert client_address("10.0.0.1", [], TRUSTED) == "10.0.0.1"


def test_bad_networks_are_refused() -> None:
    with pytest.raises(ValueError):
        parse_networks(["10.0.0.0/33"])
    with pytest.raises(ValueError):
        parse_networks(["not-a-network"])


@pytest.mark.parametrize(
    ("peer", "headers", "expected"),
    [
        ("10.0.0.1", [("x-forwarded-proto", "https")], "https"),
        ("10.0.0.1", [("X-Forwarded-Proto", "HTTPS")], "https"),
        ("10.0.0.1", [("x-forwarded-proto", "http")], "http"),
        ("10.0.0.1", [], "http"),
        # The last value: the hop nearest the relay wrote it.
        ("10.0.0.1", [("x-forwarded-proto", "http, https")], "https"),
        ("10.0.0.1", [("x-forwarded-proto", "https, http")], "http"),
        # Forwarded's proto wins over X-Forwarded-Proto, whatever their order.
        ("10.0.0.1", [("forwarded", "for=1.2.3.4;proto=http"), ("x-forwarded-proto", "https")],
         "http"),
        ("10.0.0.1", [("x-forwarded-proto", "http"), ("forwarded", 'for=1.2.3.4;proto="https"')],
         "https"),
        # A Forwarded without proto leaves X-Forwarded-Proto in charge.
        ("10.0.0.1", [("forwarded", "for=1.2.3.4"), ("x-forwarded-proto", "https")], "https"),
        ("10.0.0.1", [("x-forwarded-proto", "gopher")], "http"),
        # An untrusted peer can't say so.
        ("192.0.2.9", [("x-forwarded-proto", "https")], "http"),
    ],
)  # fmt: skip
def test_the_scheme_is_https_only_when_a_trusted_proxy_says_so(
    peer: str, headers: list[tuple[str, str]], expected: str
) -> None:
    assert scheme(peer, headers, parse_networks(["10.0.0.0/8"])) == expected
