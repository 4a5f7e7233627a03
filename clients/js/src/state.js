// The state of one channel, built from the relay's frames: pure, no I/O, no timers.
//
// A channel holds its messages in the order they first appeared, each with its text, its
// parts and its status ("streaming", "complete" or "aborted" with a reason), and the
// position the next subscribe resumes from:
// - a fresh channel (no position yet) subscribes with `rewind`, so a new page shows the
//   channel's recent messages;
// - after that, with `since` (the offset and epoch of the last completed or aborted
//   message held) and `positions` (the characters held of each message in progress), so
//   completed messages missed meanwhile are replayed once, and a message in progress
//   continues from the characters already shown.
// A completed or aborted message at or below the position is a duplicate, and dropped.
//
// Parts. Each message in progress has a `MessageParts` (parts.js) that assembles its live
// parts: `delta` frames extend its implicit text part (chunk id "text"), `chunks` frames
// apply their chunks in order, and a `snapshot` REPLACES what was held of the message (one
// with `chunks` is the reply so far, compacted; a plain one is its text). A message's `text`
// is its text parts' texts joined. The `message` / `aborted` frame's `parts` (or, for a
// plain message, its text as one text part) replace the live view: they are authoritative.

import { MessageParts } from "./parts.js";

/** The number of Unicode code points in `text`: the relay counts characters this way. */
export const codePoints = (text) => {
  let count = 0;
  for (const _ of text) count += 1;
  return count;
};

const firstCodePoints = (text, count) => {
  let end = 0;
  let seen = 0;
  for (const char of text) {
    if (seen === count) break;
    end += char.length;
    seen += 1;
  }
  return text.slice(0, end);
};

/** Subscribe and error codes worth trying again: the relay may serve them later. */
export const TRANSIENT_CODES = new Set(["broker_unavailable", "rate_limited", "overloaded"]);

export const DEFAULT_MAX_MESSAGES = 500;

/** The parts of a plain message that ended: its text as one text part, "done" if it
 * completed, still "streaming" if it was aborted (as the relay's AI SDK stream gives it). */
const plainParts = (text, state) => Object.freeze([Object.freeze({ type: "text", text, state })]);

const TERMINAL = { message: "complete", aborted: "aborted" };

/**
 * One channel's messages and resume position. `apply(frame)` takes a frame of this
 * channel and returns what it did: `"changed"`, `"duplicate"` or `"ignored"`.
 * `snapshot()` is immutable and keeps its identity until the next change.
 */
export class ChannelState {
  constructor(channel, { maxMessages = DEFAULT_MAX_MESSAGES } = {}) {
    this.channel = channel;
    this.maxMessages = Math.max(1, maxMessages);
    /** {offset, epoch} to resume from, or null before the first confirmation. */
    this.position = null;
    /** id -> message (frozen), in first-appearance order (a Map keeps insertion order). */
    this.messages = new Map();
    /** id -> the parts being assembled (a MessageParts), for messages in progress. */
    this.live = new Map();
    this.status = "connecting";
    this.error = null;
    this.gap = false;
    this._snapshot = null;
  }

  /** The subscribe frame that (re)joins this channel from what it holds. */
  subscribeFrame({ deltas = true, rewind = 0 } = {}) {
    const frame = { type: "subscribe", channel: this.channel, deltas };
    if (this.position) {
      frame.since = { offset: this.position.offset, epoch: this.position.epoch };
    } else if (rewind > 0) {
      frame.rewind = rewind;
    }
    if (deltas && this.live.size > 0) {
      frame.positions = {};
      for (const id of this.live.keys()) frame.positions[id] = codePoints(this.messages.get(id).text);
    }
    return frame;
  }

  /** Apply one frame of this channel. */
  apply(frame) {
    switch (frame.type) {
      case "subscribed":
        return this._subscribed(frame);
      case "snapshot":
        return this._snapshotFrame(frame);
      case "delta":
        return this._delta(frame);
      case "chunks":
        return this._chunks(frame);
      case "message":
      case "aborted":
        return this._terminal(frame);
      case "unsubscribed":
        return this.setStatus("closed");
      case "error":
        this.error = { code: frame.code, message: frame.message };
        return this.setStatus(TRANSIENT_CODES.has(frame.code) ? this.status : "error", true);
      default:
        return "ignored";
    }
  }

  /** Set the channel's status (a transport's doing: reconnecting, error, closed). */
  setStatus(status, force = false) {
    if (this.status === status && !force) return "ignored";
    this.status = status;
    this._snapshot = null;
    return "changed";
  }

