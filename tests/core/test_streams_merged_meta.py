"""The merged ``meta`` of a message is bounded by ``max_meta_bytes``, as one event's is.

An event whose ``meta`` would take its message's merged meta past the bound is refused
(``invalid_event``) exactly as one whose own meta is too large: nothing changes, its
delta, chunk, ``seq``, final and abort included. The seed's rules hold around it: empty
deltas count, finals are idempotent, and later events without meta still apply.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from token_relay.core.errors import ErrorCode, FrameRejected
from token_relay.core.protocol import ProducerEvent
from token_relay.core.streams import Applied, MessageStreams, Overflow, Phase, Unfinished


def json_bytes(meta: dict[str, Any] | None) -> int:
    """What --max-meta-bytes counts, computed here independently of the relay's running
    count: the whole object's compact JSON, in UTF-8."""
    if not meta:
        return 0
    return len(json.dumps(meta, separators=(",", ":"), ensure_ascii=False).encode())


def refused(streams: MessageStreams, event: ProducerEvent) -> FrameRejected:
    with pytest.raises(FrameRejected) as info:
        streams.receive(event)
    return info.value


def applied(result: Applied | Overflow) -> Applied:
    assert isinstance(result, Applied), result
    return result


def test_new_keys_fill_the_merged_meta_up_to_its_bound_and_no_further() -> None:
    bound = 4096
    streams = MessageStreams("c", max_meta_bytes=bound)
    text = ""
    merged: dict[str, Any] = {}
    refusal: FrameRejected | None = None
    for i in range(1, 10_000):
        # Empty deltas count: every third event brings one.
        delta = "" if i % 3 == 0 else f"{i % 10}é"
        meta: dict[str, Any] = {f"key-{i:05}": "v" * 30}
        event = ProducerEvent(id="m", delta=delta, seq=i, meta=meta)
        if json_bytes({**merged, **meta}) > bound:
            before = streams.meta_of("m")
            refusal = refused(streams, event)
            # Nothing changed: not the meta, its size, the text, nor the seq.
            assert streams.meta_of("m") is before and streams.meta_of("m") == merged
            assert streams.merged_meta_bytes("m") == json_bytes(merged)
            assert streams.partial("m") == text and streams.next_seq("m") == i
            break
        result = applied(streams.receive(event))
        assert result.delta == delta and result.text is None
        text += delta
        merged = {**merged, **meta}
        assert streams.meta_of("m") == merged
        assert streams.merged_meta_bytes("m") == json_bytes(merged) <= bound
    assert refusal is not None, "no event was refused"
    assert (refusal.code, refusal.message_id) == (ErrorCode.INVALID_EVENT, "m")
    assert "merged meta" in refusal.message and f"({bound})" in refusal.message
    seq = i
    assert seq > 50  # many events were accepted before the bound was reached
    # The same event again is refused again: its seq was not taken.
    assert refused(streams, event).code is ErrorCode.INVALID_EVENT
    # Later events without meta still apply, at the seq the refused one had.
    assert applied(streams.receive(ProducerEvent(id="m", delta="", seq=seq))).delta == ""
    assert applied(streams.receive(ProducerEvent(id="m", delta="ok", seq=seq + 1))).delta == "ok"
    text += "ok"
    seq += 2
    # Replacing a key with a value of the same size is accepted, and changes no size.
    size = json_bytes(merged)
    streams.receive(ProducerEvent(id="m", seq=seq, meta={"key-00001": "w" * 30}))
    merged["key-00001"] = "w" * 30
    assert streams.meta_of("m") == merged and streams.merged_meta_bytes("m") == size
    # A bigger value for an existing key is refused if it passes the bound...
    room = bound - size
    grown = ProducerEvent(id="m", seq=seq + 1, meta={"key-00002": "v" * (30 + room + 1)})
    assert refused(streams, grown).code is ErrorCode.INVALID_EVENT
    # ... and accepted if it reaches it exactly.
    exact = ProducerEvent(id="m", seq=seq + 1, meta={"key-00002": "v" * (30 + room)})
    streams.receive(exact)
    merged["key-00002"] = "v" * (30 + room)
    assert streams.merged_meta_bytes("m") == json_bytes(merged) == bound
    # A smaller value frees room that a new key may take.
    streams.receive(ProducerEvent(id="m", seq=seq + 2, meta={"key-00002": ""}))
    streams.receive(ProducerEvent(id="m", seq=seq + 3, meta={"new": "n" * 20}))
    merged.update({"key-00002": "", "new": "n" * 20})
    assert streams.meta_of("m") == merged
    assert streams.merged_meta_bytes("m") == json_bytes(merged) <= bound
    # A final without meta completes the exact text with the merged meta...
    done = applied(streams.receive(ProducerEvent(id="m", seq=seq + 4, final=True)))
    assert (done.text, done.first_completion, done.meta) == (text, True, merged)
    assert json_bytes(done.meta) <= bound
    # ... and finalizing is idempotent.
    again = applied(streams.receive(ProducerEvent(id="m", final=True)))
    assert (again.text, again.first_completion) == (text, False)
    assert streams.phase("m") is Phase.COMPLETED


