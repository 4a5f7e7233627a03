// The app of a new user: a fresh Vite React-TS project whose App.tsx is this file, with
// token-relay-client installed from its packed tarball. main.tsx renders it in StrictMode.
import { useEffect, useState } from "react";
import { RelayClient, type RelayMessage } from "token-relay-client";
import { useRelayChannel } from "token-relay-client/react";

const params = new URLSearchParams(window.location.search);
const client = new RelayClient(`ws://${window.location.host}/subscribe`, {
  transport: params.get("transport") === "sse" ? "sse" : "auto",
});

// Every text a message was rendered with, for the test to check the text only ever grew.
declare global {
  interface Window {
    rendered: Record<string, string[]>;
  }
}
window.rendered = {};

function Message({ message }: { message: RelayMessage }) {
  useEffect(() => {
    (window.rendered[message.id] ??= []).push(message.text);
  }, [message.id, message.text]);
  return (
    <li data-id={message.id} data-status={message.status}>
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
