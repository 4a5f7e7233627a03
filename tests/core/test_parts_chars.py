"""What a structured message counts (:meth:`MessageParts.chars`), the size that
``--max-message-chars`` bounds and ``--max-memory-bytes`` counts: every string a part keeps
by its characters, every JSON value by the bytes of its compact UTF-8 JSON, a value replaced
counted as it is now. Sources, files, names, titles, ids, metadata, citations, error texts
and approvals count, so they can't grow a message past its bound unseen.

Every expected count is written out here, from the definition, not from the code.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from token_relay.core.errors import ErrorCode, FrameRejected, PartRejected
from token_relay.core.parts import MessageParts, PartLimits
from token_relay.core.protocol import ProducerEvent
from token_relay.core.streams import Applied, MessageStreams, Overflow, Phase

Chunk = dict[str, Any]


def js(value: Any) -> int:
    """The bytes of ``value``'s compact JSON, not escaping non-ASCII, in UTF-8."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def chars(*strings: str) -> int:
    """The characters of ``strings``, together."""
    return sum(len(string) for string in strings)


def play(message: MessageParts, events: Iterable[Mapping[str, Any]]) -> None:
    """Apply ``events``; an event that is only ``delta`` is a top-level delta."""
    for event in events:
        if set(event) == {"delta"}:
            message.delta(event["delta"])
        else:
            message.apply(event)


def built(events: Iterable[Mapping[str, Any]], limits: PartLimits | None = None) -> MessageParts:
    """A message with ``events`` applied."""
    message = MessageParts(limits) if limits else MessageParts()
    play(message, events)
    return message


META = {"openai": {"itemId": "item_1"}}
META2 = {"openai": {"itemId": "item_22", "note": "é"}}  # é is 2 bytes
TOOL_META = {"ui": {"icon": "cloud"}}
CITATION = {
    "source": {"type": "source", "sourceType": "url", "id": "s1", "url": "https://e.x"},
    "startIndex": 0,
    "endIndex": 3,
    "citedText": "abc",
}


def start(call: str = "call-1", name: str = "weather", **extra: Any) -> Chunk:
    return {"type": "tool-input-start", "toolCallId": call, "toolName": name, **extra}


def ready(value: Any, call: str = "call-1", name: str = "weather", **extra: Any) -> Chunk:
    chunk = {"type": "tool-input-available", "toolCallId": call, "toolName": name}
    return {**chunk, "input": value, **extra}


READY = [ready({"city": "Paris"})]
REQUESTED = [*READY, {"type": "tool-approval-request", "toolCallId": "call-1", "approvalId": "a"}]

