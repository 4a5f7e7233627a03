// token-relay-client: a browser (and Node) client for token-relay subscribers.
//
// One connection carries every channel. It prefers a WebSocket and falls back to
// Server-Sent Events when WebSockets fail where plain HTTP works (a proxy that breaks
// them). After a drop it reconnects with backoff and jitter and resumes every channel
// exactly: completed messages missed meanwhile are replayed once, and a message in
// progress continues from the characters already shown. A fresh channel starts with a
// rewind of its recent messages. Refusals that trying again cannot fix (401, 403, 404)
// end in an error state instead of retrying forever.
//
// Each message carries its parts (text, reasoning, tool calls, sources, files, data), live
// while it streams and exact once it ends; see parts.js and state.js.

import { ChannelState, DEFAULT_MAX_MESSAGES, TRANSIENT_CODES, encodeSince } from "./state.js";
import { readEvents } from "./sse.js";

export { ChannelState, codePoints, encodeSince } from "./state.js";
export { EventStreamParser } from "./sse.js";
export { IMPLICIT_TEXT, MessageParts, fixJson, parsePartialJson } from "./parts.js";

const PERMANENT = new Set([400, 401, 403, 404]);
const EVENTS = ["status", "frame", "snapshot", "delta", "chunks", "message", "aborted", "error", "channel"];

/** The relay's SSE endpoint for its WebSocket subscribe URL: same host, `/sse`. */
export function sseUrlFor(url) {
  const http = new URL(url);
  http.protocol = http.protocol === "wss:" ? "https:" : http.protocol === "ws:" ? "http:" : http.protocol;
  http.pathname = http.pathname.replace(/\/subscribe\/?$/, "") + "/sse";
  http.search = "";
  return http.toString();
}

const closedState = (channel) =>
  Object.freeze({ channel, status: "idle", error: null, gap: false, messages: Object.freeze([]) });

export class RelayClient {
  /**
   * @param {string} url the relay's `ws://…/subscribe` (or `wss://`) URL
   * @param {object} [options] see the package README; every option has a default
   */
  constructor(url, options = {}) {
    this.url = url;
    this.options = options;
    this.deltas = options.deltas ?? true;
    this.rewind = options.rewind ?? 100;
    this.maxMessages = options.maxMessages ?? DEFAULT_MAX_MESSAGES;
    this.mode = options.transport ?? "auto";
    if (!["auto", "websocket", "sse"].includes(this.mode)) {
      throw new TypeError(`transport must be "auto", "websocket" or "sse", not ${this.mode}`);
    }
    this.sseUrl = options.sseUrl ?? sseUrlFor(url);
    this.cancelUrl = options.cancelUrl ?? this.sseUrl.replace(/\/sse$/, "/cancel");
    this.backoff = { initial: 250, max: 10000, ...(options.backoff ?? {}) };
    this.openTimeout = options.openTimeout ?? 5000;
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
    this.fetch = options.fetch ?? ((...args) => globalThis.fetch(...args));

    /** "idle" | "connecting" | "open" | "reconnecting" | "error" | "closed" */
    this.status = "idle";
    /** "websocket" | "sse" | null: what carries the channels now. */
    this.transport = null;
    /** Why the client stopped for good (status "error"): { code, message, status? }. */
    this.error = null;

    this._states = new Map(); // channel -> ChannelState
    this._closedStates = new Map(); // channel -> the frozen state of a channel not held
    this._watchers = new Map(); // channel -> Set(listener)
    this._listeners = new Map(EVENTS.map((name) => [name, new Set()]));
    this._refs = new Map(); // channel -> how many retain() holds
    this._pinned = new Set(); // channels subscribe() asked for
    this._releases = new Map(); // channel -> timer of a deferred release
    this._rewinds = new Map(); // channel -> a rewind asked for by subscribe()
    this._generation = 0;
    this._attempt = 0;
    this._timer = null;
    this._socket = null;
    this._abort = null;
    this._confirmed = false;
    this._sticky = this.mode === "sse";
    this._authRetried = false;

    for (const name of EVENTS) {
      const callback = options[`on${name[0].toUpperCase()}${name.slice(1)}`];
      if (typeof callback === "function") this.on(name, callback);
    }
    // The channels given here are held at once, but nothing is emitted and nothing
    // connects until the constructor has returned, so callbacks may use the client.
    this._starting = true;
    for (const channel of options.channels ?? []) this.subscribe(channel);
    this._starting = false;
    queueMicrotask(() => {
      if (this.status === "idle" && this._states.size > 0 && this._timer === null) this._connect();
    });
  }

  // ------------------------------------------------------------------ the API

  /** The channels held now. */
  get channels() {
    return [...this._states.keys()];
  }

