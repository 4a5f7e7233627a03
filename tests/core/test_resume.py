"""The SSE resume token: every channel's position, round-tripped, and nothing else accepted."""

from __future__ import annotations

import base64

import pytest
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.resume import decode_positions, encode_positions


def test_a_token_round_trips_every_channel_position() -> None:
    positions = {"chat-42": (7, "aBcD"), "名前": (0, "e1"), "a*b?[c]": (123456, "x" * 64)}
    token = encode_positions(positions)
    assert token.isascii() and "=" not in token and "/" not in token and "+" not in token
    assert decode_positions(token) == positions


def _raw(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "token",
    [
        "%%%",
        _raw("not json"),
        _raw("[1, 2]"),
        _raw('{"c": [1]}'),
        _raw('{"c": [-1, "e"]}'),
        _raw('{"c": [true, "e"]}'),
        _raw('{"c": [1.5, "e"]}'),
        _raw('{"c": [1, ""]}'),
        _raw('{"c": [1, 2]}'),
        _raw('{"": [1, "e"]}'),
        _raw('{"c": [1, "' + "e" * 65 + '"]}'),
        "A" * 70_000,
    ],
)
def test_anything_else_is_an_invalid_frame(token: str) -> None:
    with pytest.raises(FrameRejected) as refused:
        decode_positions(token)
    assert refused.value.code is ErrorCode.INVALID_FRAME