# (name, the chunks before, the chunk, what the message counts more once it applied)
GROWTH: list[tuple[str, list[Chunk], Chunk, int]] = [
    (
        "source-url: id, url, title, providerMetadata",
        [],
        {
            "type": "source-url",
            "sourceId": "src-1",
            "url": "https://example.com/a",
            "title": "Example",
            "providerMetadata": META,
        },
        len("src-1") + len("https://example.com/a") + len("Example") + js(META),
    ),
    (
        "source-document: id, media type, title, filename, providerMetadata",
        [],
        {
            "type": "source-document",
            "sourceId": "d1",
            "mediaType": "application/pdf",
            "title": "Paper",
            "filename": "p.pdf",
            "providerMetadata": META,
        },
        len("d1") + len("application/pdf") + len("Paper") + len("p.pdf") + js(META),
    ),
    (
        "file: media type, url, providerMetadata",
        [],
        {
            "type": "file",
            "mediaType": "image/png",
            "url": "data:image/png;base64,AAAA",
            "providerMetadata": META,
        },
        len("image/png") + len("data:image/png;base64,AAAA") + js(META),
    ),
    (
        "data part: its name and id, and its data",
        [],
        {"type": "data-weather", "id": "w1", "data": {"city": "Paris"}},
        len("weather") + len("w1") + js({"city": "Paris"}),
    ),
    (
        "data part without id: its name and its data",
        [],
        {"type": "data-n", "data": [1, 2]},
        len("n") + js([1, 2]),
    ),
    ("a step counts nothing", [], {"type": "start-step"}, 0),
    (
        "text-start: its chunk id and providerMetadata",
        [],
        {"type": "text-start", "id": "t9", "providerMetadata": META},
        len("t9") + js(META),
    ),
    (
        "the implicit text part's id names no producer's part",
        [],
        {"type": "text-start", "id": "text"},
        0,
    ),
    (
        "reasoning-start: its chunk id and providerMetadata",
        [],
        {"type": "reasoning-start", "id": "r9", "providerMetadata": META},
        len("r9") + js(META),
    ),
    (
        "text-end: citations",
        [{"type": "text-start", "id": "t1"}, {"type": "text-delta", "id": "t1", "delta": "abc"}],
        {"type": "text-end", "id": "t1", "citations": [CITATION]},
        js([CITATION]),
    ),
    (
        "text-end: citations as kept (a key ai's schema drops, dropped)",
        [{"type": "text-start", "id": "t1"}],
        {"type": "text-end", "id": "t1", "citations": [{**CITATION, "junk": "x" * 100}]},
        js([CITATION]),
    ),
    (
        "reasoning-end: providerMetadata",
        [{"type": "reasoning-start", "id": "r1"}],
        {"type": "reasoning-end", "id": "r1", "providerMetadata": META},
        js(META),
    ),
    (
        "finish-step counts nothing",
        [{"type": "text-start", "id": "t1"}],
        {"type": "finish-step"},
        0,
    ),
    (
        "tool-input-start: id, name, title, encoding, providerMetadata, toolMetadata",
        [],
        start(
            title="Weather",
            inputEncoding="json",
            providerMetadata=META,
            toolMetadata=TOOL_META,
            providerExecuted=True,  # a boolean counts nothing
        ),
        len("call-1") + len("weather") + len("Weather") + len("json") + js(META) + js(TOOL_META),
    ),
    (
        "a dynamic tool's name, once",
        [],
        start(name="search", dynamic=True),
        len("call-1") + len("search"),
    ),
    (
        "tool-input-delta: its text (as before)",
        [start()],
        {"type": "tool-input-delta", "toolCallId": "call-1", "inputTextDelta": '{"q":'},
        len('{"q":'),
    ),
    (
        "tool-input-available, no start: id, name, input, title, providerMetadata",
        [],
        ready({"city": "Paris"}, title="Weather", providerMetadata=META),
        len("call-1") + len("weather") + js({"city": "Paris"}) + len("Weather") + js(META),
    ),
    (
        "tool-input-error, no start: id, name, input, errorText",
        [],
        {
            "type": "tool-input-error",
            "toolCallId": "call-1",
            "toolName": "weather",
            "input": "not json",
            "errorText": "bad input",
        },
        len("call-1") + len("weather") + js("not json") + len("bad input"),
    ),
    (
        "tool-approval-request: the approval",
        READY,
        {
            "type": "tool-approval-request",
            "toolCallId": "call-1",
            "approvalId": "ap-1",
            "approvalDescriptor": {"risk": "low"},
            "inputSchemaInput": {"city": "Paris"},
            "reason": "asks the user",
            "isAutomatic": True,
            "signature": "sig",
        },
        js(
            {
                "id": "ap-1",
                "descriptor": {"risk": "low"},
                "inputSchemaInput": {"city": "Paris"},
                "requestReason": "asks the user",
                "isAutomatic": True,
                "signature": "sig",
            }
        ),
    ),
    (
        "tool-approval-response: the approval replaced, providerMetadata",
        REQUESTED,
        {
            "type": "tool-approval-response",
            "approvalId": "a",
            "approved": True,
            "reason": "fine by me",
            "providerMetadata": META,
        },
        js({"id": "a", "approved": True, "reason": "fine by me"}) - js({"id": "a"}) + js(META),
    ),
    (
        "tool-output-available: output, providerMetadata, toolMetadata",
        READY,
        {
            "type": "tool-output-available",
            "toolCallId": "call-1",
            "output": {"celsius": 21},
            "providerMetadata": META,
            "toolMetadata": TOOL_META,
        },
        js({"celsius": 21}) + js(META) + js(TOOL_META),
    ),
    (
        "tool-output-error: errorText",
        READY,
        {"type": "tool-output-error", "toolCallId": "call-1", "errorText": "it broke"},
        len("it broke"),
    ),
    (
        "tool-output-error while the input streams: errorText and the input it holds",
        [
            start(),
            {"type": "tool-input-delta", "toolCallId": "call-1", "inputTextDelta": '{"q":"pa'},
        ],
        {"type": "tool-output-error", "toolCallId": "call-1", "errorText": "it broke"},
        # Its input, repaired, is held now; rawInput is the input text, counted already.
        len("it broke") + js({"q": "pa"}),
    ),
    (
        "tool-output-denied counts nothing",
        READY,
        {"type": "tool-output-denied", "toolCallId": "call-1"},
        0,
    ),
]