  /** Listen to an event; returns the function that stops listening. */
  on(event, listener) {
    const listeners = this._listeners.get(event);
    if (!listeners) throw new TypeError(`unknown event ${event}`);
    listeners.add(listener);
    return () => listeners.delete(listener);
  }

  /** Subscribe a channel (at any time); `rewind` overrides the client's for a fresh one. */
  subscribe(channel, { rewind } = {}) {
    if (typeof channel !== "string" || channel.length === 0) {
      throw new TypeError("a channel is a non-empty string");
    }
    if (this.status === "closed") throw new Error("this client is closed");
    this._pinned.add(channel);
    if (rewind !== undefined) this._rewinds.set(channel, rewind);
    this._hold(channel);
  }

  /** Unsubscribe a channel (at any time): its messages are forgotten. */
  unsubscribe(channel) {
    this._pinned.delete(channel);
    this._refs.delete(channel);
    this._drop(channel);
  }

  /**
   * Hold a channel for as long as something shows it (a component): subscribes it if it
   * is not held yet. The returned release lets it go once nothing holds it, a moment later,
   * so an unmount followed at once by a mount (React StrictMode) keeps the subscription.
   */
  retain(channel) {
    this._refs.set(channel, (this._refs.get(channel) ?? 0) + 1);
    clearTimeout(this._releases.get(channel));
    this._releases.delete(channel);
    this._hold(channel);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const refs = (this._refs.get(channel) ?? 1) - 1;
      if (refs > 0) {
        this._refs.set(channel, refs);
        return;
      }
      this._refs.delete(channel);
      if (this._pinned.has(channel)) return;
      clearTimeout(this._releases.get(channel));
      this._releases.set(
        channel,
        setTimeout(() => {
          this._releases.delete(channel);
          if (!this._refs.has(channel) && !this._pinned.has(channel)) this._drop(channel);
        }, 0),
      );
    };
  }

  /** A channel's state: `{ channel, status, error, gap, messages }`, immutable, the same
   * object until it changes. */
  getChannel(channel) {
    const state = this._states.get(channel);
    if (state) return state.snapshot();
    let closed = this._closedStates.get(channel);
    if (!closed) {
      closed = closedState(channel);
      if (this._closedStates.size > 100) this._closedStates.clear();
      this._closedStates.set(channel, closed);
    }
    return closed;
  }

  /** Call `listener(state)` whenever a channel's state changes; returns the stop function. */
  watch(channel, listener) {
    let watchers = this._watchers.get(channel);
    if (!watchers) this._watchers.set(channel, (watchers = new Set()));
    watchers.add(listener);
    return () => {
      watchers.delete(listener);
      if (watchers.size === 0 && this._watchers.get(channel) === watchers) {
        this._watchers.delete(channel);
      }
    };
  }

  /** Ask the producer of message `id` to stop; resolves true if the relay took the request. */
  async cancel(channel, id) {
    if (this.transport === "websocket" && this._send({ type: "cancel", channel, id })) return true;
    const headers = { "Content-Type": "application/json" };
    const token = await this._token();
    if (token) headers.Authorization = `Bearer ${token}`;
    try {
      const response = await this.fetch(this.cancelUrl, {
        method: "POST",
        headers,
        body: JSON.stringify({ channel, id }),
      });
      return response.status === 204;
    } catch {
      return false;
    }
  }

  /** Close the connection for good. */
  close() {
    this._stop();
    for (const timer of this._releases.values()) clearTimeout(timer);
    this._releases.clear();
    for (const state of this._states.values()) this._changed(state, state.setStatus("closed"));
    this._setStatus("closed");
  }

  // ------------------------------------------------------------------ channels

  _hold(channel) {
    if (this._states.has(channel)) return;
    const state = new ChannelState(channel, { maxMessages: this.maxMessages });
    this._states.set(channel, state);
    if (this._starting) return;
    this._changed(state, "changed");
    if (this.status === "error") {
      this._changed(state, state.fail(this.error));
    } else if (this.transport === "websocket") {
      this._send(this._subscribeFrame(state)); // if it is not open yet, onopen sends it
    } else if (this.transport === "sse") {
      this._restart(); // an SSE stream's channels are fixed: open one with the new set
    } else if (this._socket === null && this._abort === null && this._timer === null) {
      this._connect();
    }
  }

  _drop(channel) {
    const state = this._states.get(channel);
    if (!state) return;
    this._states.delete(channel);
    this._rewinds.delete(channel);
    this._changed(state, state.setStatus("closed"));
    if (this.transport === "websocket") this._send({ type: "unsubscribe", channel });
    else if (this.transport === "sse") this._restart();
  }

  _subscribeFrame(state) {
    const rewind = this._rewinds.get(state.channel) ?? this.rewind;
    return state.subscribeFrame({ deltas: this.deltas, rewind });
  }

  // ------------------------------------------------------------------ connecting

  async _connect() {
    this._timer = null;
    const generation = ++this._generation;
    this._confirmed = false;
    this._setStatus(this._attempt === 0 ? "connecting" : "reconnecting", { attempt: this._attempt });
    let token;
    try {
      token = await this._token();
    } catch (error) {
      if (generation === this._generation) this._retry({ reason: `token: ${error}` });
      return;
    }
    if (generation !== this._generation) return;
    if (this._states.size === 0) {
      this._setStatus("idle");
      return;
    }
    if (this._sticky || !this.WebSocket) this._openSse(generation, token, false);
    else this._openWebSocket(generation, token);
  }

  _openWebSocket(generation, token) {
    const url = new URL(this.url);
    if (token) url.searchParams.set("token", token);
    let socket;
    try {
      socket = new this.WebSocket(url.toString());
    } catch (error) {
      this._webSocketFailed(generation, token, String(error));
      return;
    }
    this._socket = socket;
    this.transport = "websocket";
    // A WebSocket a proxy lets open but never carries counts as failed. It is given up here,
    // not in onclose: a socket still connecting may fire no close event once closed (Node's).
    const deadline = setTimeout(() => {
      if (generation !== this._generation || this._confirmed) return;
      socket.onopen = socket.onmessage = socket.onclose = null;
      socket.close(4000, "no answer");
      this._socket = null;
      this._lost();
      this._webSocketFailed(generation, token, `no frame within ${this.openTimeout} ms`);
    }, this.openTimeout);
    socket.onopen = () => {
      if (generation !== this._generation) return;
      for (const state of this._states.values()) this._send(this._subscribeFrame(state));
    };
    socket.onmessage = (event) => {
      if (this._incoming(generation, event.data)) clearTimeout(deadline);
    };
    socket.onclose = (event) => {
      clearTimeout(deadline);
      if (generation !== this._generation) return;
      this._socket = null;
      const confirmed = this._confirmed;
      this._lost();
      if (confirmed) this._retry({ code: event.code, reason: event.reason });
      else this._webSocketFailed(generation, token, `closed ${event.code} before any frame`);
    };
  }

  /** A WebSocket that never carried a frame: try SSE (it also tells a refusal apart). */
  _webSocketFailed(generation, token, reason) {
    this.transport = null;
    this._openSse(generation, token, this.mode === "websocket", reason);
  }

  async _openSse(generation, token, probe = false, why = "") {
    const channels = [...this._states.values()];
    if (channels.length === 0) return;
    const url = new URL(this.sseUrl);
    const positions = new Map();
    let rewind = 0;
    for (const state of channels) {
      url.searchParams.append("channel", state.channel);
      if (state.position) positions.set(state.channel, state.position);
      else rewind = Math.max(rewind, this._rewinds.get(state.channel) ?? this.rewind);
    }
    if (this.deltas) url.searchParams.set("deltas", "1");
    if (positions.size > 0) url.searchParams.set("since", encodeSince(positions));
    if (rewind > 0) url.searchParams.set("rewind", String(rewind));
    const headers = { Accept: "text/event-stream" };
    if (token) headers.Authorization = `Bearer ${token}`;
    const abort = new AbortController();
    this._abort = abort;
    let response;
    try {
      response = await this.fetch(url.toString(), { headers, signal: abort.signal, cache: "no-store" });
    } catch (error) {
      if (generation !== this._generation) return;
      this._abort = null;
      this._sticky = false; // neither transport works: the relay is unreachable
      this._retry({ reason: why || String(error) });
      return;
    }
    if (generation !== this._generation) {
      abort.abort();
      return;
    }
    if (!response.ok) {
      this._abort = null;
      await this._refused(response, generation); // reads the (short) reason first
      abort.abort();
      return;
    }
    if (probe) {
      // WebSockets only: the relay would take us, so the failure was the WebSocket's.
      abort.abort();
      this._abort = null;
      this._retry({ reason: why });
      return;
    }
    this._sticky = true;
    this.transport = "sse";
    try {
      await readEvents(response.body, (event) => this._incoming(generation, event.data));
    } catch {
      // a cut: the same as an end
    }
    if (generation !== this._generation) return;
    this._abort = null;
    this._lost();
    this._retry({ reason: "stream ended" });
  }

  async _refused(response, generation) {
    let detail = "";
    try {
      detail = (await response.text()).trim().slice(0, 500);
    } catch {
      // no body
    }
    if (generation !== this._generation) return;
    const status = response.status;
    if (status === 401 && typeof this.options.token === "function" && !this._authRetried) {
      this._authRetried = true; // one more try with a fresh token, then it is permanent
      this._retry({ status, reason: detail });
      return;
    }
    if (PERMANENT.has(status)) {
      this._fail({ code: `http_${status}`, status, message: detail || `HTTP ${status}` });
      return;
    }
    this._sticky = false;
    this._retry({ status, reason: detail });
  }

  _opened() {
    this._attempt = 0;
    this._authRetried = false;
    this._setStatus("open", { transport: this.transport });
  }

  _lost() {
    this._confirmed = false;
    for (const state of this._states.values()) {
      if (state.status === "live" || state.status === "connecting") {
        this._changed(state, state.setStatus("reconnecting"));
      }
    }
  }

  _retry(detail) {
    if (this.status === "closed" || this.status === "error") return;
    this.transport = null;
    this._attempt += 1;
    const ceiling = Math.min(this.backoff.max, this.backoff.initial * 2 ** (this._attempt - 1));
    const delay = ceiling / 2 + Math.random() * (ceiling / 2);
    this._setStatus("reconnecting", { ...detail, attempt: this._attempt, delay });
    if (this.status === "closed" || this.status === "error") return; // a listener closed it
    clearTimeout(this._timer);
    this._timer = setTimeout(() => this._connect(), delay);
  }

  /** Reopen at once (an SSE stream whose channel set changed). */
  _restart() {
    if (this.status === "closed" || this.status === "error") return;
    this._stop();
    this._attempt = 0;
    this._connect();
  }

  _stop() {
    this._generation += 1;
    clearTimeout(this._timer);
    this._timer = null;
    if (this._socket) {
      const socket = this._socket;
      this._socket = null;
      try {
        socket.close(1000, "client closed");
      } catch {
        // already closed
      }
    }
    if (this._abort) {
      this._abort.abort();
      this._abort = null;
    }
    this.transport = null;
    this._confirmed = false;
  }

  _fail(error) {
    this._stop();
    this.error = error;
    for (const state of this._states.values()) this._changed(state, state.fail(error));
    this._setStatus("error", error);
    this._emit("error", { type: "error", ...error });
  }

  async _token() {
    const token = this.options.token;
    if (typeof token === "function") return (await token()) || undefined;
    return token || undefined;
  }

  _send(frame) {
    const socket = this._socket;
    if (socket && socket.readyState === 1) {
      socket.send(JSON.stringify(frame));
      return true;
    }
    return false;
  }

  // ------------------------------------------------------------------ frames

  /** A frame's text from the connection of `generation`: the first one opens the client.
   * Returns whether the connection has carried a frame. */
  _incoming(generation, data) {
    if (generation !== this._generation) return false;
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      return this._confirmed;
    }
    if (!this._confirmed) {
      this._confirmed = true;
      this._opened();
    }
    this._receive(frame);
    return true;
  }

  _receive(frame) {
    this._emit("frame", frame);
    const state = frame.channel === undefined ? undefined : this._states.get(frame.channel);
    if (frame.type === "error") {
      // An error naming a message (a cancel) leaves its channel as it is; one naming only
      // the channel answers its subscribe.
      if (state && frame.id == null) this._subscribeRefused(state, frame);
      this._emit("error", frame);
      return;
    }
    if (!state) return; // a channel let go of meanwhile
    const outcome = state.apply(frame);
    if (outcome !== "changed") return;
    if (frame.type === "subscribed") this._rewinds.delete(frame.channel);
    const message = frame.id === undefined ? undefined : state.messages.get(frame.id);
    if (message && ["snapshot", "delta", "chunks", "message", "aborted"].includes(frame.type)) {
      this._emit(frame.type, frame, message);
    }
    this._changed(state, outcome);
  }

  _subscribeRefused(state, frame) {
    if (TRANSIENT_CODES.has(frame.code)) {
      // The relay could not serve the subscribe now: ask again a little later (an SSE
      // stream's channels are fixed, so it is opened again).
      const transport = this.transport;
      setTimeout(() => {
        if (this._states.get(frame.channel) !== state || this.transport !== transport) return;
        if (transport === "websocket") this._send(this._subscribeFrame(state));
        else if (transport === "sse") this._restart();
      }, this.backoff.initial);
    }
    this._changed(state, state.apply(frame));
  }

  _changed(state, outcome) {
    if (outcome !== "changed") return;
    const snapshot = state.snapshot();
    this._emit("channel", snapshot);
    const watchers = this._watchers.get(state.channel);
    if (watchers) for (const listener of [...watchers]) listener(snapshot);
  }

  _setStatus(status, detail = {}) {
    this.status = status;
    this._emit("status", status, detail);
  }

  _emit(event, ...args) {
    for (const listener of [...this._listeners.get(event)]) {
      try {
        listener(...args);
      } catch (error) {
        setTimeout(() => {
          throw error;
        }, 0);
      }
    }
  }
}
