// The client's connection logic, with WebSocket and fetch stood in for by scripted fakes:
// which transport it picks, how it resumes, and when it stops trying.
// (The real thing, in Chromium against a real relay, is in tests/e2e/test_js_client.py.)

import assert from "node:assert/strict";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { RelayClient } from "../src/index.js";

/** A WebSocket that fails before it opens, as one a proxy refuses does. */
class RefusedWebSocket {
  static made = 0;
  constructor(url) {
    RefusedWebSocket.made += 1;
    this.url = url;
    this.readyState = 0;
    setTimeout(() => {
      this.readyState = 3;
      this.onclose?.({ code: 1006, reason: "" });
    }, 1);
  }
  close() {}
  send() {
    throw new Error("not open");
  }
}

const sse = (events) =>
  events.map(([event, data, id]) => `event: ${event}\n${id ? `id: ${id}\n` : ""}data: ${JSON.stringify(data)}\n\n`).join("");

/** A fetch that answers each call with the next scripted response. */
function scriptedFetch(script) {
  const calls = [];
  const fetch = async (url, init = {}) => {
    calls.push({ url: new URL(url), init });
    const next = script[Math.min(calls.length, script.length) - 1];
    if (next.status !== 200) return new Response(next.body ?? "refused", { status: next.status });
    const body = new ReadableStream({
      start(controller) {
        controller.enqueue(new TextEncoder().encode(next.body));
        if (next.end) controller.close();
        init.signal?.addEventListener("abort", () => controller.error(new Error("aborted")));
      },
    });
    return new Response(body, { status: 200, headers: { "Content-Type": "text/event-stream" } });
  };
  return { fetch, calls };
}

const until = async (check, what) => {
  for (let n = 0; n < 200; n += 1) {
    if (check()) return;
    await sleep(5);
  }
  assert.fail(`timed out waiting for ${what}`);
};

const subscribed = { type: "subscribed", channel: "c", offset: 0, epoch: "E" };
const message = (id, text, offset) => ({ type: "message", channel: "c", id, text, offset, epoch: "E" });

/** A WebSocket whose upgrade is never answered, and that fires no close event once closed
 * while still connecting (as Node's own WebSocket does). */
class SilentWebSocket {
  static made = 0;
  static closed = [];
  constructor(url) {
    SilentWebSocket.made += 1;
    this.url = url;
    this.readyState = 0;
  }
  close(code, reason) {
    SilentWebSocket.closed.push([code, reason]);
    this.readyState = 3;
  }
  send() {
    throw new Error("not open");
  }
}

test("a WebSocket never answered is given up at openTimeout, close event or not, for SSE", async () => {
  SilentWebSocket.made = 0;
  SilentWebSocket.closed = [];
  const { fetch, calls } = scriptedFetch([
    { status: 200, body: sse([["subscribed", subscribed], ["message", message("a", "one", 1)]]) },
  ]);
  const client = new RelayClient("ws://relay.test/subscribe", {
    channels: ["c"],
    WebSocket: SilentWebSocket,
    fetch,
    openTimeout: 30,
  });
  await until(() => client.getChannel("c").messages.length === 1, "the message over SSE");
  assert.equal(client.transport, "sse");
  assert.equal(SilentWebSocket.made, 1);
  assert.deepEqual(SilentWebSocket.closed, [[4000, "no answer"]]);
  assert.equal(calls.length, 1);
  client.close();
});

test("close() from a status listener stops the client for good", async () => {
  RefusedWebSocket.made = 0;
  const statuses = [];
  const client = new RelayClient("ws://relay.test/subscribe", {
    channels: ["c"],
    WebSocket: RefusedWebSocket,
    fetch: () => Promise.reject(new TypeError("refused")),
    backoff: { initial: 5, max: 5 },
  });
  client.on("status", (status) => {
    statuses.push(status);
    if (status === "reconnecting") client.close();
  });
  await until(() => statuses.includes("closed"), "closed");
  await sleep(60); // a dozen retry delays: none may come
  assert.equal(client.status, "closed");
  assert.equal(statuses.filter((s) => s === "reconnecting").length, 1);
  assert.equal(statuses.at(-1), "closed");
  assert.equal(RefusedWebSocket.made, 1);
});

