// Type declarations of token-relay-client.

/** Why a message died unfinished. */
export type AbortReason =
  | "producer_disconnected"
  | "idle_timeout"
  | "message_too_large"
  | "shutdown"
  | "relay_lost"
  | "cancelled"
  | "error";

/** What the model reported with a message (usage, finish_reason, model name…). */
export type Meta = { [key: string]: unknown };

// ---------------------------------------------------------------- parts

/** Provider-specific metadata, as the AI SDK passes it through. */
export type ProviderMetadata = { [provider: string]: { [key: string]: unknown } };

/** A text part; a message's `text` is its text parts' texts joined. */
export interface TextUIPart {
  type: "text";
  text: string;
  state?: "streaming" | "done";
  providerMetadata?: ProviderMetadata;
  citations?: unknown[];
}
export interface ReasoningUIPart {
  type: "reasoning";
  /** The chunk id it streamed under. */
  id?: string;
  text: string;
  state?: "streaming" | "done";
  providerMetadata?: ProviderMetadata;
}
/** Where a tool call is: its input streaming or given, then its output (or error, or denial). */
export type ToolState =
  | "input-streaming"
  | "input-available"
  | "approval-requested"
  | "approval-responded"
  | "output-available"
  | "output-error"
  | "output-denied";
interface ToolCallFields {
  toolCallId: string;
  state: ToolState;
  /** The parsed input. While it streams (state "input-streaming"): the text so far repaired
   * into JSON as `ai` repairs it (absent while that text holds no value yet), or the text
   * itself if `inputEncoding` is "text". */
  input?: unknown;
  /** The input text as it streamed (while it streams, and after it failed to be whole). */
  rawInput?: unknown;
  inputEncoding?: "json" | "text";
  output?: unknown;
  errorText?: string;
  preliminary?: boolean;
  providerExecuted?: boolean;
  title?: string;
  toolMetadata?: { [key: string]: unknown };
  callProviderMetadata?: ProviderMetadata;
  resultProviderMetadata?: ProviderMetadata;
  approval?: { id: string; approved?: boolean; reason?: string; [key: string]: unknown };
}
/** A call of the tool `NAME` (type `tool-NAME`). */
export interface ToolUIPart extends ToolCallFields {
  type: `tool-${string}`;
}
/** A call of a tool not known in advance (`dynamic: true` on its start). */
export interface DynamicToolUIPart extends ToolCallFields {
  type: "dynamic-tool";
  toolName: string;
}
export interface SourceUrlUIPart {
  type: "source-url";
  sourceId: string;
  url: string;
  title?: string;
  providerMetadata?: ProviderMetadata;
}
export interface SourceDocumentUIPart {
  type: "source-document";
  sourceId: string;
  mediaType: string;
  title: string;
  filename?: string;
  providerMetadata?: ProviderMetadata;
}
export interface FileUIPart {
  type: "file";
  mediaType: string;
  url: string;
  filename?: string;
  providerMetadata?: ProviderMetadata;
}
/** An app-defined part (type `data-NAME`); one with an `id` is updated in place. */
export interface DataUIPart {
  type: `data-${string}`;
  id?: string;
  data: unknown;
}
export interface StepStartUIPart {
  type: "step-start";
}
/** One part of a structured message, in the shape `readUIMessageStream` of `ai` 7 gives. */
export type UIPart =
  | TextUIPart
  | ReasoningUIPart
  | ToolUIPart
  | DynamicToolUIPart
  | SourceUrlUIPart
  | SourceDocumentUIPart
  | FileUIPart
  | DataUIPart
  | StepStartUIPart;

// ---------------------------------------------------------------- chunks (ai 7's UIMessageChunk)

interface ToolChunkFields {
  toolCallId: string;
  providerExecuted?: boolean;
  providerMetadata?: ProviderMetadata;
  toolMetadata?: { [key: string]: unknown };
}
/** One chunk of the AI SDK's UI message stream that builds a part (`UIMessageChunk` of `ai` 7,
 * less the message-level ones: start, finish, abort, error, message-metadata). */