@pytest.mark.parametrize(
    ("before", "chunk", "growth"),
    [case[1:] for case in GROWTH],
    ids=[case[0] for case in GROWTH],
)
def test_a_chunk_makes_the_message_count_exactly_what_it_adds(
    before: list[Chunk], chunk: Chunk, growth: int
) -> None:
    message = built(before)
    was = message.chars()
    message.apply(chunk)
    assert message.chars() - was == growth


def test_a_message_counts_nothing_before_its_first_chunk_and_a_top_level_delta_its_text() -> None:
    message = MessageParts()
    assert message.chars() == 0
    message.delta("Hi")
    assert message.chars() == 2


# ------------------------------------------------------------------ replaced values


def test_provider_metadata_given_again_replaces_what_it_counted() -> None:
    message = built([{"type": "text-start", "id": "t1", "providerMetadata": META}])
    assert message.chars() == len("t1") + js(META)
    message.apply({"type": "text-delta", "id": "t1", "delta": "ab", "providerMetadata": META2})
    assert message.chars() == len("t1") + len("ab") + js(META2)
    message.apply({"type": "text-delta", "id": "t1", "delta": "c"})  # none: kept
    assert message.chars() == len("t1") + len("abc") + js(META2)
    message.apply({"type": "text-end", "id": "t1", "providerMetadata": META})
    assert message.chars() == len("t1") + len("abc") + js(META)
    reasoning = built([{"type": "reasoning-start", "id": "r", "providerMetadata": META2}])
    reasoning.apply({"type": "reasoning-end", "id": "r"})  # none on the end: kept
    assert reasoning.chars() == len("r") + js(META2)


def test_a_tool_counts_what_it_holds_at_each_state_not_what_it_was_sent() -> None:
    message = built([start(providerMetadata=META)])
    names = len("call-1") + len("weather")
    assert message.chars() == names + js(META)
    message.apply({"type": "tool-input-delta", "toolCallId": "call-1", "inputTextDelta": '{"c":1}'})
    assert message.chars() == names + js(META) + len('{"c":1}')
    # The call's providerMetadata is replaced; the input is held beside its text.
    message.apply(ready({"c": 1}, providerMetadata=META2))
    held = names + len('{"c":1}') + js({"c": 1})
    assert message.chars() == held + js(META2)
    message.apply({"type": "tool-approval-request", "toolCallId": "call-1", "approvalId": "ap"})
    assert message.chars() == held + js(META2) + js({"id": "ap"})
    message.apply({"type": "tool-approval-response", "approvalId": "ap", "approved": True})
    approval = {"id": "ap", "approved": True}
    assert message.chars() == held + js(META2) + js(approval)
    preliminary = {
        "type": "tool-output-available",
        "toolCallId": "call-1",
        "output": {"partial": "x" * 50},
        "preliminary": True,
    }
    message.apply(preliminary)
    assert message.chars() == held + js(META2) + js(approval) + js({"partial": "x" * 50})
    message.apply(
        {
            "type": "tool-output-available",
            "toolCallId": "call-1",
            "output": {"t": 22},
            "providerMetadata": META,
        }
    )
    # The final output replaces the preliminary one; its metadata is the result's.
    assert message.chars() == held + js(META2) + js(approval) + js({"t": 22}) + js(META)
    assert message.parts()[0]["callProviderMetadata"] == META2
    assert message.parts()[0]["resultProviderMetadata"] == META


