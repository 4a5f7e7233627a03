"""A structured reply joined at any point, played step by step: the streams, the router and
a broker's order, with no socket.

The broker is a model of both brokers' contract: an event's frames are published with the
channel's next ``seq``; they arrive at the router in that order, at any time after; a
joiner's cut (the compacted catch-up of the message in progress, and the ``seq`` it
reflects) is read at any time, and its reply reaches the router at any time after. Each
joiner rebuilds the reply from what it gets (:class:`~tests.harness.LiveParts`, which
refuses a part twice) and must end with exactly the message's parts, live and final.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from token_relay.core.codec import encode_chunks
from token_relay.core.events import CatchUp, Delta, FrameKind, LiveMessage, Outgoing
from token_relay.core.protocol import ProducerEvent
from token_relay.core.router import ChannelRouter, Send
from token_relay.core.streams import Applied, MessageStreams

from ..harness import LiveParts
from .test_parts import HIGH, LOW, mixed_reply

_STRUCTURED = [{"id": "m", **({"chunk": c} if "type" in c else c)} for c in mixed_reply()]
REPLY: list[dict[str, Any]] = [
    {"id": "m", "delta": "So "},
    {"id": "m", "delta": "far" + HIGH},  # half a pair held as the message turns structured
    _STRUCTURED[0],
    {"id": "m", "delta": LOW},  # its other half, in the implicit part's next delta
    *_STRUCTURED[1:],
    {"id": "m", "final": True},
]


class Channel:
    """One channel: a producer's streams, a router, and what was published on it."""

    def __init__(self, *, window: bool = False) -> None:
        self.streams = MessageStreams("c")
        self.router: ChannelRouter[str] = ChannelRouter(10, window=window)
        self.published: list[tuple[FrameKind, int, Outgoing]] = []
        self.arrived = 0
        self.views: dict[str, LiveParts] = {}

    def produce(self, event: dict[str, Any]) -> None:
        """Apply an event and publish its frames, as the edge and a broker do."""
        applied = self.streams.receive(ProducerEvent.model_validate(event))
        assert isinstance(applied, Applied)
        if applied.delta:
            self._publish(FrameKind.DELTA, Delta("c", "m", applied.delta))
        if applied.chunks is not None:
            self._publish(FrameKind.DELTA, encode_chunks("c", "m", applied.chunks))
        if applied.first_completion:
            frame = {"type": "message", "channel": "c", "id": "m", "text": applied.text}
            frame["parts"] = applied.parts
            self._publish(FrameKind.TERMINAL, json.dumps(frame))

    def arrive(self) -> bool:
        """The next frame published reaches the router; False if none is on its way."""
        if self.arrived == len(self.published):
            return False
        kind, seq, item = self.published[self.arrived]
        self.arrived += 1
        self.run(self.router.deliver("c", kind, seq, item))
        return True

    def cut(self) -> CatchUp:
        """A joiner's cut, read now."""
        live = []
        text = self.streams.partial("m")
        if text is not None:
            live.append(LiveMessage("p", "m", text))
        structured = self.streams.live_parts("m")
        if structured is not None:
            live.append(LiveMessage("p", "m", *structured))
        return CatchUp(0, "E", None, [], len(self.published), live)

    def run(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Send):
                for receiver in action.receivers:
                    self.take(receiver, action.item)

    def take(self, name: str, item: Outgoing) -> None:
        payload = item.render() if isinstance(item, Delta) else item
        self.views[name].feed(json.loads(payload))

    def _publish(self, kind: FrameKind, item: Outgoing) -> None:
        self.published.append((kind, len(self.published) + 1, item))


def _whole() -> list[dict[str, Any]]:
    streams = MessageStreams("c")
    for event in REPLY:
        applied = streams.receive(ProducerEvent.model_validate(event))
    assert isinstance(applied, Applied) and applied.parts is not None
    return applied.parts


STEPS = st.lists(st.sampled_from(["produce", "arrive", "join", "read", "reply"]), max_size=90)


def _play(steps: list[str], *, window: bool) -> None:
    channel = Channel(window=window)
    events = iter(REPLY)
    joins: dict[str, Any] = {}
    cuts: dict[str, CatchUp] = {}
    replied: set[str] = set()
    names = iter(f"s{n}" for n in range(100))

    def step(kind: str) -> None:
        if kind == "produce":
            event = next(events, None)
            if event is not None:
                channel.produce(event)
        elif kind == "arrive":
            channel.arrive()
            if window:
                channel.run(channel.router.flush("c"))
        elif kind == "join":
            name = next(names)
            channel.views[name] = LiveParts()
            join, actions = channel.router.join(name, "c", deltas=True, resuming=False)
            channel.run(actions)
            joins[name] = join
        elif kind == "read":
            unread = [name for name in joins if name not in cuts]
            if unread:
                cuts[unread[0]] = channel.cut()
        elif kind == "reply":
            ready = [name for name in cuts if name not in replied]
            if ready:
                name = ready[0]
                replied.add(name)
                for frame in channel.router.joined(joins[name], cuts[name])[1:]:
                    channel.take(name, frame)

    for kind in steps:
        step(kind)
    for event in events:  # the end: the reply completes and everything arrives
        channel.produce(event)
    for name in joins:
        cuts.setdefault(name, channel.cut())
    while channel.arrive() or len(replied) < len(joins):
        step("reply")
    channel.run(channel.router.flush("c"))
    whole = _whole()
    terminal = len(channel.published)  # the message frame, published last
    for name, view in channel.views.items():
        if cuts[name].seq >= terminal:  # joined once it was over: not for this joiner
            assert not view.ended and not view.live, name
            continue
        assert view.ended["m"]["parts"] == whole, name
        if "m" in view.live:  # it saw the reply before its end: rebuilt exactly
            assert view.parts("m", final=True) == whole, name


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_every_joiner_rebuilds_the_structured_reply_exactly_once(steps: list[str]) -> None:
    _play(steps, window=False)


@settings(max_examples=150, deadline=None)
@given(STEPS)
def test_with_the_delta_window_too(steps: list[str]) -> None:
    _play(steps, window=True)


def test_a_join_after_each_event_with_its_reply_at_each_later_point() -> None:
    """Every join point, and every point its cut's reply may reach the router, in order."""
    produced = len(REPLY)
    for join_at in range(produced):
        for reply_after in range(0, produced - join_at):
            steps = ["produce"] * join_at + ["join", "read"]
            steps += ["produce", "arrive"] * reply_after + ["reply"]
            _play(steps, window=False)
