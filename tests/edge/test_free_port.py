"""Tests for the harness's free ports: two asked for before either is bound differ."""

from __future__ import annotations

import socket
from typing import Any, ClassVar

import pytest

from tests.harness import machine


class _Probe:
    """A socket whose bound port comes from a script."""

    ports: ClassVar[list[int]] = []

    def __enter__(self) -> _Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def bind(self, address: Any) -> None:
        self.port = _Probe.ports.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return "127.0.0.1", self.port


def test_a_port_the_system_offers_again_is_not_handed_out_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(machine, "_handed", type(machine._handed)(maxlen=machine.PORTS_KEPT))
    monkeypatch.setattr(machine.socket, "socket", _Probe)
    _Probe.ports = [40001, 40001, 40001, 40002]
    assert [machine.free_port(), machine.free_port()] == [40001, 40002]
    assert _Probe.ports == []


def test_free_ports_are_bindable_and_distinct() -> None:
    ports = [machine.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", ports[-1]))