def test_an_error_after_a_preliminary_output_drops_the_output_from_the_count() -> None:
    message = built(READY)
    message.apply(
        {
            "type": "tool-output-available",
            "toolCallId": "call-1",
            "output": [1],
            "preliminary": True,
        }
    )
    with_output = message.chars()
    message.apply({"type": "tool-output-error", "toolCallId": "call-1", "errorText": "e"})
    assert message.chars() == with_output - js([1]) + len("e")
    assert "output" not in message.parts()[0]


def test_a_data_part_replaced_by_id_counts_its_name_and_id_once() -> None:
    message = MessageParts()
    for data in ({"n": 1}, {"n": 12345}, "é" * 10, None):
        message.apply({"type": "data-progress", "id": "job-7", "data": data})
        assert message.chars() == len("progress") + len("job-7") + js(data)
    message.apply({"type": "data-progress", "id": "job-8", "data": 1, "transient": True})
    assert message.chars() == len("progress") + len("job-7") + js(None)  # not stored


def test_a_refused_chunk_counts_nothing() -> None:
    message = built(READY)
    was = message.chars()
    with pytest.raises(PartRejected):
        message.apply({"type": "tool-approval-request", "toolCallId": "call-1"})  # no id
    assert message.chars() == was
    full = built([{"type": "start-step"}], PartLimits(max_parts=1))
    with pytest.raises(PartRejected):
        full.apply({"type": "source-url", "sourceId": "s", "url": "u" * 1000})
    assert full.chars() == 0


# ------------------------------------------------------------------ no drift

RICH: list[Chunk] = [
    {"type": "start-step"},
    {"type": "reasoning-start", "id": "r1", "providerMetadata": META},
    {"type": "reasoning-delta", "id": "r1", "delta": "Let me look"},
    {"type": "reasoning-delta", "id": "r1", "delta": " it up.", "providerMetadata": META2},
    {"type": "reasoning-end", "id": "r1", "providerMetadata": META},
    start(title="Weather", providerMetadata=META, toolMetadata=TOOL_META, providerExecuted=False),
    {"type": "tool-input-delta", "toolCallId": "call-1", "inputTextDelta": '{"city":'},
    {"type": "tool-input-delta", "toolCallId": "call-1", "inputTextDelta": '"Paris"}'},
    ready({"city": "Paris"}, title="Weather", providerMetadata=META2),
    {
        "type": "tool-approval-request",
        "toolCallId": "call-1",
        "approvalId": "ap-1",
        "approvalDescriptor": {"risk": "low"},
        "reason": "asks",
    },
    {"type": "tool-approval-response", "approvalId": "ap-1", "approved": True, "reason": "ok"},
    {"type": "data-status", "id": "s", "data": {"phase": 1}},
    {
        "type": "tool-output-available",
        "toolCallId": "call-1",
        "output": {"celsius": 2},
        "preliminary": True,
        "providerMetadata": META,
    },
    {"type": "tool-output-available", "toolCallId": "call-1", "output": {"celsius": 21}},
    {
        "type": "source-url",
        "sourceId": "src-1",
        "url": "https://e.x/1",
        "title": "E",
        "providerMetadata": META,
    },
    {
        "type": "source-document",
        "sourceId": "d1",
        "mediaType": "text/plain",
        "title": "D",
        "filename": "d.txt",
    },
    {
        "type": "file",
        "mediaType": "image/png",
        "url": "data:image/png;base64,AA",
        "providerMetadata": META,
    },
    {"type": "finish-step"},
    {"type": "start-step"},
    {"type": "text-start", "id": "t1", "providerMetadata": META},
    {"type": "text-delta", "id": "t1", "delta": "It is 21 °C"},
    {"type": "data-status", "id": "s", "data": {"phase": 2, "done": True}},
    {"type": "text-delta", "id": "t1", "delta": " in Paris."},
    {"type": "text-end", "id": "t1", "citations": [CITATION], "providerMetadata": META2},
    start("call-2", "lookup", dynamic=True, inputEncoding="text"),
    {"type": "tool-input-delta", "toolCallId": "call-2", "inputTextDelta": "what is "},
    {"type": "data-note", "data": ["n"]},
    {"type": "tool-input-delta", "toolCallId": "call-2", "inputTextDelta": "this?"},
    start("call-3", "calc"),
    {"type": "tool-input-delta", "toolCallId": "call-3", "inputTextDelta": '{"x": 1'},
    {"type": "tool-output-error", "toolCallId": "call-3", "errorText": "boom"},
    start("call-4", "calc"),
    {"type": "tool-input-delta", "toolCallId": "call-4", "inputTextDelta": '{"y": [1, 2]}'},
    {"delta": "And "},
    start("call-5", "calc"),
    {"type": "tool-input-delta", "toolCallId": "call-5", "inputTextDelta": '{"z": nu'},
    {"delta": "more."},
]
"""A reply that holds every field a part can count, and tools left streaming (``call-2``
with text input, ``call-4`` whole JSON, ``call-5`` not JSON) for finalize to complete."""


