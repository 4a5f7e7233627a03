// A Server-Sent Events reader over fetch(): unlike EventSource, it sees the response's
// status (so a refusal is told from a network failure), sends an Authorization header, and
// leaves reconnecting to the client. Parsing follows the HTML standard's event stream rules.

/**
 * Turn chunks of an event stream into events. `push(text)` returns the events completed by
 * that text: `{ event, data, id }`, where `event` defaults to "message" and `id` is the last
 * id seen so far (or undefined).
 */
export class EventStreamParser {
  constructor() {
    this.buffer = "";
    this.event = "";
    this.data = [];
    this.lastId = undefined;
    this.pendingCR = false;
  }

  push(text) {
    const events = [];
    let chunk = text;
    if (this.pendingCR && chunk.startsWith("\n")) chunk = chunk.slice(1);
    this.pendingCR = false;
    this.buffer += chunk;
    let start = 0;
    for (;;) {
      const match = /\r\n|\r|\n/.exec(this.buffer.slice(start));
      if (match === null) break;
      const end = start + match.index;
      if (match[0] === "\r" && end + 1 === this.buffer.length) this.pendingCR = true;
      this._line(this.buffer.slice(start, end), events);
      start = end + match[0].length;
    }
    this.buffer = this.buffer.slice(start);
    return events;
  }

  _line(line, events) {
    if (line === "") {
      if (this.data.length > 0) {
        events.push({ event: this.event || "message", data: this.data.join("\n"), id: this.lastId });
      }
      this.event = "";
      this.data = [];
      return;
    }
    if (line.startsWith(":")) return; // a comment: a heartbeat, or why the stream ended
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.event = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id" && !value.includes("\0")) this.lastId = value;
  }
}

/** Read a fetch() response body as events, calling `onEvent` for each, until it ends. */
export async function readEvents(body, onEvent) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const parser = new EventStreamParser();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      for (const event of parser.push(decoder.decode(value, { stream: true }))) onEvent(event);
    }
  } finally {
    reader.releaseLock();
  }
}