def test_a_final_whose_meta_would_pass_the_bound_is_refused_and_completes_nothing() -> None:
    streams = MessageStreams("c", max_meta_bytes=64)
    streams.receive(ProducerEvent(id="m", delta="a", meta={"k": "x" * 50}))
    final = ProducerEvent(id="m", delta="b", final=True, meta={"j": "y" * 10})
    assert refused(streams, final).code is ErrorCode.INVALID_EVENT
    assert streams.phase("m") is Phase.STREAMING and streams.partial("m") == "a"
    done = applied(streams.receive(ProducerEvent(id="m", delta="b", final=True)))
    assert (done.text, done.meta) == ("ab", {"k": "x" * 50})


def test_a_structured_messages_refused_event_applies_no_chunk() -> None:
    streams = MessageStreams("c", max_meta_bytes=64)
    streams.receive(ProducerEvent(id="m", chunk={"type": "text-start", "id": "t"}, meta={"a": 1}))
    delta: dict[str, Any] = {"type": "text-delta", "id": "t", "delta": "Hi"}
    streams.receive(ProducerEvent(id="m", chunk=delta, meta={"b": "x" * 40}))
    over = ProducerEvent(
        id="m", chunk={"type": "text-delta", "id": "t", "delta": "!"}, meta={"c": "y" * 10}
    )
    assert refused(streams, over).code is ErrorCode.INVALID_EVENT
    assert streams.live_parts("m") == ("Hi", [{"type": "text-start", "id": "t"}, delta])
    streams.receive(ProducerEvent(id="m", chunk={"type": "text-end", "id": "t"}))
    done = applied(streams.receive(ProducerEvent(id="m", final=True)))
    assert (done.text, done.meta) == ("Hi", {"a": 1, "b": "x" * 40})
    assert done.parts == [{"type": "text", "text": "Hi", "state": "done"}]


def test_an_abort_event_whose_meta_would_pass_the_bound_is_refused_and_aborts_nothing() -> None:
    streams = MessageStreams("c", max_meta_bytes=64)
    streams.receive(ProducerEvent(id="m", delta="so far", meta={"k": "x" * 50}))
    event = ProducerEvent(id="m", abort="error", meta={"errorText": "boom"})
    with pytest.raises(FrameRejected) as info:
        streams.cancel(event)
    assert info.value.code is ErrorCode.INVALID_EVENT
    assert streams.phase("m") is Phase.STREAMING and streams.meta_of("m") == {"k": "x" * 50}
    # Replacing the key instead fits, and the abort goes through with it.
    small = ProducerEvent(id="m", abort="error", meta={"k": "boom"})
    assert streams.cancel(small) == Unfinished("c", "m", "so far", {"k": "boom"})


def test_a_duplicate_merges_nothing_so_it_is_acked_not_refused() -> None:
    streams = MessageStreams("c", max_meta_bytes=64)
    streams.receive(ProducerEvent(id="m", delta="a", seq=1, meta={"k": "x" * 50}))
    duplicate = applied(streams.receive(ProducerEvent(id="m", seq=1, meta={"j": "y" * 10})))
    assert duplicate.duplicate and streams.meta_of("m") == {"k": "x" * 50}


def test_a_restored_message_counts_the_meta_it_had() -> None:
    streams = MessageStreams("c", max_meta_bytes=64)
    streams.restore("m", "c", 3, "so far", 1.0, {"k": "x" * 50})
    assert streams.merged_meta_bytes("m") == json_bytes({"k": "x" * 50})
    assert refused(streams, ProducerEvent(id="m", seq=4, meta={"j": "y" * 10})).code is (
        ErrorCode.INVALID_EVENT
    )
    streams.receive(ProducerEvent(id="m", seq=4, meta={"j": 1}))
    assert streams.merged_meta_bytes("m") == json_bytes({"k": "x" * 50, "j": 1}) <= 64


JSON_VALUE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"]), max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
METAS = st.dictionaries(
    st.sampled_from(["a", "b", "é", 'q"', "\n", "long key", "z" * 9]), JSON_VALUE, max_size=4
)


@settings(max_examples=300, deadline=None)
@given(st.lists(METAS, min_size=1, max_size=40), st.integers(2, 200))
def test_the_running_count_is_the_merged_metas_exact_size(
    metas: list[dict[str, Any]], bound: int
) -> None:
    streams = MessageStreams("c", max_meta_bytes=bound)
    streams.receive(ProducerEvent(id="m", delta=""))
    merged: dict[str, Any] = {}
    for meta in metas:
        event = ProducerEvent(id="m", delta="x", meta=meta)
        if json_bytes(meta) > bound or json_bytes({**merged, **meta}) > bound:
            assert refused(streams, event).code is ErrorCode.INVALID_EVENT
        else:
            streams.receive(event)
            merged.update(meta)
        assert streams.meta_of("m") == (merged or None)
        assert streams.merged_meta_bytes("m") == json_bytes(merged) <= bound


def test_meta_holding_half_a_surrogate_pair_is_refused_and_changes_nothing() -> None:
    streams = MessageStreams("c")
    applied(streams.receive(ProducerEvent(id="m", delta="ok", meta={"model": "x"})))
    event = ProducerEvent(id="m", delta="!", meta={"k": "\ud800"})  # as json.loads reads it
    error = refused(streams, event)
    assert error.code is ErrorCode.INVALID_EVENT and "surrogate" in error.message
    assert streams.partial("m") == "ok" and streams.meta_of("m") == {"model": "x"}
    applied(streams.receive(ProducerEvent(id="m", delta="!", final=True)))