def test_the_rich_reply_counts_every_field_it_holds() -> None:
    """The reply's count, written out part by part from the definition."""
    expected = (
        # reasoning r1: id, text, its last providerMetadata
        len("r1")
        + len("Let me look it up.")
        + js(META)
        # tool call-1: id, name, title, toolMetadata, call metadata (replaced), input text,
        # input, approval (replaced), output (replaced), result metadata (kept)
        + chars("call-1", "weather", "Weather")
        + js(TOOL_META)
        + js(META2)
        + len('{"city":"Paris"}')
        + js({"city": "Paris"})
        + js(
            {
                "id": "ap-1",
                "descriptor": {"risk": "low"},
                "requestReason": "asks",
                "approved": True,
                "reason": "ok",
            }
        )
        + js({"celsius": 21})
        + js(META)
        # data-status s, replaced in place
        + chars("status", "s")
        + js({"phase": 2, "done": True})
        # the sources and the file
        + chars("src-1", "https://e.x/1", "E")
        + js(META)
        + chars("d1", "text/plain", "D", "d.txt")
        + chars("image/png", "data:image/png;base64,AA")
        + js(META)
        # text t1: id, text, metadata (the end's), citations
        + len("t1")
        + len("It is 21 °C in Paris.")
        + js(META2)
        + js([CITATION])
        # call-2 (dynamic): id, name, encoding, input text so far
        + chars("call-2", "lookup", "text", "what is this?")
        # data-note
        + len("note")
        + js(["n"])
        # call-3: id, name, input text, errorText, its input repaired ({"x": 1})
        + chars("call-3", "calc", '{"x": 1', "boom")
        + js({"x": 1})
        # call-4, call-5: id, name, input text so far
        + chars("call-4", "calc", '{"y": [1, 2]}')
        + chars("call-5", "calc", '{"z": nu')
        # the implicit text part: its text only
        + len("And more.")
    )
    assert built(RICH).chars() == expected


def split(events: list[Chunk]) -> list[Chunk]:
    """The same reply with every text, reasoning and input delta (top-level ones too) cut
    into one-character deltas; a delta's ``providerMetadata`` goes with its last piece."""
    out: list[Chunk] = []
    for event in events:
        key = "inputTextDelta" if event.get("type") == "tool-input-delta" else "delta"
        text = event.get(key)
        if isinstance(text, str) and len(text) > 1:
            pieces = [{**event, key: char} for char in text]
            for piece in pieces[:-1]:
                piece.pop("providerMetadata", None)
            out.extend(pieces)
        else:
            out.append(event)
    return out


def test_the_count_is_the_same_however_the_deltas_are_split() -> None:
    whole = built(RICH)
    pieces = built(split(RICH))
    assert pieces.parts() == whole.parts()
    assert pieces.chars() == whole.chars()
    whole.finalize()
    pieces.finalize()
    assert pieces.chars() == whole.chars()


