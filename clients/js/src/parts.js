// A message's parts, assembled from the AI SDK's UI message chunks: pure, no I/O.
//
// A structured reply streams reasoning, tool calls, text, sources, files and data, as the
// chunks of the AI SDK's UI message stream (`UIMessageChunk` of `ai` 7). `MessageParts`
// assembles them into the list of parts `readUIMessageStream` of `ai` 7 builds from the same
// chunks (`message.parts`), key for key, without depending on `ai`:
//
// - text-start / text-delta / text-end, reasoning-start / -delta / -end: a part per start,
//   found by its chunk id until its end. `delta(text)`, a relay `delta` frame, extends the
//   message's implicit text part, chunk id "text" (opening it on the first delta).
// - tool-input-start / -delta / -available / -error, tool-approval-request / -response,
//   tool-output-available / -error / -denied: one `tool-<name>` (or `dynamic-tool`) part per
//   toolCallId, its `state` following the chunks. While the input streams, `rawInput` is the
//   text so far and `input` that text repaired into JSON as `ai` repairs it (`fixJson`), or
//   absent while the text holds no value yet.
// - source-url, source-document, file: a part each. data-<name>: a part; one with an `id`
//   replaces the data of the part of the same type and id in place; a transient one is not
//   kept. start-step adds a `step-start` part; finish-step ends the step's open text and
//   reasoning parts (their state stays "streaming").
// - A UTF-16 surrogate pair split across two deltas of a part is joined; the first half is
//   held back until its pair comes, and a half that never pairs becomes U+FFFD when its part
//   ends. Message-level chunks (start, finish, abort, error, message-metadata) carry no part.
//
// The relay checks every chunk before it forwards it, so this assembler is lenient: a chunk
// it cannot place (a delta for a part it does not hold, an unknown type) is ignored, and
// `apply` returns false. A message's authoritative parts are the ones its completed
// `message` / `aborted` frame carries; these are the live view until then.
//
// `parts()` is a frozen array of frozen parts, rebuilt only where a chunk changed something:
// a part a chunk left alone keeps its identity, so a view can skip it.

/** The chunk id of a message's implicit text part, the one relay `delta` frames extend. */
export const IMPLICIT_TEXT = "text";

const OUTPUT_STATES = new Set(["output-available", "output-error"]);
const MESSAGE_CHUNKS = new Set(["start", "finish", "abort", "error", "message-metadata"]);
const REPLACEMENT = "\ufffd";

const isHigh = (code) => code >= 0xd800 && code <= 0xdbff;
const SURROGATE = /[\ud800-\udfff]/;

/** `text` with every lone UTF-16 surrogate replaced by U+FFFD. */
function wellFormed(text) {
  if (!SURROGATE.test(text)) return text;
  if (typeof text.toWellFormed === "function") return text.toWellFormed();
  let out = "";
  for (let i = 0; i < text.length; i += 1) {
    const code = text.charCodeAt(i);
    if (isHigh(code) && i + 1 < text.length && text.charCodeAt(i + 1) >= 0xdc00 && text.charCodeAt(i + 1) <= 0xdfff) {
      out += text[i] + text[i + 1];
      i += 1;
    } else {
      out += code >= 0xd800 && code <= 0xdfff ? REPLACEMENT : text[i];
    }
  }
  return out;
}

/** A part's text so far, and a high surrogate held back for its low half. */
class TextBuffer {
  constructor() {
    this.text = "";
    this.held = "";
  }

  append(delta) {
    let joined = this.held + delta;
    this.held = "";
    if (!SURROGATE.test(joined)) {
      this.text += joined;
      return;
    }
    if (isHigh(joined.charCodeAt(joined.length - 1))) {
      this.held = joined.slice(-1);
      joined = joined.slice(0, -1);
    }
    this.text += wellFormed(joined);
  }

  /** The part ends: a half still held becomes U+FFFD. */
  flush() {
    if (this.held) this.text += REPLACEMENT;
    this.held = "";
  }
}

// ------------------------------------------------------------------ tool input as ai parses it

/** `JSON.parse` with secure-json-parse's refusals, as `ai` parses a tool's input:
 * `undefined` when it fails. */