export type UIMessageChunk =
  | { type: "text-start" | "reasoning-start"; id: string; providerMetadata?: ProviderMetadata }
  | { type: "text-delta" | "reasoning-delta"; id: string; delta: string; providerMetadata?: ProviderMetadata }
  | { type: "text-end"; id: string; providerMetadata?: ProviderMetadata; citations?: unknown[] }
  | { type: "reasoning-end"; id: string; providerMetadata?: ProviderMetadata }
  | (ToolChunkFields & {
      type: "tool-input-start";
      toolName: string;
      dynamic?: boolean;
      title?: string;
      inputEncoding?: "json" | "text";
    })
  | { type: "tool-input-delta"; toolCallId: string; inputTextDelta: string }
  | (ToolChunkFields & { type: "tool-input-available"; toolName: string; input: unknown; dynamic?: boolean; title?: string })
  | (ToolChunkFields & { type: "tool-input-error"; toolName: string; input: unknown; errorText: string; dynamic?: boolean })
  | {
      type: "tool-approval-request";
      toolCallId: string;
      approvalId: string;
      approvalDescriptor?: unknown;
      inputSchemaInput?: unknown;
      reason?: string;
      isAutomatic?: boolean;
      signature?: string;
    }
  | {
      type: "tool-approval-response";
      approvalId: string;
      approved: boolean;
      reason?: string;
      providerExecuted?: boolean;
      providerMetadata?: ProviderMetadata;
    }
  | (ToolChunkFields & { type: "tool-output-available"; output: unknown; preliminary?: boolean })
  | (ToolChunkFields & { type: "tool-output-error"; errorText: string })
  | { type: "tool-output-denied"; toolCallId: string }
  | { type: "source-url"; sourceId: string; url: string; title?: string; providerMetadata?: ProviderMetadata }
  | {
      type: "source-document";
      sourceId: string;
      mediaType: string;
      title: string;
      filename?: string;
      providerMetadata?: ProviderMetadata;
    }
  | { type: "file"; url: string; mediaType: string; providerMetadata?: ProviderMetadata }
  | { type: `data-${string}`; id?: string; data: unknown; transient?: boolean }
  | { type: "start-step" | "finish-step" };

// ---------------------------------------------------------------- frames from the relay

export interface SubscribedFrame {
  type: "subscribed";
  channel: string;
  offset: number;
  epoch: string;
  /** Present when the subscribe had `since`: whether every missed message was replayed. */
  recovered?: boolean;
  /** Present when history follows (since or rewind): how many messages. */
  replayed?: number;
}
export interface UnsubscribedFrame {
  type: "unsubscribed";
  channel: string;
}
export interface SnapshotFrame {
  type: "snapshot";
  channel: string;
  id: string;
  /** The text so far (of a structured message: its text parts' texts joined). */
  text: string;
  /** The text is what follows the first `from` characters (code points) already held. */
  from?: number;
  /** Of a structured message: the reply so far, compacted (per part its start, one delta,
   * its end if it ended), to feed after a `start`. It replaces what was held of the message. */
  chunks?: UIMessageChunk[];
}
/** Text for a message that is still plain: it extends its implicit text part (chunk id "text"). */
export interface DeltaFrame {
  type: "delta";
  channel: string;
  id: string;
  delta: string;
}
/** What a structured message's producer sent, as chunks, in order (a delta as a text-delta on
 * the part "text", after a text-start where it opens that part). */
export interface ChunksFrame {
  type: "chunks";
  channel: string;
  id: string;
  chunks: UIMessageChunk[];
}
export interface MessageFrame {
  type: "message";
  channel: string;
  id: string;
  text: string;
  /** Present only for a structured message: every part (delivered whole). */
  parts?: UIPart[];
  meta?: Meta;
  offset: number;
  epoch: string;
}
export interface AbortedFrame {
  type: "aborted";
  channel: string;
  id: string;
  text: string;
  /** Present only for a structured message: its parts as they were. */
  parts?: UIPart[];
  reason: AbortReason;
  meta?: Meta;
  offset: number;
  epoch: string;
}
export interface ErrorFrame {
  type: "error";
  code: string;
  message: string;
  /** The message a refused cancel named. */
  id?: string | null;
  /** The channel a refused subscribe, unsubscribe or cancel named. */
  channel?: string;
}
export type ServerFrame =
  | SubscribedFrame
  | UnsubscribedFrame
  | SnapshotFrame
  | DeltaFrame
  | ChunksFrame
  | MessageFrame
  | AbortedFrame
  | ErrorFrame;

// ------------------------------------------- the AI SDK's WebSocketChatTransport (/ai-sdk/ws)

/** Relay -> producer: a chat's `send` over `ws://HOST/ai-sdk/ws`, handed to a producer
 * connected with `?channel=` naming the chat. Answer it by streaming a reply under `id` on
 * `channel`, as any message. */