def test_a_catch_up_at_every_cut_counts_what_the_whole_reply_counts() -> None:
    whole = built(RICH)
    for cut in range(len(RICH) + 1):
        prefix = built(RICH[:cut])
        joiner = built(prefix.catch_up())
        assert joiner.chars() == prefix.chars(), cut
        play(joiner, RICH[cut:])
        assert joiner.parts() == whole.parts(), cut
        assert joiner.chars() == whole.chars(), cut


def test_finalize_counts_what_it_completed_as_the_catch_up_of_the_result_does() -> None:
    """Finalize completes the streaming tools (input parsed, or failed): the finalized
    message counts what it then holds, as a reader rebuilt from its catch-up counts it."""
    for cut in range(len(RICH) + 1):
        message = built(RICH[:cut])
        message.finalize()
        rebuilt = built(message.catch_up())
        assert rebuilt.parts() == message.parts(), cut
        assert rebuilt.chars() == message.chars(), cut
    finalized = built(RICH)
    before = finalized.chars()
    finalized.finalize()
    # call-2's text input becomes its input (and its inputEncoding goes, as ai drops it
    # once the input is whole); call-4's parses; call-5 fails, saying why, holding its
    # input repaired ('{"z": nu' repairs to {"z": null}).
    [error] = [p["errorText"] for p in finalized.parts() if p.get("toolCallId") == "call-5"]
    assert finalized.chars() == (
        before
        + js("what is this?")
        - len("text")
        + js({"y": [1, 2]})
        + len(error)
        + js({"z": None})
    )


# ------------------------------------------------------------------ the audit's case

URL = "https://example.com/" + "a" * 999_980  # 1,000,000 characters


def test_255_sources_of_a_megabyte_count_255_megabytes() -> None:
    """The audit's case: a source's url counted nothing, so 255 source-url chunks of 1 MB
    made a 255 MB message that counted 0. Now each counts its id and url."""
    message = MessageParts()
    for n in range(255):
        message.apply({"type": "source-url", "sourceId": f"s{n:03}", "url": URL})
    assert message.chars() == 255 * (len("s000") + 1_000_000)


def _sources(streams: MessageStreams, message_id: str, count: int, url: str) -> list[Any]:
    """``count`` source-url chunks for ``message_id``, ids ``s0``, ``s1``, …: each result."""
    return [
        streams.receive(
            ProducerEvent(
                id=message_id, chunk={"type": "source-url", "sourceId": f"s{n}", "url": url}
            )
        )
        for n in range(count)
    ]


def test_the_relays_check_ends_a_message_of_long_urls_at_its_bound() -> None:
    """The streams' check (``--max-message-chars``) on the parts' count: the source that
    takes the message past it aborts it as too large, its parts so far kept; a first
    chunk past it is refused, nothing applied; what completes is counted as held."""
    streams = MessageStreams("c", max_chars=10_000, part_limits=PartLimits())
    url = "u" * 998  # a source counts 1,000: "s<n>" is 2 characters for n < 10
    results = _sources(streams, "m", 10, url)
    assert all(isinstance(result, Applied) for result in results)
    assert streams.held_chars() == 10_000  # at the bound exactly: still fine
    over = streams.receive(
        ProducerEvent(id="m", chunk={"type": "source-url", "sourceId": "s10", "url": url})
    )
    assert isinstance(over, Overflow)
    assert over.rejection.code is ErrorCode.MESSAGE_TOO_LARGE
    assert len(over.unfinished.parts) == 11  # the source that passed it, applied, then ended
    assert streams.phase("m") is Phase.ABORTED
    assert streams.held_chars() == 0
    with pytest.raises(FrameRejected) as refused:
        streams.receive(
            ProducerEvent(
                id="n", chunk={"type": "source-url", "sourceId": "s", "url": "u" * 10_000}
            )
        )
    assert refused.value.code is ErrorCode.MESSAGE_TOO_LARGE
    assert streams.phase("n") is None
    # Another message completes, its sources counted as the relay holds them.
    results = _sources(streams, "ok", 3, url)
    assert all(isinstance(result, Applied) for result in results)
    done = streams.receive(ProducerEvent(id="ok", final=True))
    assert isinstance(done, Applied) and done.parts is not None and len(done.parts) == 3
    assert streams.completed_chars == 3_000
