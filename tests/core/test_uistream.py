"""One reply as UI message chunks, synchronously: what a reader that holds part of a reply
is sent (:func:`catch_up_from`, ``ReplyChunks(held=...)``), and the frames of the WebSocket
chat transport, with exact values."""

from __future__ import annotations

from typing import Any

import pytest
from token_relay.core.chatframes import ChatResume, ChatSend, decode_chat_frame
from token_relay.core.errors import FrameRejected
from token_relay.core.uistream import ReplyChunks, catch_up_from, reader_state

START_R = {"type": "reasoning-start", "id": "r1"}
END_R = {"type": "reasoning-end", "id": "r1"}
START_T = {"type": "text-start", "id": "t1"}
START_IMPLICIT = {"type": "text-start", "id": "text"}


def _delta(text: str, part: str = "t1") -> dict[str, Any]:
    return {"type": "text-delta", "id": part, "delta": text}


def test_a_reader_gets_only_the_rest_of_each_text_and_what_it_lacks() -> None:
    held = [START_T, _delta("Hel")]
    now = [START_T, _delta("Hello"), {"type": "text-end", "id": "t1"}, START_R]
    assert catch_up_from(held, now) == [_delta("lo"), {"type": "text-end", "id": "t1"}, START_R]
    assert catch_up_from(now, now) == []
    assert catch_up_from([], now) == now
    # A part with no text yet has no delta: its first one comes whole.
    assert catch_up_from([START_T], [START_T, _delta("Hi")]) == [_delta("Hi")]
    tool = {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": '{"a":'}
    longer = {**tool, "inputTextDelta": '{"a":1}'}
    assert catch_up_from([tool], [longer]) == [{**tool, "inputTextDelta": "1}"}]


def test_a_reader_of_another_reply_is_refused() -> None:
    with pytest.raises(FrameRejected, match="not a beginning"):
        catch_up_from([START_T, _delta("Bye")], [START_T, _delta("Hello")])
    with pytest.raises(FrameRejected, match="does not have"):
        catch_up_from([START_T, START_R], [START_T])


def test_parts_named_anew_are_matched_by_order() -> None:
    held = [START_T, _delta("Hel")]
    rebuilt = [
        {"type": "text-start", "id": "text-1"},
        _delta("Hello", "text-1"),
        {"type": "text-end", "id": "text-1"},
        {"type": "text-start", "id": "text-2"},
    ]
    assert catch_up_from(held, rebuilt, by_order=True) == [
        _delta("lo"),
        {"type": "text-end", "id": "t1"},
        {"type": "text-start", "id": "text-2"},
    ]


def test_a_held_reader_of_a_plain_reply_gets_no_second_start() -> None:
    sent: list[dict[str, Any]] = []
    held = reader_state([{"type": "start"}, {"type": "text-start", "id": "text"}])
    reply = ReplyChunks("m1", sent.append, held=held)
    reply.frame({"type": "snapshot", "channel": "c", "id": "m1", "text": "Hello"})
    assert reply.decide()
    reply.frame({"type": "delta", "channel": "c", "id": "m1", "delta": "!"})
    reply.frame({"type": "message", "channel": "c", "id": "m1", "text": "Hello!"})
    assert sent == [
        {"type": "text-delta", "id": "text", "delta": "Hello"},
        {"type": "text-delta", "id": "text", "delta": "!"},
        {"type": "text-end", "id": "text"},
        {"type": "finish"},
    ]
    assert reply.done


def test_a_held_reader_of_a_plain_reply_that_completed() -> None:
    sent: list[dict[str, Any]] = []
    held = reader_state([{"type": "text-start", "id": "text"}, _delta("Hel", "text")])
    reply = ReplyChunks("m1", sent.append, held=held)
    reply.frame({"type": "message", "channel": "c", "id": "m1", "text": "Hello"})
    assert reply.decide()
    assert sent == [_delta("lo", "text"), {"type": "text-end", "id": "text"}, {"type": "finish"}]


def test_the_transport_frames_are_strict() -> None:
    frame = decode_chat_frame('{"type":"resume","requestId":"r","id":"c","lastSequence":2}')
    assert frame == ChatResume(type="resume", requestId="r", id="c", lastSequence=2)
    send = decode_chat_frame(
        '{"type":"send","requestId":"r","id":"c","trigger":"submit-message","messages":[],'
        '"headers":{"a":"b"},"body":{"x":1}}'
    )
    assert isinstance(send, ChatSend) and send.body == {"x": 1}
    with pytest.raises(FrameRejected) as refused:
        decode_chat_frame('{"type":"send","requestId":"r","id":"c","trigger":"other"}')
    assert refused.value.message_id == "r"
    assert refused.value.code.value == "invalid_frame"
    with pytest.raises(FrameRejected) as refused:
        decode_chat_frame('{"type":"resume","requestId":"r","id":"","headers":{}}')
    assert refused.value.message.startswith("id: ")
    with pytest.raises(FrameRejected) as refused:
        decode_chat_frame("{")
    assert refused.value.code.value == "invalid_json" and refused.value.message_id is None


def _served(frames: list[dict[str, Any]], joined_after: int, wanted: str | None = None) -> Any:
    """What a reader is sent when the channel's frames come in this order and the join is
    done after the first ``joined_after`` of them (the rest arrive once it is)."""
    sent: list[dict[str, Any]] = []
    reply = ReplyChunks(wanted, sent.append)
    for frame in frames[:joined_after]:
        reply.frame(frame)
    reply.decide()
    for frame in frames[joined_after:]:
        reply.frame(frame)
    return sent


def test_live_frames_that_followed_the_cut_before_the_join_was_done_are_kept() -> None:
    """A join's frames come as its cut (snapshots) and then the frames buffered while the cut
    was read: those arrive before the join is done, and must apply once it is."""
    plain = [
        {"type": "snapshot", "channel": "c", "id": "m", "text": "ab"},
        {"type": "delta", "channel": "c", "id": "m", "delta": "c"},
        {"type": "delta", "channel": "c", "id": "m", "delta": "d"},
        {"type": "message", "channel": "c", "id": "m", "text": "abcd"},
    ]
    for at in range(1, len(plain) + 1):
        sent = _served(plain, at)
        text = "".join(c["delta"] for c in sent if c["type"] == "text-delta")
        assert text == "abcd", at
        assert [c["type"] for c in sent].count("start") == 1, at
        assert sent[-1]["type"] == "finish", at
    # A structured reply that opened after the cut, its first chunks still in the buffer.
    chunks = [
        {"type": "chunks", "channel": "c", "id": "s", "chunks": [START_T, _delta("Hi")]},
        {"type": "chunks", "channel": "c", "id": "s", "chunks": [_delta(" there")]},
    ]
    for at in range(0, len(chunks) + 1):
        sent = _served(chunks, at, wanted="s")
        assert sent == [
            {"type": "start", "messageId": "s"},
            START_T,
            _delta("Hi"),
            _delta(" there"),
        ]


def test_a_message_that_ended_before_any_of_it_was_served_comes_whole() -> None:
    """Waiting for a reply (nothing in progress at the join), the reader is served a plain
    one-shot message whole, text included, and a message that opened and was aborted before
    any text (Stop pressed on a reply of no chunk yet) whole, ending in its abort."""
    one_shot = {"type": "message", "channel": "c", "id": "m", "text": "Hi 👋"}
    assert _served([one_shot], 0) == [
        {"type": "start", "messageId": "m"},
        START_IMPLICIT,
        {"type": "text-delta", "id": "text", "delta": "Hi 👋"},
        {"type": "text-end", "id": "text"},
        {"type": "finish"},
    ]
    stopped = {"type": "aborted", "channel": "c", "id": "m", "text": "", "reason": "cancelled"}
    assert _served([stopped], 0, wanted="m") == [
        {"type": "start", "messageId": "m"},
        {"type": "abort", "reason": "cancelled"},
    ]
