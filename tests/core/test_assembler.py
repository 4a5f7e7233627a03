"""Tests for token_relay.core.assembler: the seed spec's rules, one test each, then the extras."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from token_relay.core.assembler import RUN, TokenAssembler

# ----------------------------------------------------------------- the seed's example


def test_seed_example_verbatim() -> None:
    a = TokenAssembler()
    assert a.apply({"id": "m", "delta": "hel"}) is None
    assert a.apply({"id": "m", "delta": "lo", "final": True}) == "hello"
    assert a.apply({"id": "m", "delta": "ignored", "final": True}) == "hello"
    assert a.apply({"id": "empty", "final": True}) == ""
    assert a.get("empty") == ""
    assert a.get("unseen") is None


# ------------------------------------------------------------- the seed's rules, one each


def test_rule_state_is_per_instance() -> None:
    first = TokenAssembler()
    second = TokenAssembler()
    first.apply({"id": "m", "delta": "one"})
    second.apply({"id": "m", "delta": "two", "final": True})
    assert first.get("m") == "one"
    assert first.is_completed("m") is False
    assert second.get("m") == "two"
    assert second.is_completed("m") is True


def test_rule_apply_processes_one_event_dict() -> None:
    a = TokenAssembler()
    assert a.apply({"id": "m", "delta": "x"}) is None
    assert a.get("m") == "x"
    assert a.apply({"id": "m", "delta": "y"}) is None
    assert a.get("m") == "xy"


def test_rule_missing_final_is_false() -> None:
    a = TokenAssembler()
    assert a.apply({"id": "m", "delta": "x"}) is None
    assert a.is_completed("m") is False
    assert a.is_streaming("m") is True
    assert a.apply({"id": "m", "delta": "y", "final": True}) == "xy"


def test_rule_final_false_is_not_final() -> None:
    a = TokenAssembler()
    assert a.apply({"id": "m", "delta": "x", "final": False}) is None
    assert a.is_completed("m") is False
    assert a.apply({"id": "m", "delta": "y", "final": False}) is None
    assert a.get("m") == "xy"


def test_rule_delta_is_appended() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "Hello"})
    a.apply({"id": "m", "delta": ", "})
    a.apply({"id": "m", "delta": "world"})
    assert a.get("m") == "Hello, world"


def test_rule_empty_string_deltas_are_kept() -> None:
    a = TokenAssembler()
    assert a.apply({"id": "m", "delta": ""}) is None
    assert a.get("m") == ""
    assert a.apply({"id": "m", "delta": "a"}) is None
    assert a.get("m") == "a"
    assert a.apply({"id": "m", "delta": ""}) is None
    assert a.get("m") == "a"
    assert a.apply({"id": "m", "final": True}) == "a"
    assert a.get("m") == "a"


def test_rule_empty_delta_alone_creates_message() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": ""})
    assert a.is_streaming("m") is True
    assert a.get("m") == ""
    assert a.apply({"id": "m", "delta": "", "final": True}) == ""


def test_rule_final_returns_full_text_and_marks_complete() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "ab"})
    assert a.apply({"id": "m", "delta": "cd", "final": True}) == "abcd"
    assert a.is_completed("m") is True
    assert a.is_streaming("m") is False
    assert a.get("m") == "abcd"


def test_rule_final_delta_is_appended_before_completing() -> None:
    a = TokenAssembler()
    assert a.apply({"id": "m", "delta": "only", "final": True}) == "only"
    assert a.get("m") == "only"


def test_rule_not_final_returns_none() -> None:
    a = TokenAssembler()
    assert a.apply({"id": "m"}) is None
    assert a.apply({"id": "m", "delta": "x"}) is None
    assert a.apply({"id": "m", "delta": "", "final": False}) is None


def test_rule_get_returns_current_text_or_none() -> None:
    a = TokenAssembler()
    assert a.get("m") is None
    a.apply({"id": "m", "delta": "par"})
    assert a.get("m") == "par"
    a.apply({"id": "m", "delta": "tial"})
    assert a.get("m") == "partial"
    a.apply({"id": "m", "final": True})
    assert a.get("m") == "partial"
    assert a.get("other") is None


def test_rule_deltas_for_finalized_id_are_ignored() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "done", "final": True})
    assert a.apply({"id": "m", "delta": " more"}) is None
    assert a.apply({"id": "m", "delta": " again"}) is None
    assert a.get("m") == "done"


def test_rule_repeated_final_ignores_new_delta_and_returns_same_text() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "hel"})
    first = a.apply({"id": "m", "delta": "lo", "final": True})
    assert first == "hello"
    assert a.apply({"id": "m", "delta": "ignored", "final": True}) == "hello"
    assert a.apply({"id": "m", "final": True}) == "hello"
    assert a.apply({"id": "m", "delta": "", "final": True}) == "hello"
    assert a.get("m") == "hello"


def test_rule_non_final_after_finalize_returns_none_and_keeps_text() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "kept", "final": True})
    assert a.apply({"id": "m"}) is None
    assert a.apply({"id": "m", "delta": "x"}) is None
    assert a.apply({"id": "m", "delta": "y", "final": False}) is None
    assert a.get("m") == "kept"
    assert a.is_completed("m") is True


def test_rule_event_without_delta_creates_message_with_empty_text() -> None:
    a = TokenAssembler()
    assert a.apply({"id": "m"}) is None
    assert a.get("m") == ""
    assert a.is_streaming("m") is True
    assert a.streaming_count == 1


def test_rule_finalizing_unseen_id_returns_empty_string() -> None:
    a = TokenAssembler()
    assert a.apply({"id": "never", "final": True}) == ""
    assert a.get("never") == ""
    assert a.is_completed("never") is True


def test_rule_empty_string_is_a_valid_id() -> None:
    a = TokenAssembler()
    a.apply({"id": "", "delta": "x"})
    assert a.get("") == "x"
    assert a.apply({"id": "", "delta": "y", "final": True}) == "xy"
    assert a.get("") == "xy"


def test_rule_delta_may_be_part_of_a_word_or_any_characters() -> None:
    a = TokenAssembler()
    for delta in ["ext", "raord", "in", "ary ", "caf", "\u00e9 ", "\U0001f600", "\n\t", "\x00"]:
        a.apply({"id": "m", "delta": delta})
    assert a.apply({"id": "m", "final": True}) == "extraordinary caf\u00e9 \U0001f600\n\t\x00"


def test_rule_repeated_non_final_events_append_again() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "ab"})
    a.apply({"id": "m", "delta": "ab"})
    a.apply({"id": "m", "delta": "ab"})
    assert a.get("m") == "ababab"
    assert a.apply({"id": "m", "final": True}) == "ababab"


def test_rule_interleaved_ids() -> None:
    a = TokenAssembler()
    assert a.apply({"id": "a", "delta": "A1"}) is None
    assert a.apply({"id": "b", "delta": "B1"}) is None
    assert a.apply({"id": "a", "delta": "A2"}) is None
    assert a.apply({"id": "c"}) is None
    assert a.apply({"id": "b", "delta": "B2", "final": True}) == "B1B2"
    assert a.apply({"id": "a", "delta": "A3"}) is None
    assert a.get("a") == "A1A2A3"
    assert a.get("b") == "B1B2"
    assert a.get("c") == ""
    assert a.apply({"id": "a", "final": True}) == "A1A2A3"
    assert a.apply({"id": "c", "delta": "C", "final": True}) == "C"
    assert (a.get("a"), a.get("b"), a.get("c")) == ("A1A2A3", "B1B2", "C")


def test_rule_finalizing_twice_is_idempotent() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "x"})
    results = [a.apply({"id": "m", "final": True}) for _ in range(3)]
    assert results == ["x", "x", "x"]
    assert a.completed_count == 1
    assert a.streaming_count == 0


# ------------------------------------------------------------------- cost and caching


def test_completed_text_is_cached_not_rejoined() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "hel"})
    a.apply({"id": "m", "delta": "lo "})
    text = a.apply({"id": "m", "delta": "world", "final": True})
    assert text == "hello world"
    assert a.get("m") is a.get("m")
    assert a.get("m") is text
    assert a.apply({"id": "m", "delta": "ignored", "final": True}) is text


def test_finalize_releases_parts() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "a"})
    a.apply({"id": "m", "delta": "b"})
    assert a.is_streaming("m") is True
    assert a.is_completed("m") is False
    a.apply({"id": "m", "final": True})
    assert a.is_streaming("m") is False
    assert a.is_completed("m") is True
    assert a.streaming_count == 0
    assert a.completed_count == 1
    assert list(a.streaming_ids()) == []


def test_streaming_ids_in_first_seen_order() -> None:
    a = TokenAssembler()
    a.apply({"id": "b", "delta": "1"})
    a.apply({"id": "a"})
    a.apply({"id": "c", "delta": "2"})
    a.apply({"id": "b", "delta": "3"})
    a.apply({"id": "a", "final": True})
    assert list(a.streaming_ids()) == ["b", "c"]
    assert a.streaming_count == 2
    assert a.completed_count == 1


# ------------------------------------------------------------ feed, discard and forget


def test_feed_is_the_typed_form_of_apply() -> None:
    a = TokenAssembler()
    assert a.feed("m", None) is None
    assert a.get("m") == ""
    assert a.feed("m", "") is None
    assert a.feed("m", "ab") is None
    assert a.feed("m", "c", final=False) is None
    assert a.feed("m", "d", True) == "abcd"
    assert a.feed("m", "e", True) == "abcd"
    assert a.feed("m", "f") is None
    assert a.get("m") == "abcd"
    assert a.feed("unseen", None, True) == ""


def test_discard_returns_partial_and_drops_state() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "par"})
    a.apply({"id": "m", "delta": "tial"})
    a.apply({"id": "keep", "delta": "k"})
    assert a.discard("m") == "partial"
    assert a.get("m") is None
    assert a.is_streaming("m") is False
    assert a.is_completed("m") is False
    assert a.streaming_count == 1
    assert a.get("keep") == "k"
    assert a.discard("m") is None


def test_discard_of_message_without_delta_returns_empty_string() -> None:
    a = TokenAssembler()
    a.apply({"id": "m"})
    assert a.discard("m") == ""
    assert a.get("m") is None


def test_discard_does_not_touch_completed_or_unknown_ids() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "done", "final": True})
    assert a.discard("m") is None
    assert a.get("m") == "done"
    assert a.is_completed("m") is True
    assert a.discard("unseen") is None
    assert a.get("unseen") is None


def test_discarded_id_starts_afresh() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "old"})
    a.discard("m")
    assert a.apply({"id": "m", "delta": "new", "final": True}) == "new"


def test_forget_releases_completed_text_and_id_starts_afresh() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "old", "final": True})
    a.forget("m")
    assert a.get("m") is None
    assert a.is_completed("m") is False
    assert a.completed_count == 0
    assert a.apply({"id": "m", "delta": "new"}) is None
    assert a.get("m") == "new"
    assert a.is_streaming("m") is True
    assert a.apply({"id": "m", "final": True}) == "new"


def test_forget_does_not_touch_streaming_or_unknown_ids() -> None:
    a = TokenAssembler()
    a.apply({"id": "m", "delta": "x"})
    a.forget("m")
    a.forget("unseen")
    assert a.get("m") == "x"
    assert a.is_streaming("m") is True
    assert a.get("unseen") is None


# --------------------------------------------------------------- property: reference model


class _ReferenceAssembler:
    """The seed rules, naively: a dict of strings and a set of finalized ids."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.finalized: set[str] = set()

    def apply(self, event: dict[str, object]) -> str | None:
        message_id = event["id"]
        assert isinstance(message_id, str)
        final = event.get("final", False) is True
        if message_id in self.finalized:
            return self.texts[message_id] if final else None
        text = self.texts.get(message_id, "")
        if "delta" in event:
            delta = event["delta"]
            assert isinstance(delta, str)
            text += delta
        self.texts[message_id] = text
        if final:
            self.finalized.add(message_id)
            return text
        return None

    def get(self, message_id: str) -> str | None:
        return self.texts.get(message_id)


