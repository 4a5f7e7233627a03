"""Tests for server.auth: minting and verifying connection tokens, and what a grant allows."""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest
from token_relay import tokens as auth
from token_relay.core.errors import ConfigError, ErrorCode, FrameRejected, InvalidToken
from token_relay.core.grants import OPEN, Grant, Role, refusal
from token_relay.tokens import ALGORITHM, mint, verify

SECRET = "test-secret-" + "x" * 64
OTHER_SECRET = "another-secret-that-is-32-bytes-or-more"


def _token(claims: dict[str, Any], secret: str = SECRET, algorithm: str = ALGORITHM) -> str:
    return jwt.encode(claims, secret, algorithm=algorithm)


def _future() -> int:
    return int(time.time()) + 3600


def _invalid(token: str, secret: str = SECRET) -> InvalidToken:
    with pytest.raises(InvalidToken) as info:
        verify(token, secret)
    return info.value


# ------------------------------------------------------------------ mint / verify


def test_mint_verify_round_trip_produce() -> None:
    token = mint(SECRET, Role.PRODUCE, ["chat-1", "room-*"], ttl=60)
    assert verify(token, SECRET) == Grant(Role.PRODUCE, ("chat-1", "room-*"))


def test_mint_verify_round_trip_subscribe() -> None:
    grant = verify(mint(SECRET, Role.SUBSCRIBE, ["*"], ttl=60), SECRET)
    assert grant.role is Role.SUBSCRIBE
    assert grant.channels == ("*",)


def test_mint_with_no_channels_grants_none() -> None:
    grant = verify(mint(SECRET, Role.SUBSCRIBE, [], ttl=60), SECRET)
    assert grant == Grant(Role.SUBSCRIBE, ())
    assert grant.allows("chat-1") is False


def test_minted_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth.time, "time", lambda: 1000.75)
    token = mint(SECRET, Role.PRODUCE, ["a"], ttl=90.5)
    monkeypatch.undo()
    claims = jwt.decode(token, SECRET, algorithms=[ALGORITHM], options={"verify_exp": False})
    assert claims == {"role": "produce", "channels": ["a"], "exp": 1091}
    assert jwt.get_unverified_header(token)["alg"] == "HS256"


def test_expired_token_is_invalid() -> None:
    _invalid(mint(SECRET, Role.PRODUCE, ["a"], ttl=-10))
    _invalid(_token({"role": "produce", "channels": ["a"], "exp": int(time.time()) - 10}))


def test_wrong_secret_is_invalid() -> None:
    token = mint(SECRET, Role.PRODUCE, ["a"], ttl=60)
    _invalid(token, OTHER_SECRET)


def test_tampered_token_is_invalid() -> None:
    token = mint(SECRET, Role.SUBSCRIBE, ["a"], ttl=60)
    header, _, signature = token.split(".")
    forged = _token({"role": "produce", "channels": ["*"], "exp": _future()}, OTHER_SECRET)
    _invalid(f"{header}.{forged.split('.')[1]}.{signature}")


def test_malformed_tokens_are_invalid() -> None:
    for token in ("", "not-a-jwt", "a.b.c", "a.b"):
        _invalid(token)


def test_other_algorithms_are_invalid() -> None:
    claims = {"role": "produce", "channels": ["a"], "exp": _future()}
    _invalid(_token(claims, SECRET, algorithm="HS512"))
    unsigned = jwt.encode(claims, None, algorithm="none")
    _invalid(unsigned)


def test_missing_exp_is_invalid() -> None:
    _invalid(_token({"role": "produce", "channels": ["a"]}))


def test_bad_role_is_invalid() -> None:
    error = _invalid(_token({"role": "owner", "channels": ["a"], "exp": _future()}))
    assert str(error) == "claim 'role' must be 'produce', 'subscribe' or 'admin'"
    _invalid(_token({"role": "PRODUCE", "channels": ["a"], "exp": _future()}))
    _invalid(_token({"channels": ["a"], "exp": _future()}))
    _invalid(_token({"role": None, "channels": ["a"], "exp": _future()}))