export function parseJson(text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  const nodes = [value];
  while (nodes.length > 0) {
    const node = nodes.pop();
    if (node === null || typeof node !== "object") continue;
    if (Array.isArray(node)) {
      nodes.push(...node);
      continue;
    }
    if (Object.prototype.hasOwnProperty.call(node, "__proto__")) return undefined;
    const constructor = Object.prototype.hasOwnProperty.call(node, "constructor") ? node.constructor : undefined;
    if (constructor !== null && typeof constructor === "object" && Object.prototype.hasOwnProperty.call(constructor, "prototype")) {
      return undefined;
    }
    nodes.push(...Object.values(node));
  }
  return value;
}

/** `parsePartialJson` of `ai`: the text as JSON, or repaired (`fixJson`), or undefined. */
export function parsePartialJson(text) {
  const value = parseJson(text);
  return value === undefined ? parseJson(fixJson(text)) : value;
}

const CLOSERS = {
  INSIDE_STRING: '"',
  INSIDE_OBJECT_KEY: "}",
  INSIDE_OBJECT_AFTER_KEY: "}",
  INSIDE_OBJECT_AFTER_COMMA: "}",
  INSIDE_OBJECT_START: "}",
  INSIDE_OBJECT_BEFORE_VALUE: "}",
  INSIDE_OBJECT_AFTER_VALUE: "}",
  INSIDE_ARRAY_START: "]",
  INSIDE_ARRAY_AFTER_COMMA: "]",
  INSIDE_ARRAY_AFTER_VALUE: "]",
};
const LITERALS = ["true", "false", "null"];

/** `fixJson` of `ai`, state for state: close what a JSON text cut short left open. */
export function fixJson(input) {
  const stack = ["ROOT"];
  let lastValid = -1;
  let literalStart = 0;
  let hexDigits = 0;
  const top = () => stack[stack.length - 1];
  const swap = (state) => {
    stack[stack.length - 1] = state;
  };
  function valueStart(char, i, swapState) {
    if (!'"ftn-0123456789{['.includes(char)) return;
    if (char !== "-") lastValid = i;
    swap(swapState);
    if (char === '"') stack.push("INSIDE_STRING");
    else if (char === "f" || char === "t" || char === "n") {
      literalStart = i;
      stack.push("INSIDE_LITERAL");
    } else if (char === "{") stack.push("INSIDE_OBJECT_START");
    else if (char === "[") stack.push("INSIDE_ARRAY_START");
    else stack.push("INSIDE_NUMBER");
  }
  function afterValue(char, i, commaState, closer) {
    if (char === ",") swap(commaState);
    else if (char === closer) {
      lastValid = i;
      stack.pop();
    }
  }
  for (let i = 0; i < input.length; i += 1) {
    const char = input[i];
    switch (top()) {
      case "ROOT":
        valueStart(char, i, "FINISH");
        break;
      case "INSIDE_OBJECT_START":
        if (char === '"') swap("INSIDE_OBJECT_KEY");
        else if (char === "}") {
          lastValid = i;
          stack.pop();
        }
        break;
      case "INSIDE_OBJECT_AFTER_COMMA":
        if (char === '"') swap("INSIDE_OBJECT_KEY");
        break;
      case "INSIDE_OBJECT_KEY":
        if (char === '"') swap("INSIDE_OBJECT_AFTER_KEY");
        break;
      case "INSIDE_OBJECT_AFTER_KEY":
        if (char === ":") swap("INSIDE_OBJECT_BEFORE_VALUE");
        break;
      case "INSIDE_OBJECT_BEFORE_VALUE":
        valueStart(char, i, "INSIDE_OBJECT_AFTER_VALUE");
        break;
      case "INSIDE_OBJECT_AFTER_VALUE":
        afterValue(char, i, "INSIDE_OBJECT_AFTER_COMMA", "}");
        break;
      case "INSIDE_STRING":
        if (char === '"') {
          stack.pop();
          lastValid = i;
        } else if (char === "\\") stack.push("INSIDE_STRING_ESCAPE");
        else lastValid = i;
        break;
      case "INSIDE_ARRAY_START":
        if (char === "]") {
          lastValid = i;
          stack.pop();
        } else valueStart(char, i, "INSIDE_ARRAY_AFTER_VALUE");
        break;
      case "INSIDE_ARRAY_AFTER_VALUE":
        if (char === ",") swap("INSIDE_ARRAY_AFTER_COMMA");
        else if (char === "]") {
          lastValid = i;
          stack.pop();
        } else lastValid = i;
        break;
      case "INSIDE_ARRAY_AFTER_COMMA":
        valueStart(char, i, "INSIDE_ARRAY_AFTER_VALUE");
        break;
      case "INSIDE_STRING_ESCAPE":
        stack.pop();
        if (char === "u") {
          hexDigits = 0;
          stack.push("INSIDE_STRING_UNICODE_ESCAPE");
        } else lastValid = i;
        break;
      case "INSIDE_STRING_UNICODE_ESCAPE":
        if (/[0-9a-fA-F]/.test(char)) {
          hexDigits += 1;
          if (hexDigits === 4) {
            stack.pop();
            lastValid = i;
          }
        }
        break;
      case "INSIDE_NUMBER":
        if (char >= "0" && char <= "9") lastValid = i;
        else if ("eE-.".includes(char)) {
          // still a number
        } else if (",}]".includes(char)) {
          stack.pop();
          if (top() === "INSIDE_ARRAY_AFTER_VALUE" && char !== "}") {
            afterValue(char, i, "INSIDE_ARRAY_AFTER_COMMA", "]");
          }
          if (top() === "INSIDE_OBJECT_AFTER_VALUE" && char !== "]") {
            afterValue(char, i, "INSIDE_OBJECT_AFTER_COMMA", "}");
          }
        } else stack.pop();
        break;
      case "INSIDE_LITERAL": {
        const partial = input.substring(literalStart, i + 1);
        if (!LITERALS.some((word) => word.startsWith(partial))) {
          stack.pop();
          if (top() === "INSIDE_OBJECT_AFTER_VALUE") afterValue(char, i, "INSIDE_OBJECT_AFTER_COMMA", "}");
          else if (top() === "INSIDE_ARRAY_AFTER_VALUE") afterValue(char, i, "INSIDE_ARRAY_AFTER_COMMA", "]");
        } else lastValid = i;
        break;
      }
      default:
        break; // FINISH: nothing after a whole root value changes anything
    }
  }
  let result = input.slice(0, lastValid + 1);
  for (let i = stack.length - 1; i >= 0; i -= 1) {
    if (stack[i] === "INSIDE_LITERAL") {
      const partial = input.substring(literalStart);
      const word = LITERALS.find((literal) => literal.startsWith(partial));
      if (word !== undefined) result += word.slice(partial.length);
    } else {
      result += CLOSERS[stack[i]] ?? "";
    }
  }
  return result;
}

