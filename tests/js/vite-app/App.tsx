// The app of a new user: a fresh Vite React-TS project whose App.tsx is this file, with
// token-relay-client installed from its packed tarball. main.tsx renders it in StrictMode.
import { useEffect, useState } from "react";
import { RelayClient, type RelayMessage, type UIPart } from "token-relay-client";
import { useRelayChannel } from "token-relay-client/react";

const params = new URLSearchParams(window.location.search);
const client = new RelayClient(`ws://${window.location.host}/subscribe`, {
  transport: params.get("transport") === "sse" ? "sse" : "auto",
});

// Every text a message was rendered with, for the test to check the text only ever grew;
// and the parts it was last rendered with.
declare global {
  interface Window {
    rendered: Record<string, string[]>;
    parts: Record<string, readonly UIPart[]>;
  }
}
window.rendered = {};
window.parts = {};

/** A part in a few words: its type and state (a tool's name, for a dynamic one). */
function describe(part: UIPart): string {
  if (part.type === "dynamic-tool") return `dynamic-tool/${part.toolName}:${part.state}`;
  if (part.type === "text" || part.type === "reasoning") return `${part.type}:${part.state ?? ""}`;
  if ("toolCallId" in part) return `${part.type}:${part.state}`;
  return part.type;
}

function Message({ message }: { message: RelayMessage }) {
  useEffect(() => {
    (window.rendered[message.id] ??= []).push(message.text);
  }, [message.id, message.text]);
  useEffect(() => {
    window.parts[message.id] = message.parts;
  }, [message.id, message.parts]);
  return (
    <li data-id={message.id} data-status={message.status} data-parts={message.parts.map(describe).join(" ")}>
      {message.text}
    </li>
  );
}

export default function App() {
  const [channel] = useState(() => params.get("channel") ?? "chat");
  const { messages, status, error } = useRelayChannel(client, channel);
  return (
    <main>
      <p id="status" data-status={status}>
        {status}
        {error ? `: ${error.message}` : ""}
      </p>
      <ul id="messages">
        {messages.map((message) => (
          <Message key={message.id} message={message} />
        ))}
      </ul>
    </main>
  );
}
