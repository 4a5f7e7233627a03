"""The SSE resume token: every channel's position, round-tripped, and nothing else accepted."""

from __future__ import annotations

import base64

import pytest
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.protocol import MAX_NAME_LENGTH
from token_relay.core.resume import (
    MAX_EPOCH_LENGTH,
    decode_positions,
    encode_positions,
    max_token_chars,
)


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


def test_positions_of_channels_not_followed_are_dropped() -> None:
    token = encode_positions({"a": (3, "e1"), "b": (5, "e2"), "junk": (1, "e3")})
    assert decode_positions(token, {"a", "c"}) == {"a": (3, "e1")}
    assert decode_positions(token, {"junk"}) == {"junk": (1, "e3")}


def test_a_token_longer_than_the_relay_makes_for_its_channels_is_refused() -> None:
    longest = encode_positions({"名" * MAX_NAME_LENGTH: (10**19, "e" * MAX_EPOCH_LENGTH)})
    assert len(longest) <= max_token_chars(1) == 1496
    assert decode_positions(longest, {"名" * MAX_NAME_LENGTH}) != {}
    forged = encode_positions({f"junk-{n}": (n, "e") for n in range(1000)})
    with pytest.raises(FrameRejected) as refused:
        decode_positions(forged, {"a"})
    assert refused.value.message == "the resume token is invalid: over 1496 characters"
    assert decode_positions(forged, {f"junk-{n}" for n in range(1000)})["junk-7"] == (7, "e")