IDS = ["a", "b", "c", ""]

EVENTS = st.fixed_dictionaries(
    {"id": st.sampled_from(IDS)},
    optional={"delta": st.text(max_size=6), "final": st.booleans()},
)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=40))
def test_matches_reference_model(events: list[dict[str, object]]) -> None:
    actual = TokenAssembler()
    expected = _ReferenceAssembler()
    for event in events:
        assert actual.apply(event) == expected.apply(event)
        for message_id in [*IDS, "unseen"]:
            assert actual.get(message_id) == expected.get(message_id)
            assert actual.is_completed(message_id) == (message_id in expected.finalized)
            assert actual.is_streaming(message_id) == (
                message_id in expected.texts and message_id not in expected.finalized
            )


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=40), st.lists(st.text(max_size=3), max_size=RUN * 2 + 3))
def test_append_is_feed_for_a_streaming_message_and_else_changes_nothing(
    events: list[dict[str, object]], deltas: list[str]
) -> None:
    """The hot path: ``append`` does what ``feed`` does to a streaming message (past RUN
    deltas too), and refuses any other id without a change."""
    short, long = TokenAssembler(), TokenAssembler()
    for event in events:
        short.apply(event)
        long.apply(event)
    for index, delta in enumerate(deltas):
        message_id = [*IDS, "unseen"][index % 5]
        streaming = long.is_streaming(message_id)
        assert short.append(message_id, delta) is streaming
        if streaming:
            assert long.feed(message_id, delta) is None
        for other in [*IDS, "unseen"]:
            assert short.get(other) == long.get(other)
            assert short.is_streaming(other) == long.is_streaming(other)
            assert short.is_completed(other) == long.is_completed(other)


