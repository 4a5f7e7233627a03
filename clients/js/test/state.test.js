// The client's state logic, driven by frame sequences recorded from a real relay
// (tests/e2e/test_js_recordings.py records them again and checks they are current).

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { test } from "node:test";

import { ChannelState, codePoints, encodeSince } from "../src/index.js";

const folder = new URL("./recordings/", import.meta.url);
const recordings = readdirSync(folder)
  .filter((name) => name.endsWith(".json"))
  .map((name) => JSON.parse(readFileSync(new URL(name, folder), "utf8")));

test("every scenario was recorded", () => {
  const names = recordings.map((r) => r.scenario).sort();
  assert.deepEqual(names, ["duplicates", "gap", "resume", "rewind", "stream-and-abort"]);
});

for (const recording of recordings) {
  test(`${recording.scenario}: ${recording.description}`, () => {
    const state = new ChannelState("chat");
    recording.connections.forEach((connection, n) => {
      if (!connection.stale) {
        // What the client would send to (re)join is what was sent.
        assert.deepEqual(
          state.subscribeFrame({ deltas: true, rewind: recording.rewind }),
          connection.subscribe,
          `the subscribe of connection ${n}`,
        );
      }
      const outcomes = connection.frames.map((frame) => state.apply(frame));
      const expected = recording.outcomes?.[n];
      if (expected) assert.deepEqual(outcomes, expected, `the outcomes of connection ${n}`);
      if (n < recording.connections.length - 1) state.setStatus("reconnecting");
    });
    const shown = state.snapshot().messages.map(({ id, text, status, reason }) =>
      reason === undefined ? { id, text, status } : { id, text, status, reason },
    );
    assert.deepEqual(shown, recording.expected);
    assert.equal(state.snapshot().gap, recording.gap ?? false);
    assert.equal(state.snapshot().status, "live");
  });
}

test("a snapshot's from counts code points, not UTF-16 units", () => {
  const state = new ChannelState("c");
  state.apply({ type: "subscribed", channel: "c", offset: 0, epoch: "E" });
  state.apply({ type: "delta", channel: "c", id: "m", delta: "👋é" });
  assert.deepEqual(state.subscribeFrame().positions, { m: 2 });
  // The relay held three characters when we held two; it sends the rest only.
  state.apply({ type: "snapshot", channel: "c", id: "m", text: "x!", from: 1 });
  assert.equal(state.messages.get("m").text, "👋x!");
  assert.equal(codePoints("👋x!"), 3);
  assert.deepEqual(state.subscribeFrame().positions, { m: 3 });
});

test("a fresh channel rewinds; once confirmed it resumes by since, and positions go", () => {
  const state = new ChannelState("c");
  assert.deepEqual(state.subscribeFrame({ rewind: 5 }), {
    type: "subscribe",
    channel: "c",
    deltas: true,
    rewind: 5,
  });
  state.apply({ type: "subscribed", channel: "c", offset: 9, epoch: "E", replayed: 2 });
  // Cut before the replay arrived: the next join replays the same two again.
  assert.deepEqual(state.subscribeFrame({ rewind: 5 }).since, { offset: 7, epoch: "E" });
  state.apply({ type: "message", channel: "c", id: "a", text: "A", offset: 8, epoch: "E" });
  state.apply({ type: "message", channel: "c", id: "b", text: "B", offset: 9, epoch: "E" });
  assert.deepEqual(state.subscribeFrame({ deltas: false }), {
    type: "subscribe",
    channel: "c",
    deltas: false,
    since: { offset: 9, epoch: "E" },
  });
});

test("a finished message takes no more text, and snapshots keep their identity", () => {
  const state = new ChannelState("c");
  state.apply({ type: "subscribed", channel: "c", offset: 0, epoch: "E" });
  state.apply({ type: "message", channel: "c", id: "m", text: "done", offset: 1, epoch: "E" });
  const before = state.snapshot();
  assert.equal(state.snapshot(), before);
  assert.equal(state.apply({ type: "delta", channel: "c", id: "m", delta: "more" }), "ignored");
  assert.equal(state.apply({ type: "snapshot", channel: "c", id: "m", text: "x" }), "ignored");
  assert.equal(state.snapshot(), before);
  assert.ok(Object.isFrozen(before.messages) && Object.isFrozen(before.messages[0]));
});

test("a channel keeps at most maxMessages, dropping the oldest finished ones", () => {
  const state = new ChannelState("c", { maxMessages: 3 });
  state.apply({ type: "subscribed", channel: "c", offset: 0, epoch: "E" });
  state.apply({ type: "delta", channel: "c", id: "live", delta: "…" });
  for (let n = 1; n <= 5; n += 1) {
    state.apply({ type: "message", channel: "c", id: `m${n}`, text: "t", offset: n, epoch: "E" });
  }
  assert.deepEqual(
    state.snapshot().messages.map((m) => m.id),
    ["live", "m4", "m5"],
  );
});

test("a refused subscribe is an error state; a transient one is not", () => {
  const state = new ChannelState("c");
  state.apply({ type: "error", code: "broker_unavailable", message: "later", channel: "c" });
  assert.equal(state.snapshot().status, "connecting");
  assert.equal(state.snapshot().error.code, "broker_unavailable");
  state.apply({ type: "error", code: "forbidden", message: "no", channel: "c" });
  assert.equal(state.snapshot().status, "error");
  assert.deepEqual(state.snapshot().error, { code: "forbidden", message: "no" });
});

test("the since token is the relay's: base64url JSON of every channel's position", () => {
  const token = encodeSince(new Map([["chat-42", { offset: 1, epoch: "W2EB5Rd778kC" }]]));
  // The token the relay itself sends for this position (README, "Server-Sent Events").
  assert.equal(token, "eyJjaGF0LTQyIjpbMSwiVzJFQjVSZDc3OGtDIl19");
  const wide = encodeSince(new Map([["çhat ✓", { offset: 12, epoch: "e" }]]));
  assert.deepEqual(JSON.parse(Buffer.from(wide, "base64url").toString("utf8")), {
    "çhat ✓": [12, "e"],
  });
});