// ------------------------------------------------------------------ citations

const CITED_SOURCES = {
  url: [["id", "url"], ["title"]],
  document: [["id", "mediaType", "title"], ["filename"]],
};

/** `citations` on text-end as `ai` 7's schema reads them: the keys it knows, kept. */
function citationsOf(value) {
  if (!Array.isArray(value)) return undefined;
  const kept = [];
  for (const item of value) {
    const source = item?.source;
    const shape = CITED_SOURCES[source?.sourceType];
    if (!shape || source.type !== "source") continue;
    const keptSource = { type: "source", sourceType: source.sourceType };
    for (const key of [...shape[0], ...shape[1]]) {
      if (source[key] !== undefined) keptSource[key] = source[key];
    }
    if (source.providerMetadata !== undefined) keptSource.providerMetadata = source.providerMetadata;
    const citation = { source: keptSource };
    for (const key of ["startIndex", "endIndex", "citedText"]) {
      if (item[key] !== undefined) citation[key] = item[key];
    }
    kept.push(citation);
  }
  return kept;
}

// ------------------------------------------------------------------ records

/** A part as `ai` holds it, with the keys it leaves undefined dropped (as JSON drops them). */
function defined(part) {
  const out = {};
  for (const [key, value] of Object.entries(part)) if (value !== undefined) out[key] = value;
  return out;
}

class TextRecord {
  constructor(kind, id, providerMetadata) {
    this.kind = kind; // "text" | "reasoning"
    this.id = id;
    this.providerMetadata = providerMetadata;
    this.citations = undefined;
    this.state = "streaming";
    this.buffer = new TextBuffer();
  }

  render() {
    const part = { type: this.kind };
    if (this.kind === "reasoning") part.id = this.id;
    part.text = this.buffer.text;
    part.providerMetadata = this.providerMetadata;
    part.state = this.state;
    part.citations = this.citations;
    return defined(part);
  }
}