def test_non_list_channels_are_invalid() -> None:
    message = "claim 'channels' must be a list of names or patterns"
    for channels in ("chat-1", {"chat-1": True}, None, 1, ["chat-1", 2], [["chat-1"]]):
        error = _invalid(_token({"role": "subscribe", "channels": channels, "exp": _future()}))
        assert str(error) == message
    error = _invalid(_token({"role": "subscribe", "exp": _future()}))
    assert str(error) == message


# -------------------------------------------------------------------------- Grant


def test_allows_exact_names() -> None:
    grant = Grant(Role.SUBSCRIBE, ("chat-1", "room"))
    assert grant.allows("chat-1") is True
    assert grant.allows("room") is True
    assert grant.allows("chat-2") is False
    assert grant.allows("roo") is False
    assert grant.allows("rooms") is False


def test_allows_glob_patterns() -> None:
    grant = Grant(Role.PRODUCE, ("chat-*",))
    assert grant.allows("chat-1") is True
    assert grant.allows("chat-abc-def") is True
    assert grant.allows("other") is False
    assert grant.allows("xchat-1") is False
    assert grant.allows("Chat-1") is False


LONG_SECRET = "a-secret-long-enough-for-hs256-keys"


def test_grants_are_exact_names_or_prefixes_never_globs() -> None:
    # Channel names may hold glob characters: a grant names them literally.
    grant = Grant(Role.PRODUCE, ("room-1", "chat-*"))
    assert grant.allows("room-1") is True and grant.allows("room-12") is False
    assert grant.allows("chat-") is True and grant.allows("chat-42") is True
    assert grant.allows("chat") is False and grant.allows("xchat-1") is False
    literal = Grant(Role.PRODUCE, ("a*b-literal",))  # what verify() would refuse
    assert literal.allows("a*b-literal") is True and literal.allows("axb-literal") is False


@pytest.mark.parametrize("pattern", ["room-?", "team-[ab]", "a*b", "**", "x*y*"])
def test_a_grant_with_a_metacharacter_inside_is_refused(pattern: str) -> None:
    assert refusal(pattern) is not None
    with pytest.raises(ConfigError):
        mint(LONG_SECRET, Role.PRODUCE, [pattern], 60)
    forged = jwt.encode(
        {"role": "produce", "channels": [pattern], "exp": int(time.time()) + 60},
        LONG_SECRET,
        algorithm=ALGORITHM,
    )
    with pytest.raises(InvalidToken):
        verify(forged, LONG_SECRET)


@pytest.mark.parametrize("pattern", ["chat-42", "chat-*", "*", "a-b.c/d"])
def test_exact_names_and_prefix_grants_are_accepted(pattern: str) -> None:
    assert refusal(pattern) is None
    token = mint(LONG_SECRET, Role.PRODUCE, [pattern], 60)
    assert verify(token, LONG_SECRET).channels == (pattern,)


def test_star_and_open_allow_everything() -> None:
    assert Grant(Role.SUBSCRIBE, ("*",)).allows("any/channel name") is True
    assert Grant(Role.PRODUCE, ("*",)) == OPEN
    assert OPEN.allows("x") is True


def test_check_passes_for_a_granted_channel() -> None:
    grant = Grant(Role.PRODUCE, ("chat-*",))
    assert grant.check("chat-1", "m") is None


def test_check_raises_forbidden_with_the_message_id() -> None:
    grant = Grant(Role.PRODUCE, ("chat-*",))
    with pytest.raises(FrameRejected) as info:
        grant.check("other", "m")
    assert info.value.code is ErrorCode.FORBIDDEN
    assert info.value.message_id == "m"
    assert info.value.message == "this connection's token does not grant channel 'other'"


def test_check_without_a_message_id() -> None:
    with pytest.raises(FrameRejected) as info:
        Grant(Role.SUBSCRIBE, ()).check("chat-1")
    assert info.value.code is ErrorCode.FORBIDDEN
    assert info.value.message_id is None