test("WebSockets refused: it falls back to SSE, resumes by since, and stays on SSE", async () => {
  RefusedWebSocket.made = 0;
  const { fetch, calls } = scriptedFetch([
    { status: 200, body: sse([["subscribed", subscribed], ["message", message("a", "one", 1)]]), end: true },
    { status: 200, body: sse([["subscribed", { ...subscribed, offset: 2, recovered: true, replayed: 1 }], ["message", message("b", "two", 2)]]) },
  ]);
  const tokens = [];
  const client = new RelayClient("ws://relay.test/subscribe", {
    channels: ["c"],
    WebSocket: RefusedWebSocket,
    fetch,
    token: async () => {
      tokens.push(tokens.length);
      return `t${tokens.length}`;
    },
    backoff: { initial: 5, max: 10 },
  });
  await until(() => client.getChannel("c").messages.length === 2, "both messages");
  assert.equal(client.transport, "sse");
  assert.equal(RefusedWebSocket.made, 1, "after one failure it does not try WebSockets again");
  assert.equal(calls[0].url.pathname, "/sse");
  assert.deepEqual(calls[0].url.searchParams.getAll("channel"), ["c"]);
  assert.equal(calls[0].url.searchParams.get("rewind"), "100", "a fresh page rewinds");
  assert.equal(calls[0].init.headers.Authorization, "Bearer t1");
  // The reconnect resumes from the last message held, with a fresh token.
  const since = JSON.parse(Buffer.from(calls[1].url.searchParams.get("since"), "base64url"));
  assert.deepEqual(since, { c: [1, "E"] });
  assert.equal(calls[1].url.searchParams.get("rewind"), null);
  assert.equal(calls[1].init.headers.Authorization, "Bearer t2");
  assert.deepEqual(client.getChannel("c").messages.map((m) => m.text), ["one", "two"]);
  assert.equal(client.getChannel("c").status, "live");
  client.close();
  assert.equal(client.getChannel("c").status, "closed");
});

for (const status of [401, 403, 404]) {
  test(`a ${status} is an error state, never retried forever`, async () => {
    const { fetch, calls } = scriptedFetch([{ status, body: `refused ${status}` }]);
    const statuses = [];
    const client = new RelayClient("ws://relay.test/subscribe", {
      channels: ["c"],
      transport: "sse",
      fetch,
      backoff: { initial: 1, max: 2 },
      onStatus: (s) => statuses.push(s),
    });
    await until(() => client.status === "error", "the error state");
    await sleep(50);
    assert.equal(calls.length, 1);
    assert.deepEqual(client.error, { code: `http_${status}`, status, message: `refused ${status}` });
    assert.equal(client.getChannel("c").status, "error");
    assert.equal(statuses.at(-1), "error");
  });
}

test("a 401 with a token function gets one more try with a fresh token", async () => {
  const { fetch, calls } = scriptedFetch([{ status: 401 }, { status: 401 }]);
  let minted = 0;
  const client = new RelayClient("ws://relay.test/subscribe", {
    channels: ["c"],
    transport: "sse",
    fetch,
    token: () => `t${++minted}`,
    backoff: { initial: 1, max: 2 },
  });
  await until(() => client.status === "error", "the error state");
  await sleep(30);
  assert.equal(calls.length, 2);
  assert.deepEqual(calls.map((c) => c.init.headers.Authorization), ["Bearer t1", "Bearer t2"]);
});

test("a relay that is down (503, network errors) is retried with growing delays", async () => {
  let count = 0;
  const fetch = async () => {
    count += 1;
    if (count % 2) throw new TypeError("fetch failed");
    return new Response("overloaded", { status: 503 });
  };
  const delays = [];
  const client = new RelayClient("ws://relay.test/subscribe", {
    channels: ["c"],
    transport: "sse",
    fetch,
    backoff: { initial: 2, max: 16 },
    onStatus: (status, detail) => status === "reconnecting" && detail.delay && delays.push(detail.delay),
  });
  await until(() => count >= 6, "six tries");
  client.close();
  assert.equal(client.status, "closed");
  // Doubling up to the ceiling, each with jitter within [ceiling/2, ceiling].
  const ceilings = [2, 4, 8, 16, 16];
  ceilings.forEach((ceiling, n) => {
    assert.ok(delays[n] >= ceiling / 2 && delays[n] <= ceiling, `delay ${n}: ${delays[n]}`);
  });
});

test("subscribe and unsubscribe over SSE reopen the stream with the new channels", async () => {
  const { fetch, calls } = scriptedFetch([
    { status: 200, body: sse([["subscribed", subscribed]]) },
  ]);
  const client = new RelayClient("ws://relay.test/subscribe", { transport: "sse", fetch });
  assert.equal(client.status, "idle");
  client.subscribe("c");
  await until(() => client.getChannel("c").status === "live", "c live");
  client.subscribe("d");
  await until(() => calls.length === 2, "a second stream");
  assert.deepEqual(calls[1].url.searchParams.getAll("channel"), ["c", "d"]);
  client.unsubscribe("c");
  await until(() => calls.length === 3, "a third stream");
  assert.deepEqual(calls[2].url.searchParams.getAll("channel"), ["d"]);
  assert.equal(client.getChannel("c").status, "idle");
  assert.deepEqual(client.channels, ["d"]);
  client.close();
});

test("retain holds a channel across a release and an immediate retain (StrictMode)", async () => {
  const { fetch, calls } = scriptedFetch([{ status: 200, body: sse([["subscribed", subscribed]]) }]);
  const client = new RelayClient("ws://relay.test/subscribe", { transport: "sse", fetch });
  const release = client.retain("c");
  release();
  const again = client.retain("c");
  await sleep(20);
  assert.deepEqual(client.channels, ["c"]);
  assert.equal(calls.length, 1, "one stream: the channel was never let go");
  again();
  await until(() => client.channels.length === 0, "the channel let go");
  client.close();
});