class ToolRecord {
  constructor(part, dynamic) {
    this.part = part; // ai's object for the part
    this.dynamic = dynamic;
    this.buffer = new TextBuffer(); // the input text as it streamed
    this.streamed = false; // whether an input delta came
    this.encoding = undefined;
    this.open = false; // whether input deltas may still come
  }

  /** `(input, rawInput)` while the input streams, as `ai` holds them. */
  streamedInput() {
    const raw = this.buffer.text;
    return [this.encoding === "text" ? raw : parsePartialJson(raw), raw];
  }

  render() {
    const part = { ...this.part };
    if (part.state === "input-streaming" && this.streamed) {
      [part.input, part.rawInput] = this.streamedInput();
    }
    if (part.approval !== undefined) part.approval = { ...part.approval };
    return defined(part);
  }
}

class PlainRecord {
  constructor(part) {
    this.part = part;
  }

  render() {
    return defined(this.part);
  }
}

// ------------------------------------------------------------------ the message

/** One message's parts, assembled from UI message chunks and relay `delta` frames. */
export class MessageParts {
  constructor() {
    this._records = [];
    this._views = []; // the frozen part of each record, null once it changed
    this._texts = new Map(); // open text parts by chunk id
    this._reasonings = new Map(); // open reasoning parts by chunk id
    this._tools = new Map(); // tool parts by toolCallId
    this._approvals = new Map(); // tool parts by approval id
    this._parts = Object.freeze([]);
    this._stale = false;
  }

  /** Extend the implicit text part (chunk id "text"), opening it on the first delta. */
  delta(text) {
    if (!this._texts.has(IMPLICIT_TEXT)) this.apply({ type: "text-start", id: IMPLICIT_TEXT });
    return this.apply({ type: "text-delta", id: IMPLICIT_TEXT, delta: text });
  }

  /** Apply one chunk; returns whether it changed the parts. */
  apply(chunk) {
    const kind = chunk?.type;
    if (typeof kind !== "string") return false;
    const handler = HANDLERS[kind];
    let record;
    if (handler) record = handler.call(this, chunk);
    else if (kind.startsWith("data-")) record = this._data(chunk);
    else record = undefined; // a message-level chunk, or one this client does not know
    if (record === undefined) return false;
    this._views[record.index] = null;
    this._stale = true;
    return true;
  }

  /** The parts, frozen; the same array until a chunk changes them. */
  parts() {
    if (this._stale) {
      this._stale = false;
      this._records.forEach((record, index) => {
        if (this._views[index] === null) this._views[index] = Object.freeze(record.render());
      });
      this._parts = Object.freeze([...this._views]);
    }
    return this._parts;
  }

  /** The text parts' texts, joined. */
  text() {
    let text = "";
    for (const record of this._records) {
      if (record instanceof TextRecord && record.kind === "text") text += record.buffer.text;
    }
    return text;
  }

  _push(record) {
    record.index = this._records.length;
    this._records.push(record);
    this._views.push(null);
    return record;
  }

  // -- text and reasoning

  _textStart(chunk) {
    const kind = chunk.type === "text-start" ? "text" : "reasoning";
    const record = this._push(new TextRecord(kind, chunk.id, chunk.providerMetadata));
    (kind === "text" ? this._texts : this._reasonings).set(chunk.id, record);
    return record;
  }

  _textDelta(chunk) {
    const open = chunk.type === "text-delta" ? this._texts : this._reasonings;
    const record = open.get(chunk.id);
    if (record === undefined || typeof chunk.delta !== "string") return undefined;
    record.buffer.append(chunk.delta);
    record.providerMetadata = chunk.providerMetadata ?? record.providerMetadata;
    return record;
  }

  _textEnd(chunk) {
    const open = chunk.type === "text-end" ? this._texts : this._reasonings;
    const record = open.get(chunk.id);
    if (record === undefined) return undefined;
    record.buffer.flush();
    record.state = "done";
    if (chunk.type === "text-end" && chunk.citations != null) record.citations = citationsOf(chunk.citations);
    record.providerMetadata = chunk.providerMetadata ?? record.providerMetadata;
    open.delete(chunk.id);
    return record;
  }

  // -- tools: updateToolPart / updateDynamicToolPart of ai

