// relay-client.js: a dependency-free browser client for token-relay subscribers.
//
// It subscribes with live deltas, keeps the text of every message in progress,
// and survives a flaky network: after a drop it reconnects with backoff and
// resumes each channel by offset (so completed messages missed meanwhile are
// replayed, each once) and by positions (so a message in progress continues
// from the characters already shown, with no gap and no overlap).
//
//   import { RelayClient } from "./relay-client.js";
//   const client = new RelayClient("ws://127.0.0.1:8765/subscribe", {
//     channels: ["chat-42"],
//     onSnapshot: (frame, text) => {},  // a message in progress; text is all of it so far
//     onDelta: (frame, text) => {},     // text is all of it so far, delta included
//     onMessage: (frame) => {},         // completed: frame.text is the exact final text
//     onAborted: (frame) => {},         // died unfinished: frame.reason, frame.text
//     onStatus: (status, detail) => {}, // "connecting" | "open" | "reconnecting" | "closed" | "gap"
//     onError: (frame) => {},           // an error frame from the relay
//   });
//   client.cancel("chat-42", "reply-7"); // ask the producer to stop a generation
//   client.close();

const codePoints = (text) => {
  let count = 0;
  for (const _ of text) count += 1;
  return count;
};

export class RelayClient {
  constructor(url, options = {}) {
    this.url = url;
    this.options = options;
    this.backoff = { initial: 250, max: 8000, ...(options.backoff || {}) };
    // channel -> { offset, epoch } of the last terminal frame (message or aborted) seen.
    this.positions = new Map();
    // channel -> Map(id -> { text, length }) for messages in progress.
    this.partials = new Map();
    this.attempt = 0;
    this.closed = false;
    this.socket = null;
    this.timer = null;
    for (const channel of options.channels || []) this.partials.set(channel, new Map());
    this.connect();
  }

  get channels() {
    return [...this.partials.keys()];
  }

  subscribe(channel) {
    if (!this.partials.has(channel)) this.partials.set(channel, new Map());
    this.sendSubscribe(channel);
  }

  cancel(channel, id) {
    this.send({ type: "cancel", channel, id });
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.socket) this.socket.close(1000, "client closed");
    this.status("closed");
  }

  // ------------------------------------------------------------------ internals

  connect() {
    this.status(this.attempt === 0 ? "connecting" : "reconnecting", { attempt: this.attempt });
    const socket = new WebSocket(this.url);
    this.socket = socket;
    socket.onopen = () => {
      this.attempt = 0;
      this.status("open");
      for (const channel of this.channels) this.sendSubscribe(channel);
    };
    socket.onmessage = (event) => this.receive(JSON.parse(event.data));
    socket.onclose = () => {
      if (this.socket !== socket || this.closed) return;
      this.socket = null;
      this.scheduleReconnect();
    };
  }

  scheduleReconnect() {
    this.attempt += 1;
    const ceiling = Math.min(this.backoff.max, this.backoff.initial * 2 ** (this.attempt - 1));
    const delay = ceiling / 2 + Math.random() * (ceiling / 2);
    this.status("reconnecting", { attempt: this.attempt, delay });
    this.timer = setTimeout(() => this.connect(), delay);
  }

  send(frame) {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) {
      this.socket.send(JSON.stringify(frame));
      return true;
    }
    return false;
  }

  sendSubscribe(channel) {
    const frame = { type: "subscribe", channel, deltas: true };
    const position = this.positions.get(channel);
    if (position) frame.since = { offset: position.offset, epoch: position.epoch };
    const held = {};
    let any = false;
    for (const [id, partial] of this.partials.get(channel) || []) {
      held[id] = partial.length;
      any = true;
    }
    if (any) frame.positions = held;
    this.send(frame);
  }

  receive(frame) {
    const handlers = {
      subscribed: () => this.onSubscribed(frame),
      snapshot: () => this.onSnapshot(frame),
      delta: () => this.onDelta(frame),
      message: () => this.onTerminal(frame, "onMessage"),
      aborted: () => this.onTerminal(frame, "onAborted"),
      error: () => this.call("onError", frame),
    };
    const handler = handlers[frame.type];
    if (handler) handler();
  }

  onSubscribed(frame) {
    if (frame.recovered === false) {
      // History could not fill the gap: say so, so the app can refetch.
      this.status("gap", { channel: frame.channel, offset: frame.offset, epoch: frame.epoch });
    }
    if (frame.recovered !== true) {
      // A fresh start (or a gap): count from the channel's current offset. When the
      // gap was filled, the replayed frames that follow move the position forward.
      this.positions.set(frame.channel, { offset: frame.offset, epoch: frame.epoch });
    }
  }

  onSnapshot(frame) {
    const partials = this.partials.get(frame.channel);
    if (!partials) return;
    let text = frame.text;
    const held = partials.get(frame.id);
    if (frame.from !== undefined && held) {
      text = Array.from(held.text).slice(0, frame.from).join("") + frame.text;
    }
    partials.set(frame.id, { text, length: codePoints(text) });
    this.call("onSnapshot", frame, text);
  }

  onDelta(frame) {
    const partials = this.partials.get(frame.channel);
    if (!partials) return;
    const held = partials.get(frame.id) || { text: "", length: 0 };
    const text = held.text + frame.delta;
    partials.set(frame.id, { text, length: held.length + codePoints(frame.delta) });
    this.call("onDelta", frame, text);
  }

  onTerminal(frame, callback) {
    const position = this.positions.get(frame.channel);
    if (position && position.epoch === frame.epoch && frame.offset <= position.offset) {
      return; // already seen: never deliver a duplicate
    }
    this.positions.set(frame.channel, { offset: frame.offset, epoch: frame.epoch });
    const partials = this.partials.get(frame.channel);
    if (partials) partials.delete(frame.id);
    this.call(callback, frame);
  }

  status(status, detail = {}) {
    this.call("onStatus", status, detail);
  }

  call(name, ...args) {
    const callback = this.options[name];
    if (callback) callback(...args);
  }
}
