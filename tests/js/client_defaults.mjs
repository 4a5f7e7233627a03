// The browser client token-relay-client (clients/js) in Node: the defaults of a client given
// no options, as its fields hold them and as its timers use them. Prints one JSON object:
//
// - openTimeout, backoff: the fields;
// - openTimeoutArmed: the delay of the first timer a connection arms, its WebSocket's deadline;
// - lowest, highest: the delays of its first 8 reconnects (against a WebSocket that always
//   fails, and an SSE fetch that always fails) with Math.random() at 0 and at 1.
//
// Timers fire at once (their delays are recorded), so this takes no time.
// Usage: node client_defaults.mjs
import { RelayClient } from "../../clients/js/src/index.js";

const URL = "ws://127.0.0.1:9/subscribe";

const idle = new RelayClient(URL);
const defaults = { openTimeout: idle.openTimeout, backoff: idle.backoff };
idle.close();

const realSetTimeout = globalThis.setTimeout;
const armed = [];
globalThis.setTimeout = (callback, delay, ...rest) => {
  armed.push(delay);
  return realSetTimeout(callback, 0, ...rest);
};

class FailingWebSocket {
  constructor() {
    this.readyState = 0;
    realSetTimeout(() => this.onclose?.({ code: 1006, reason: "" }), 0);
  }
  close() {}
  send() {}
}

async function reconnectDelays(random) {
  Math.random = () => random;
  const seen = [];
  await new Promise((done) => {
    const client = new RelayClient(URL, {
      channels: ["c"],
      WebSocket: FailingWebSocket,
      fetch: () => Promise.reject(new TypeError("connection refused")),
    });
    client.on("status", (status, detail) => {
      if (status !== "reconnecting" || detail.delay === undefined || seen.length === 8) return;
      seen.push(detail.delay);
      if (seen.length === 8) {
        // Not from inside the listener: the client arms its next timer after emitting this.
        queueMicrotask(() => {
          client.close();
          done();
        });
      }
    });
  });
  return seen;
}

defaults.lowest = await reconnectDelays(0);
defaults.openTimeoutArmed = armed[0];
defaults.highest = await reconnectDelays(1);
process.stdout.write(`${JSON.stringify(defaults)}\n`);
process.exit(0);