  _update(record, options) {
    const part = record.part;
    part.state = options.state;
    for (const key of ["input", "output", "errorText", "rawInput", "preliminary"]) part[key] = options[key];
    if (options.inputEncoding != null) part.inputEncoding = options.inputEncoding;
    else delete part.inputEncoding;
    if (options.title !== undefined) part.title = options.title;
    if (options.toolMetadata !== undefined) part.toolMetadata = options.toolMetadata;
    part.providerExecuted = options.providerExecuted ?? part.providerExecuted;
    if (options.providerMetadata != null) {
      if (OUTPUT_STATES.has(options.state)) part.resultProviderMetadata = options.providerMetadata;
      else part.callProviderMetadata = options.providerMetadata;
    }
    return record;
  }

  _newTool(options, dynamic) {
    const part = dynamic
      ? { type: "dynamic-tool", toolName: options.toolName, toolCallId: options.toolCallId }
      : { type: `tool-${options.toolName}`, toolCallId: options.toolCallId };
    const record = this._push(new ToolRecord(part, dynamic));
    this._tools.set(options.toolCallId, record);
    return record;
  }

  _tool(options, dynamic) {
    const found = this._tools.get(options.toolCallId);
    return this._update(found ?? this._newTool(options, dynamic), options);
  }

  /** Leaving input-streaming: the input as it streamed becomes the part's own. */
  _settle(record) {
    record.buffer.flush();
    if (record.part.state === "input-streaming" && record.streamed) {
      [record.part.input, record.part.rawInput] = record.streamedInput();
    }
    record.open = false;
  }

  _toolInputStart(chunk) {
    const found = this._tools.get(chunk.toolCallId);
    if (found) this._settle(found);
    const record = this._tool(
      {
        toolCallId: chunk.toolCallId,
        toolName: chunk.toolName,
        state: "input-streaming",
        inputEncoding: chunk.inputEncoding,
        providerExecuted: chunk.providerExecuted,
        title: chunk.title,
        toolMetadata: chunk.toolMetadata,
        providerMetadata: chunk.providerMetadata,
      },
      chunk.dynamic === true,
    );
    record.encoding = chunk.inputEncoding;
    record.open = true;
    return record;
  }

  _toolInputDelta(chunk) {
    const record = this._tools.get(chunk.toolCallId);
    if (record === undefined || !record.open || typeof chunk.inputTextDelta !== "string") return undefined;
    record.buffer.append(chunk.inputTextDelta);
    record.streamed = true;
    return record;
  }

  _toolInputAvailable(chunk) {
    const found = this._tools.get(chunk.toolCallId);
    if (found) this._settle(found);
    return this._tool(
      {
        toolCallId: chunk.toolCallId,
        toolName: chunk.toolName,
        state: "input-available",
        input: chunk.input,
        providerExecuted: chunk.providerExecuted,
        providerMetadata: chunk.providerMetadata,
        title: chunk.title,
        toolMetadata: chunk.toolMetadata,
      },
      chunk.dynamic === true,
    );
  }

  _toolInputError(chunk) {
    const found = this._tools.get(chunk.toolCallId);
    if (found) this._settle(found);
    return this._tool(
      {
        toolCallId: chunk.toolCallId,
        toolName: chunk.toolName,
        state: "output-error",
        input: chunk.input,
        errorText: chunk.errorText,
        providerExecuted: chunk.providerExecuted,
        providerMetadata: chunk.providerMetadata,
        toolMetadata: chunk.toolMetadata,
      },
      found ? found.dynamic : chunk.dynamic === true,
    );
  }

  _toolApprovalRequest(chunk) {
    const record = this._tools.get(chunk.toolCallId);
    if (record === undefined) return undefined;
    this._settle(record);
    const approval = { id: chunk.approvalId };
    if (chunk.approvalDescriptor != null) approval.descriptor = chunk.approvalDescriptor;
    if (Object.prototype.hasOwnProperty.call(chunk, "inputSchemaInput")) approval.inputSchemaInput = chunk.inputSchemaInput;
    if (chunk.reason != null) approval.requestReason = chunk.reason;
    if (chunk.isAutomatic === true) approval.isAutomatic = true;
    if (chunk.signature != null) approval.signature = chunk.signature;
    record.part.state = "approval-requested";
    record.part.approval = approval;
    this._approvals.set(chunk.approvalId, record);
    return record;
  }

