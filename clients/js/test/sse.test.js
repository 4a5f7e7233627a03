import assert from "node:assert/strict";
import { test } from "node:test";

import { EventStreamParser } from "../src/index.js";

test("events are split on blank lines, whatever the line endings and chunking", () => {
  const stream =
    'retry: 1000\r\n\r\nevent: subscribed\r\nid: T1\r\ndata: {"a":1}\r\n\r\n' +
    ":\n\nevent: delta\ndata: one\ndata: two\n\rdata: x\r\r";
  for (const size of [1, 2, 3, 7, stream.length]) {
    const parser = new EventStreamParser();
    const events = [];
    for (let at = 0; at < stream.length; at += size) {
      events.push(...parser.push(stream.slice(at, at + size)));
    }
    assert.deepEqual(events, [
      { event: "subscribed", data: '{"a":1}', id: "T1" },
      { event: "delta", data: "one\ntwo", id: "T1" },
      { event: "message", data: "x", id: "T1" },
    ], `chunks of ${size}`);
  }
});

test("comments, unknown fields and an unfinished event yield nothing", () => {
  const parser = new EventStreamParser();
  assert.deepEqual(parser.push(": closed 1001 going away\n\nfoo: bar\n\ndata: half"), []);
});