  /** Fail the channel for good: a refusal that trying again cannot fix. */
  fail(error) {
    this.error = error;
    return this.setStatus("error", true);
  }

  /** The channel as the app sees it; the same object until something changes. */
  snapshot() {
    if (this._snapshot === null) {
      this._snapshot = Object.freeze({
        channel: this.channel,
        status: this.status,
        error: this.error,
        gap: this.gap,
        messages: Object.freeze([...this.messages.values()]),
      });
    }
    return this._snapshot;
  }

  // ------------------------------------------------------------------ frames

  _subscribed(frame) {
    this.status = "live";
    this.error = null;
    // The confirmation holds the channel's offset; the position is before what the join
    // replays (`replayed` messages follow, ending at `offset`). In the same epoch a
    // position never moves back: what is held up to it is held.
    const start = frame.offset - (frame.replayed ?? 0);
    const held = this.position;
    if (!held || held.epoch !== frame.epoch || held.offset < start) {
      this.position = { offset: start, epoch: frame.epoch };
    }
    if (frame.recovered === false) {
      // History could not fill the gap. Messages held in progress may have died in it:
      // they end as lost unless a snapshot shows them still in progress.
      this.gap = true;
      for (const id of [...this.live.keys()]) {
        const held = this.messages.get(id);
        this._put({ ...held, status: "aborted", reason: "relay_lost" });
        this.live.delete(id);
      }
    }
    this._snapshot = null;
    return "changed";
  }

  _snapshotFrame(frame) {
    const held = this.messages.get(frame.id);
    if (held && held.status === "complete") return "ignored";
    const parts = new MessageParts();
    if (Array.isArray(frame.chunks)) {
      for (const chunk of frame.chunks) parts.apply(chunk);
    } else {
      let text = frame.text;
      if (frame.from !== undefined && held) text = firstCodePoints(held.text, frame.from) + text;
      parts.delta(text);
    }
    this.live.set(frame.id, parts);
    return this._streaming(frame.id, parts);
  }

  _delta(frame) {
    const parts = this._liveParts(frame.id);
    if (parts === null) return "ignored"; // a finished id takes no more text
    parts.delta(frame.delta);
    return this._streaming(frame.id, parts);
  }

  _chunks(frame) {
    const parts = this._liveParts(frame.id);
    if (parts === null || !Array.isArray(frame.chunks)) return "ignored";
    for (const chunk of frame.chunks) parts.apply(chunk);
    return this._streaming(frame.id, parts);
  }

  /** The parts being assembled for message `id` (new for a new id); null once it ended. */
  _liveParts(id) {
    let parts = this.live.get(id);
    if (parts) return parts;
    const held = this.messages.get(id);
    if (held && held.status !== "streaming") return null;
    parts = new MessageParts();
    if (held) parts.delta(held.text); // held from before this client kept parts
    this.live.set(id, parts);
    return parts;
  }

  _streaming(id, parts) {
    this._put({ id, channel: this.channel, text: parts.text(), parts: parts.parts(), status: "streaming" });
    return "changed";
  }

  _terminal(frame) {
    const position = this.position;
    if (position && position.epoch === frame.epoch && frame.offset <= position.offset) {
      return "duplicate";
    }
    this.position = { offset: frame.offset, epoch: frame.epoch };
    const status = TERMINAL[frame.type];
    const parts = Array.isArray(frame.parts)
      ? Object.freeze(frame.parts.map((part) => Object.freeze(part)))
      : plainParts(frame.text, status === "complete" ? "done" : "streaming");
    const message = { id: frame.id, channel: this.channel, text: frame.text, parts, status, offset: frame.offset };
    if (frame.type === "aborted") message.reason = frame.reason;
    if (frame.meta !== undefined) message.meta = frame.meta;
    this._put(message);
    this.live.delete(frame.id);
    this._trim();
    return "changed";
  }

  _put(message) {
    this.messages.set(message.id, Object.freeze(message));
    this._snapshot = null;
  }

  /** Keep at most `maxMessages`: the oldest finished ones go first. */
  _trim() {
    if (this.messages.size <= this.maxMessages) return;
    for (const [id, message] of this.messages) {
      if (this.messages.size <= this.maxMessages) break;
      if (message.status !== "streaming") this.messages.delete(id);
    }
  }
}

/** The `?since=` token of an SSE stream: base64url of `{"channel": [offset, "epoch"]}`. */
export function encodeSince(positions) {
  const compact = {};
  for (const [channel, position] of positions) compact[channel] = [position.offset, position.epoch];
  const bytes = new TextEncoder().encode(JSON.stringify(compact));
  let binary = "";
  for (const byte of bytes) binary += String.fromCharCode(byte);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