  _toolApprovalResponse(chunk) {
    const record = this._approvals.get(chunk.approvalId);
    if (record === undefined) return undefined;
    const approval = { ...(record.part.approval ?? {}), id: chunk.approvalId, approved: chunk.approved };
    if (chunk.reason != null) approval.reason = chunk.reason;
    record.part.state = "approval-responded";
    record.part.approval = approval;
    if (chunk.providerExecuted != null) record.part.providerExecuted = chunk.providerExecuted;
    if (chunk.providerMetadata != null) record.part.callProviderMetadata = chunk.providerMetadata;
    return record;
  }

  _toolOutput(chunk, state, fields) {
    const record = this._tools.get(chunk.toolCallId);
    if (record === undefined) return undefined;
    this._settle(record);
    const part = record.part;
    return this._update(record, {
      toolCallId: chunk.toolCallId,
      state,
      input: part.input,
      ...fields(record),
      providerExecuted: chunk.providerExecuted,
      providerMetadata: chunk.providerMetadata,
      title: part.title,
      toolMetadata: chunk.toolMetadata ?? part.toolMetadata,
    });
  }

  _toolOutputAvailable(chunk) {
    return this._toolOutput(chunk, "output-available", () => ({
      output: chunk.output,
      preliminary: chunk.preliminary,
    }));
  }

  _toolOutputError(chunk) {
    return this._toolOutput(chunk, "output-error", (record) => ({
      errorText: chunk.errorText,
      rawInput: record.dynamic ? undefined : record.part.rawInput,
    }));
  }

  _toolOutputDenied(chunk) {
    const record = this._tools.get(chunk.toolCallId);
    if (record === undefined) return undefined;
    this._settle(record);
    record.part.state = "output-denied";
    return record;
  }

  // -- sources, files, steps and data

  _sourceUrl(chunk) {
    const { sourceId, url, title, providerMetadata } = chunk;
    return this._push(new PlainRecord({ type: "source-url", sourceId, url, title, providerMetadata }));
  }

  _sourceDocument(chunk) {
    const { sourceId, mediaType, title, filename, providerMetadata } = chunk;
    return this._push(
      new PlainRecord({ type: "source-document", sourceId, mediaType, title, filename, providerMetadata }),
    );
  }

  _file(chunk) {
    const { mediaType, url, providerMetadata } = chunk;
    return this._push(new PlainRecord({ type: "file", mediaType, url, providerMetadata }));
  }

  _startStep() {
    // A tool whose input still streams takes no more of it in the next step.
    for (const record of this._tools.values()) {
      if (record.open) {
        record.buffer.flush();
        record.open = false;
        this._views[record.index] = null;
      }
    }
    return this._push(new PlainRecord({ type: "step-start" }));
  }

  _finishStep() {
    // The step's open text and reasoning parts end where they are (state "streaming").
    let changed;
    for (const open of [this._texts, this._reasonings]) {
      for (const record of open.values()) {
        if (record.buffer.held) {
          record.buffer.flush();
          this._views[record.index] = null;
          changed = record;
        }
      }
      open.clear();
    }
    return changed;
  }

  _data(chunk) {
    if (chunk.transient === true) return undefined;
    if (chunk.id != null) {
      const found = this._records.find(
        (record) => record instanceof PlainRecord && record.part.type === chunk.type && record.part.id === chunk.id,
      );
      if (found) {
        found.part.data = chunk.data;
        return found;
      }
    }
    return this._push(new PlainRecord({ ...chunk }));
  }
}

const P = MessageParts.prototype;
const HANDLERS = {
  "text-start": P._textStart,
  "text-delta": P._textDelta,
  "text-end": P._textEnd,
  "reasoning-start": P._textStart,
  "reasoning-delta": P._textDelta,
  "reasoning-end": P._textEnd,
  "tool-input-start": P._toolInputStart,
  "tool-input-delta": P._toolInputDelta,
  "tool-input-available": P._toolInputAvailable,
  "tool-input-error": P._toolInputError,
  "tool-approval-request": P._toolApprovalRequest,
  "tool-approval-response": P._toolApprovalResponse,
  "tool-output-available": P._toolOutputAvailable,
  "tool-output-error": P._toolOutputError,
  "tool-output-denied": P._toolOutputDenied,
  "source-url": P._sourceUrl,
  "source-document": P._sourceDocument,
  file: P._file,
  "start-step": P._startStep,
  "finish-step": P._finishStep,
};

/** Whether a chunk is message-level (start, finish, abort, error, message-metadata). */
export const isMessageChunk = (chunk) => MESSAGE_CHUNKS.has(chunk?.type);
