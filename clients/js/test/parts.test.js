// A message's parts: the assembler (parts.js) and the channel state that keeps them live.
// (Held to the relay's own core for every case it has, at every prefix and every join, in
// tests/e2e/test_js_parts.py.)

import assert from "node:assert/strict";
import { test } from "node:test";

import { ChannelState, MessageParts, RelayClient, fixJson, parsePartialJson } from "../src/index.js";

const subscribed = { type: "subscribed", channel: "c", offset: 0, epoch: "E" };
const chunks = (...list) => ({ type: "chunks", channel: "c", id: "m", chunks: list });
const delta = (text) => ({ type: "delta", channel: "c", id: "m", delta: text });

/** A reply as a model streams it: reasoning, a tool call with streamed input, then text. */
const REPLY = [
  { type: "start-step" },
  { type: "reasoning-start", id: "r1" },
  { type: "reasoning-delta", id: "r1", delta: "The user wants " },
  { type: "reasoning-delta", id: "r1", delta: "the weather." },
  { type: "reasoning-end", id: "r1" },
  { type: "tool-input-start", toolCallId: "call-1", toolName: "weather" },
  { type: "tool-input-delta", toolCallId: "call-1", inputTextDelta: '{"city":"Pa' },
];

test("a structured reply's parts, live, chunk by chunk", () => {
  const state = new ChannelState("c");
  state.apply(subscribed);
  assert.equal(state.apply(chunks(...REPLY)), "changed");
  const live = state.messages.get("m");
  assert.equal(live.status, "streaming");
  assert.equal(live.text, "");
  assert.deepEqual(live.parts, [
    { type: "step-start" },
    { type: "reasoning", id: "r1", text: "The user wants the weather.", state: "done" },
    // The input so far, repaired into JSON as ai repairs it; the text as it came.
    { type: "tool-weather", toolCallId: "call-1", state: "input-streaming", input: { city: "Pa" }, rawInput: '{"city":"Pa' },
  ]);
  state.apply(chunks({ type: "tool-input-delta", toolCallId: "call-1", inputTextDelta: 'ris"}' }));
  state.apply(chunks({ type: "tool-input-available", toolCallId: "call-1", toolName: "weather", input: { city: "Paris" } }));
  state.apply(chunks({ type: "tool-output-available", toolCallId: "call-1", output: { celsius: 21 } }));
  // A top-level delta on a structured message comes as text-start + text-delta on "text".
  state.apply(chunks({ type: "text-start", id: "text" }, { type: "text-delta", id: "text", delta: "It is " }));
  const before = state.messages.get("m").parts;
  state.apply(chunks({ type: "text-delta", id: "text", delta: "21 °C." }));
  const after = state.messages.get("m");
  assert.equal(after.text, "It is 21 °C.");
  assert.deepEqual(after.parts.slice(2), [
    { type: "tool-weather", toolCallId: "call-1", state: "output-available", input: { city: "Paris" }, output: { celsius: 21 } },
    { type: "text", text: "It is 21 °C.", state: "streaming" },
  ]);
  // The parts a delta left alone keep their identity; the one it changed is new.
  assert.equal(after.parts[1], before[1]);
  assert.equal(after.parts[2], before[2]);
  assert.notEqual(after.parts[3], before[3]);
  assert.ok(Object.isFrozen(after.parts) && after.parts.every(Object.isFrozen));
});

test("a plain message is one text part; its first chunk keeps that part, first", () => {
  const state = new ChannelState("c");
  state.apply(subscribed);
  state.apply(delta("Let me "));
  state.apply(delta("check."));
  assert.deepEqual(state.messages.get("m").parts, [{ type: "text", text: "Let me check.", state: "streaming" }]);
  state.apply(chunks({ type: "text-delta", id: "text", delta: " Done" }, { type: "text-end", id: "text" }, ...REPLY.slice(0, 2)));
  const message = state.messages.get("m");
  assert.deepEqual(message.parts, [
    { type: "text", text: "Let me check. Done", state: "done" },
    { type: "step-start" },
    { type: "reasoning", id: "r1", text: "", state: "streaming" },
  ]);
  assert.equal(message.text, "Let me check. Done");
});