export interface ChatRequestFrame {
  type: "request";
  channel: string;
  /** The id the reply must have. */
  id: string;
  /** The transport's requestId. */
  request: string;
  trigger: "submit-message" | "regenerate-message";
  messageId?: string;
  /** The chat's UIMessages, as the transport sent them. */
  messages: unknown[];
  body?: { [key: string]: unknown };
  metadata?: unknown;
}

/** Client -> relay on `/ai-sdk/ws` (what `WebSocketChatTransport` of `ai` 7 sends). */
export type ChatTransportRequest =
  | {
      type: "send";
      requestId: string;
      /** The chat id: the channel. */
      id: string;
      trigger: "submit-message" | "regenerate-message";
      messageId?: string;
      messages: unknown[];
      headers?: { [name: string]: string };
      body?: { [key: string]: unknown };
      metadata?: unknown;
    }
  | {
      type: "resume";
      requestId: string;
      id: string;
      /** Continue request `requestId` after its chunk `lastSequence`. */
      lastSequence?: number;
      headers?: { [name: string]: string };
      body?: { [key: string]: unknown };
      metadata?: unknown;
    }
  | { type: "abort"; requestId: string };

/** Relay -> client on `/ai-sdk/ws`. `sequence` counts a request's chunks from 0; an error's
 * `errorText` starts with its code (`no_producer: …`). */
export type ChatTransportResponse =
  | { type: "start"; requestId: string }
  | { type: "chunk"; requestId: string; sequence: number; chunk: UIMessageChunk }
  | { type: "end"; requestId: string }
  | { type: "no-active"; requestId: string }
  | { type: "error"; requestId: string; errorText: string };

export interface SubscribeFrame {
  type: "subscribe";
  channel: string;
  deltas: boolean;
  since?: { offset: number; epoch: string };
  rewind?: number;
  positions?: { [id: string]: number };
}

// ---------------------------------------------------------------- state

export type MessageStatus = "streaming" | "complete" | "aborted";

export interface RelayMessage {
  readonly id: string;
  readonly channel: string;
  /** All of the text so far (its text parts' texts joined); exact once `status` is "complete". */
  readonly text: string;
  /** Its parts: live while it streams (a plain message's text is one text part), and once it
   * ends exactly the relay's (`readUIMessageStream`'s of `ai` 7). Frozen; a part no frame
   * changed keeps its identity. */
  readonly parts: readonly UIPart[];
  readonly status: MessageStatus;
  /** Why it was aborted (status "aborted"). */
  readonly reason?: AbortReason;
  readonly meta?: Meta;
  /** The channel offset of a complete or aborted message. */
  readonly offset?: number;
}

export type ChannelStatus = "idle" | "connecting" | "live" | "reconnecting" | "error" | "closed";

export interface RelayErrorInfo {
  readonly code: string;
  readonly message: string;
  /** The HTTP status of a refusal. */
  readonly status?: number;
}

export interface ChannelSnapshot {
  readonly channel: string;
  readonly status: ChannelStatus;
  readonly error: RelayErrorInfo | null;
  /** True once history could not fill a gap (messages were missed for good). */
  readonly gap: boolean;
  readonly messages: readonly RelayMessage[];
}

export type ConnectionStatus = "idle" | "connecting" | "open" | "reconnecting" | "error" | "closed";
export type Transport = "websocket" | "sse";

export interface StatusDetail {
  attempt?: number;
  delay?: number;
  code?: number;
  status?: number;
  reason?: string;
  message?: string;
  transport?: Transport | null;
}

export interface RelayClientEvents {
  status: (status: ConnectionStatus, detail: StatusDetail) => void;
  frame: (frame: ServerFrame) => void;
  snapshot: (frame: SnapshotFrame, message: RelayMessage) => void;
  delta: (frame: DeltaFrame, message: RelayMessage) => void;
  chunks: (frame: ChunksFrame, message: RelayMessage) => void;
  message: (frame: MessageFrame, message: RelayMessage) => void;
  aborted: (frame: AbortedFrame, message: RelayMessage) => void;
  error: (error: ErrorFrame | (RelayErrorInfo & { type: "error" })) => void;
  channel: (state: ChannelSnapshot) => void;
}

type Callbacks = {
  [K in keyof RelayClientEvents as `on${Capitalize<K>}`]?: RelayClientEvents[K];
};

