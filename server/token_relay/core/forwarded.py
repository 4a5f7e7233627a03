"""The client's address behind trusted reverse proxies (``Forwarded``, ``X-Forwarded-For``),
and the scheme it used (``Forwarded: proto=``, ``X-Forwarded-Proto``).

A connection from a trusted proxy (``--trusted-proxy CIDR``) names the addresses it
forwarded for in ``Forwarded: for=…`` (RFC 7239) or ``X-Forwarded-For``, one per hop,
the client first. The client is the right-most address that is not itself trusted: a
trusted proxy appends what it saw, but anything to the left of the first untrusted hop
was written by that hop and could be forged. Headers from an untrusted peer are ignored,
and so is a hop that cannot be parsed (``unknown``, an obfuscated name): the walk stops
there, at the last address it could trust.

The scheme the client used (for the URLs the relay builds: ``Location``, a webhook's
callback) is ``https`` only when a trusted proxy says so, in the last ``proto=`` of
``Forwarded`` or else the last value of ``X-Forwarded-Proto`` (the hop nearest the relay
wrote it); anything else is ``http``.

Pure: no sockets, no name resolution.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

__all__ = ["Network", "client_address", "is_trusted", "parse_networks", "scheme"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """``--trusted-proxy`` values as networks; raises ``ValueError`` for a bad one."""
    return tuple(ipaddress.ip_network(cidr.strip(), strict=False) for cidr in cidrs)


def _address(token: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """One hop's address, without quotes, brackets or port; None if it is not an address."""
    token = token.strip().strip('"')
    if token.startswith("["):  # [2001:db8::1]:4711
        token = token[1:].partition("]")[0]
    elif token.count(":") == 1:  # 192.0.2.1:4711
        token = token.partition(":")[0]
    try:
        return ipaddress.ip_address(token)
    except ValueError:
        return None


def _hops(headers: Sequence[tuple[str, str]]) -> list[str]:
    """The forwarded-for hops, client first: ``Forwarded`` if present, else ``X-Forwarded-For``."""
    forwarded = [value for name, value in headers if name.lower() == "forwarded"]
    if forwarded:
        hops = []
        for value in forwarded:
            for element in value.split(","):
                for pair in element.split(";"):
                    key, _, item = pair.strip().partition("=")
                    if key.lower() == "for":
                        hops.append(item)
        return hops
    return [
        hop
        for name, value in headers
        if name.lower() == "x-forwarded-for"
        for hop in value.split(",")
    ]


def is_trusted(peer: str, trusted: Sequence[Network]) -> bool:
    """Whether ``peer`` is one of the trusted proxies."""
    if not trusted:
        return False
    address = _address(peer)
    return address is not None and any(address in network for network in trusted)


def client_address(
    peer: str, headers: Sequence[tuple[str, str]], trusted: Sequence[Network]
) -> str:
    """The address to count and log for a connection from ``peer`` with ``headers``."""
    if not is_trusted(peer, trusted):
        return peer
    current = _address(peer)
    assert current is not None
    for hop in reversed(_hops(headers)):
        address = _address(hop)
        if address is None:
            break
        current = address
        if not any(address in network for network in trusted):
            break
    return str(current)


def scheme(peer: str, headers: Sequence[tuple[str, str]], trusted: Sequence[Network]) -> str:
    """``https`` if a trusted proxy says the client used it, else ``http``."""
    if not is_trusted(peer, trusted):
        return "http"
    said = ""
    for name, value in headers:
        lowered = name.lower()
        if lowered == "forwarded":
            for element in value.split(","):
                for pair in element.split(";"):
                    key, _, item = pair.strip().partition("=")
                    if key.lower() == "proto":
                        said = "f:" + item.strip().strip('"')
        elif lowered == "x-forwarded-proto" and not said.startswith("f:"):
            said = "x:" + value.split(",")[-1].strip()
    return "https" if said[2:].lower() == "https" else "http"
