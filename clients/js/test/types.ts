// Compiled by `tsc --noEmit --strict` in the tests: the shipped declarations describe the API
// an app is written against, through the package's own exports map.

import {
  ChannelState,
  MessageParts,
  RelayClient,
  type ChannelSnapshot,
  type ChatRequestFrame,
  type ChatTransportRequest,
  type ChatTransportResponse,
  type ChunksFrame,
  type UIMessageChunk,
  type RelayMessage,
  type ServerFrame,
  type UIPart,
} from "token-relay-client";
import { useRelayChannel } from "token-relay-client/react";

const client = new RelayClient("ws://127.0.0.1:8765/subscribe", {
  channels: ["chat-42"],
  token: async () => "a token",
  transport: "auto",
  rewind: 20,
  backoff: { initial: 100 },
  onMessage: (frame, message) => {
    const parts: UIPart[] = frame.parts ?? [];
    const shown: string[] = parts.map((part) => {
      switch (part.type) {
        case "text":
        case "reasoning":
          return part.text;
        case "step-start":
          return "---";
        case "source-url":
          return part.url;
        case "source-document":
        case "file":
          return part.mediaType;
        case "dynamic-tool":
          return `${part.toolName}: ${part.state}`;
        default:
          return "toolCallId" in part ? `${part.toolCallId}: ${part.state}` : part.type;
      }
    });
    void shown;
    const exact: string = frame.text;
    const offset: number = frame.offset;
    const same: boolean = message.text === exact && message.offset === offset;
    void same;
  },
  onStatus: (status, detail) => {
    if (status === "reconnecting") void detail.attempt;
  },
});
client.subscribe("chat-43", { rewind: 0 });
client.unsubscribe("chat-43");
const stop: () => void = client.on("aborted", (frame) => void frame.reason.toUpperCase());
stop();
const cancelled: Promise<boolean> = client.cancel("chat-42", "reply-7");
void cancelled;

const state: ChannelSnapshot = client.getChannel("chat-42");
const texts: string[] = state.messages.map((m: RelayMessage) =>
  m.status === "aborted" ? `${m.text} (${m.reason ?? "?"})` : m.text,
);
void texts;
client.watch("chat-42", (next) => void next.status);

// Live parts: every message has them, streaming or not.
client.on("chunks", (frame: ChunksFrame, message) => {
  const kinds: string[] = frame.chunks.map((chunk) => chunk.type);
  const tools = message.parts.filter((part) => part.type.startsWith("tool-") || part.type === "dynamic-tool");
  void kinds;
  void tools;
});
const assembler = new MessageParts();
const chunk: UIMessageChunk = { type: "tool-input-start", toolCallId: "c1", toolName: "weather" };
const applied: boolean = assembler.apply(chunk) && assembler.delta("Sunny");
void applied;
const joined: ServerFrame = { type: "snapshot", channel: "c", id: "m", text: "", chunks: [{ type: "start-step" }] };
void joined;

// A function component's body would call the hook; here its types are what matter.
const view = (): string => {
  const { messages, status, error } = useRelayChannel(client, "chat-42");
  if (status === "error") return error?.message ?? "";
  return messages
    .map((m) =>
      m.parts
        .map((part) => {
          if (part.type === "reasoning") return `(${part.text})`;
          if (part.type === "text") return part.text;
          if (part.type === "dynamic-tool") return `${part.toolName} ${part.state}`;
          if (part.type.startsWith("tool-") && "toolCallId" in part) return `${part.state}`;
          return "";
        })
        .join(""),
    )
    .join("\n");
};
void view;
void useRelayChannel(null, undefined);

const core = new ChannelState("c");
const frame: ServerFrame = { type: "delta", channel: "c", id: "m", delta: "hi" };
const outcome: "changed" | "duplicate" | "ignored" = core.apply(frame);
void outcome;

// Mistakes an app could make are errors:
// @ts-expect-error an unknown transport
new RelayClient("ws://x/subscribe", { transport: "polling" });
// @ts-expect-error a message's status is one of three
const wrong: RelayMessage["status"] = "done";
void wrong;
// @ts-expect-error an unknown event
client.on("nothing", () => {});
// @ts-expect-error a chunks frame carries chunks, not text
const badChunks: ChunksFrame = { type: "chunks", channel: "c", id: "m", delta: "x" };
void badChunks;
// @ts-expect-error a tool-input-delta's text is inputTextDelta
const badChunk: UIMessageChunk = { type: "tool-input-delta", toolCallId: "c", delta: "x" };
void badChunk;

// The WebSocket chat transport's frames, and the request a producer is handed:
const chatRequest: ChatRequestFrame = {
  type: "request", channel: "chat-1", id: "chat-x", request: "r1",
  trigger: "submit-message", messages: [],
};
void chatRequest;
const resume: ChatTransportRequest = { type: "resume", requestId: "r", id: "chat-1", lastSequence: 4 };
void resume;
const answer: ChatTransportResponse = {
  type: "chunk", requestId: "r", sequence: 5, chunk: { type: "text-delta", id: "t", delta: "x" },
};
void answer;
// @ts-expect-error a chunk frame carries its sequence
const unnumbered: ChatTransportResponse = { type: "chunk", requestId: "r", chunk: { type: "finish" } };
void unnumbered;