export interface RelayClientOptions extends Callbacks {
  /** Channels to subscribe at once. Default: none. */
  channels?: string[];
  /** Live deltas (and snapshots of messages in progress). Default: true. */
  deltas?: boolean;
  /** How many recent messages a fresh channel starts with. Default: 100 (the relay caps it
   * at its --history-size). 0: none. */
  rewind?: number;
  /** A token, or a function called on every (re)connect, so a page can refresh it. */
  token?: string | (() => string | null | undefined | Promise<string | null | undefined>);
  /** "auto" (WebSocket, SSE when WebSockets fail), "websocket" or "sse". Default: "auto". */
  transport?: "auto" | Transport;
  /** The relay's SSE endpoint. Default: the subscribe URL's host, path `/sse`. */
  sseUrl?: string;
  /** The relay's POST /cancel endpoint. Default: next to sseUrl. */
  cancelUrl?: string;
  /** Reconnect delays: doubling from `initial` to `max` ms, with jitter. Default 250 and 10000. */
  backoff?: { initial?: number; max?: number };
  /** How long a WebSocket may stay silent after connecting before it counts as failed (ms).
   * Default: 5000. */
  openTimeout?: number;
  /** Messages kept per channel; the oldest finished ones go first. Default: 500. */
  maxMessages?: number;
  /** A WebSocket class (for runtimes without a global one). */
  WebSocket?: typeof WebSocket;
  /** A fetch function. Default: the global fetch. */
  fetch?: typeof fetch;
}

export declare class RelayClient {
  constructor(url: string, options?: RelayClientOptions);
  readonly url: string;
  readonly sseUrl: string;
  readonly status: ConnectionStatus;
  readonly transport: Transport | null;
  readonly error: RelayErrorInfo | null;
  /** The channels held now. */
  readonly channels: string[];
  on<K extends keyof RelayClientEvents>(event: K, listener: RelayClientEvents[K]): () => void;
  subscribe(channel: string, options?: { rewind?: number }): void;
  unsubscribe(channel: string): void;
  /** Hold a channel while something shows it; the returned function lets it go. */
  retain(channel: string): () => void;
  getChannel(channel: string): ChannelSnapshot;
  watch(channel: string, listener: (state: ChannelSnapshot) => void): () => void;
  /** Ask the producer of message `id` to stop; true if the relay took the request. */
  cancel(channel: string, id: string): Promise<boolean>;
  close(): void;
}

/** The relay's SSE endpoint for its WebSocket subscribe URL. */
export declare function sseUrlFor(url: string): string;

/** The number of Unicode code points in a text: the relay counts characters this way. */
export declare function codePoints(text: string): number;

/** The `?since=` token of an SSE stream for some channels' positions. */
export declare function encodeSince(positions: Map<string, { offset: number; epoch: string }>): string;

/** The chunk id of a message's implicit text part, the one `delta` frames extend. */
export declare const IMPLICIT_TEXT: "text";

/** One message's parts, assembled from UI message chunks as `readUIMessageStream` of `ai` 7
 * assembles them (no I/O; lenient: a chunk it cannot place is ignored). */
export declare class MessageParts {
  constructor();
  /** Apply one chunk; whether it changed the parts. */
  apply(chunk: UIMessageChunk | { type: string; [key: string]: unknown }): boolean;
  /** Extend the implicit text part (chunk id "text"), opening it on the first delta. */
  delta(text: string): boolean;
  /** The parts, frozen; the same array until a chunk changes them. */
  parts(): readonly UIPart[];
  /** The text parts' texts, joined. */
  text(): string;
}

/** `fixJson` of `ai`: close what a JSON text cut short left open. */
export declare function fixJson(text: string): string;
/** `parsePartialJson` of `ai`: the text as JSON, or repaired, or undefined. */
export declare function parsePartialJson(text: string): unknown;

export type ApplyOutcome = "changed" | "duplicate" | "ignored";

/** One channel's messages and resume position, from the relay's frames (no I/O). */
export declare class ChannelState {
  constructor(channel: string, options?: { maxMessages?: number });
  readonly channel: string;
  readonly position: { offset: number; epoch: string } | null;
  readonly messages: ReadonlyMap<string, RelayMessage>;
  readonly status: ChannelStatus;
  readonly gap: boolean;
  subscribeFrame(options?: { deltas?: boolean; rewind?: number }): SubscribeFrame;
  apply(frame: ServerFrame): ApplyOutcome;
  setStatus(status: ChannelStatus, force?: boolean): ApplyOutcome;
  fail(error: RelayErrorInfo): ApplyOutcome;
  snapshot(): ChannelSnapshot;
}

export interface ServerSentEvent {
  event: string;
  data: string;
  id: string | undefined;
}

/** Chunks of an event stream in, events out. */
export declare class EventStreamParser {
  push(text: string): ServerSentEvent[];
}
