"""Tests for token_relay.core.durablejson: a JSON body as messages, exactly as sent."""

from __future__ import annotations

import pytest
from token_relay.core.durablejson import json_array, messages_of
from token_relay.core.errors import StreamRefused


@pytest.mark.parametrize(
    ("body", "messages"),
    [
        (b'{"event": "created"}', [b'{"event": "created"}']),
        (b'[{"event": "a"}, {"event": "b"}]', [b'{"event": "a"}', b'{"event": "b"}']),
        (b"[[1,2], [3,4]]", [b"[1,2]", b"[3,4]"]),
        (b"[[[1,2,3]]]", [b"[[1,2,3]]"]),
        (b' \n[ 1 ,\t"x" ] \n', [b"1", b'"x"']),
        (b"[]", []),
        (b"[ ]", []),
        (b"42", [b"42"]),
        (b'"caf\xc3\xa9"', [b'"caf\xc3\xa9"']),
        (b'[{"a":[1,{"b":"]"}]}]', [b'{"a":[1,{"b":"]"}]}']),
    ],
)
def test_a_body_is_its_messages_one_level_of_array_flattened(
    body: bytes, messages: list[bytes]
) -> None:
    assert messages_of(body) == messages


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"   ",
        b"{",
        b"[1,2",
        b"[1,]",
        b"[,1]",
        b"[1 2]",
        b"{} {}",
        b"[1] x",
        b"NaN",
        b"[Infinity]",
        b"-Infinity",
        b"\xff",
        b"{'a': 1}",
    ],
)
def test_what_is_not_one_json_text_is_refused(body: bytes) -> None:
    with pytest.raises(StreamRefused) as caught:
        messages_of(body)
    assert (caught.value.status, caught.value.code) == (400, "invalid_json")


def test_messages_read_back_as_one_array() -> None:
    assert json_array([b'{"a":1}', b"[1,2]", b"3"]) == b'[{"a":1},[1,2],3]'
    assert json_array([]) == b"[]"
