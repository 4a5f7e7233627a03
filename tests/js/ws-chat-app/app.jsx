// useChat over the relay: the AI SDK's WebSocketChatTransport at ws://HOST/ai-sdk/ws, the chat
// id (?chat=) as the relay channel, resume on mount, the chat's replies restored from the
// relay's history (GET /ai-sdk/CHAT/messages) before useChat starts, as the chat-app recipe's
// page does. The page shows the status and each message's text, and keeps the messages on
// window.chat for the test to read.
import { useChat } from "@ai-sdk/react";
import { WebSocketChatTransport, validateUIMessages } from "ai";
import { useEffect, useState } from "react";
import { createRoot } from "react-dom/client";

const params = new URLSearchParams(location.search);
const chatId = params.get("chat");
const transport = new WebSocketChatTransport({ url: `ws://${location.host}/ai-sdk/ws` });

function App() {
  const [history, setHistory] = useState();
  useEffect(() => {
    void (async () => {
      const response = await fetch(`/ai-sdk/${encodeURIComponent(chatId)}/messages`);
      const replies = await response.json();
      // validateUIMessages refuses an empty list: a new chat has nothing to check.
      setHistory(replies.length ? await validateUIMessages({ messages: replies }) : []);
    })();
  }, []);
  return history ? <Chat history={history} /> : <p id="loading">Loading…</p>;
}

function Chat({ history }) {
  const { messages, sendMessage, stop, status, error } = useChat({
    id: chatId,
    messages: history,
    transport,
    resume: true,
  });
  window.chat = { messages, status, error: error ? String(error.message) : null };
  return (
    <div>
      <div id="status" data-status={status}>{status}</div>
      <button id="send" onClick={() => sendMessage({ text: "What is the weather in Paris?" })}>
        Send
      </button>
      <button id="stop" onClick={() => stop()}>Stop</button>
      <ul id="messages">
        {messages.map((message) => (
          <li key={message.id} data-role={message.role}>
            {message.parts.map((part) => (part.type === "text" ? part.text : "")).join("")}
          </li>
        ))}
      </ul>
    </div>
  );
}

createRoot(document.getElementById("root")).render(<App />);