def test_long_messages_are_joined_in_runs_and_stay_exact() -> None:
    """Past RUN deltas a message's deltas are joined a run at a time: the text, the partial
    text and the interleaving with other messages are unchanged, empty deltas included."""
    assembler = TokenAssembler()
    expected: dict[str, list[str]] = {"a": [], "b": []}
    for n in range(RUN * 3 + 7):
        for message_id in ("a", "b"):
            delta = "" if n % 5 == 0 else f"{message_id}{n}é🚀 "
            assembler.feed(message_id, delta)
            expected[message_id].append(delta)
        if n in (RUN - 1, RUN, 2 * RUN + 1):
            assert assembler.get("a") == "".join(expected["a"])
    parts = assembler._parts["a"]
    assert len(parts) < RUN + 3  # joined, not one string per delta
    assert assembler.feed("b", "end", final=True) == "".join(expected["b"]) + "end"
    assert assembler.discard("a") == "".join(expected["a"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(["", "a", "bc", "é", "\U0001f600"]), max_size=2 * RUN),
        max_size=8,
    ),
    st.booleans(),
)
def test_extend_appends_a_run_of_deltas_as_append_does_each(
    runs: list[list[str]], finish: bool
) -> None:
    """``extend`` gives the text ``append`` gives, delta by delta, across :data:`RUN`."""
    together, one_by_one = TokenAssembler(), TokenAssembler()
    assert not together.extend("m", ["x"])  # not streaming: nothing changes
    assert together.get("m") is None
    for assembler in (together, one_by_one):
        assembler.feed("m", None)
    for deltas in runs:
        assert together.extend("m", deltas)
        for delta in deltas:
            assert one_by_one.append("m", delta)
        assert together.get("m") == one_by_one.get("m")
        assert len(together._parts["m"]) < RUN * 3  # joined in runs, not a string per delta
    if finish:
        assert together.feed("m", None, True) == one_by_one.feed("m", None, True)
        assert not together.extend("m", ["y"])  # completed: ignored, as the seed says
        assert together.get("m") == one_by_one.get("m")


def test_extend_joins_a_long_message_in_runs() -> None:
    """Runs of deltas given to ``extend`` are joined a run at a time, as ``append`` joins."""
    assembler = TokenAssembler()
    assembler.feed("m", None)
    deltas = [f"{n}é " for n in range(RUN * 5)]
    for at in range(0, len(deltas), 10):
        assert assembler.extend("m", deltas[at : at + 10])
    assert len(assembler._parts["m"]) < RUN + 3  # joined, not one string per delta
    assert assembler.feed("m", None, True) == "".join(deltas)