test("a structured snapshot replaces what was held: no part twice", () => {
  const state = new ChannelState("c");
  state.apply(subscribed);
  state.apply(chunks(...REPLY));
  state.setStatus("reconnecting");
  state.apply({ ...subscribed, recovered: true, replayed: 0 });
  const compacted = [
    { type: "start-step" },
    { type: "reasoning-start", id: "r1" },
    { type: "reasoning-delta", id: "r1", delta: "The user wants the weather." },
    { type: "reasoning-end", id: "r1" },
    { type: "tool-input-start", toolCallId: "call-1", toolName: "weather" },
    { type: "tool-input-delta", toolCallId: "call-1", inputTextDelta: '{"city":"Paris"' },
  ];
  assert.equal(state.apply({ type: "snapshot", channel: "c", id: "m", text: "", chunks: compacted }), "changed");
  const parts = state.messages.get("m").parts;
  assert.equal(parts.length, 3);
  assert.deepEqual(parts[2].input, { city: "Paris" });
  assert.equal(parts[2].rawInput, '{"city":"Paris"');
});

test("the message frame's parts are the end; later chunks for it are ignored", () => {
  const state = new ChannelState("c");
  state.apply(subscribed);
  state.apply(chunks(...REPLY));
  const final = [{ type: "text", text: "Sunny.", state: "done" }];
  state.apply({ type: "message", channel: "c", id: "m", text: "Sunny.", parts: final, offset: 1, epoch: "E" });
  assert.deepEqual(state.messages.get("m").parts, final);
  assert.equal(state.messages.get("m").status, "complete");
  assert.equal(state.apply(chunks({ type: "text-start", id: "late" })), "ignored");
  assert.equal(state.apply(delta("late")), "ignored");
  assert.deepEqual(state.messages.get("m").parts, final);
});

test("a plain message that ends is one text part: done if complete, streaming if aborted", () => {
  const state = new ChannelState("c");
  state.apply(subscribed);
  state.apply({ type: "message", channel: "c", id: "a", text: "whole", offset: 1, epoch: "E" });
  state.apply({ type: "aborted", channel: "c", id: "b", text: "cut", reason: "shutdown", offset: 2, epoch: "E" });
  assert.deepEqual(state.messages.get("a").parts, [{ type: "text", text: "whole", state: "done" }]);
  assert.deepEqual(state.messages.get("b").parts, [{ type: "text", text: "cut", state: "streaming" }]);
});

test("positions count the text held of a structured message in progress", () => {
  const state = new ChannelState("c");
  state.apply(subscribed);
  state.apply(chunks(...REPLY, { type: "text-start", id: "t" }, { type: "text-delta", id: "t", delta: "👋 hi" }));
  assert.deepEqual(state.subscribeFrame().positions, { m: 4 });
});

test("the assembler is lenient: a chunk it cannot place changes nothing", () => {
  const parts = new MessageParts();
  assert.equal(parts.apply({ type: "text-delta", id: "nope", delta: "x" }), false);
  assert.equal(parts.apply({ type: "tool-output-available", toolCallId: "nope", output: 1 }), false);
  assert.equal(parts.apply({ type: "finish", finishReason: "stop" }), false);
  assert.equal(parts.apply({ type: "something-new" }), false);
  assert.equal(parts.apply(null), false);
  assert.deepEqual(parts.parts(), []);
  // A transient data part is not kept; one with an id is replaced in place.
  assert.equal(parts.apply({ type: "data-progress", data: 1, transient: true }), false);
  parts.apply({ type: "data-progress", id: "p", data: 1 });
  parts.apply({ type: "data-progress", id: "p", data: 2 });
  assert.deepEqual(parts.parts(), [{ type: "data-progress", id: "p", data: 2 }]);
});

test("a tool's input repaired as ai repairs it", () => {
  assert.equal(fixJson('{"a": [1, tr'), '{"a": [1, true]}');
  assert.equal(fixJson('{"s": "x\\u00'), '{"s": "x"}');
  assert.deepEqual(parsePartialJson('{"n": -'), {});
  assert.equal(parsePartialJson(""), undefined);
  assert.equal(parsePartialJson('{"__proto__": 1}'), undefined);
});

test("the client emits each chunks frame with the message it made", async () => {
  class Socket {
    constructor() {
      this.readyState = 0;
      setTimeout(() => {
        this.readyState = 1;
        this.onopen?.();
        for (const frame of [subscribed, chunks(...REPLY)]) this.onmessage?.({ data: JSON.stringify(frame) });
      }, 1);
    }
    send() {}
    close() {}
  }
  const seen = [];
  const client = new RelayClient("ws://relay.test/subscribe", { channels: ["c"], WebSocket: Socket });
  await new Promise((resolve) => {
    client.on("chunks", (frame, message) => {
      seen.push([frame.chunks.length, message.parts.length]);
      resolve();
    });
  });
  client.close();
  assert.deepEqual(seen, [[REPLY.length, 3]]);
});
