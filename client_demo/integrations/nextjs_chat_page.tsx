// app/chat/[id]/chat.tsx: the chat page, rendered as <ChatPage chatId={id} /> by the page of
// app/chat/[id]/page.tsx. It sends to the app's route (app/api/chat/route.ts), restores the
// chat's replies from the relay after a reload, resumes a reply in progress from the relay,
// and its Stop stops the model too.
"use client";

import { useChat } from "@ai-sdk/react";
import { DefaultChatTransport, validateUIMessages, type UIMessage } from "ai";
import { useEffect, useState } from "react";

const RELAY = process.env.NEXT_PUBLIC_RELAY_URL ?? "http://127.0.0.1:8765";

function relay(chatId: string, path: string): string {
  return `${RELAY}/ai-sdk/${encodeURIComponent(chatId)}/${path}`;
}

const transport = new DefaultChatTransport({
  api: "/api/chat",
  // A reply in progress is read again from the relay, from its start: after a reload, too.
  prepareReconnectToStreamRequest: ({ id }) => ({ api: relay(id, "stream") }),
});

export default function ChatPage({ chatId }: { chatId: string }) {
  // The chat's replies so far, from the relay's history, before useChat starts.
  const [history, setHistory] = useState<UIMessage[]>();
  useEffect(() => {
    void (async () => {
      const replies = (await (await fetch(relay(chatId, "messages"))).json()) as unknown[];
      // validateUIMessages refuses an empty list: a new chat has nothing to check.
      setHistory(replies.length ? await validateUIMessages({ messages: replies }) : []);
    })();
  }, [chatId]);
  return history ? <Chat chatId={chatId} history={history} /> : <p>Loading…</p>;
}

function Chat({ chatId, history }: { chatId: string; history: UIMessage[] }) {
  const { messages, sendMessage, stop, status } = useChat({
    id: chatId,
    messages: history,
    resume: true,
    transport,
  });
  const [input, setInput] = useState("");

  // The relay ends the reply and answers the route's call with "stopped", so the route aborts
  // its model; stop() closes this page's stream (alone, it would stop nothing else).
  function stopReply(replyId: string) {
    void fetch(`${relay(chatId, "stop")}?id=${encodeURIComponent(replyId)}`, { method: "POST" });
    void stop();
  }

  const busy = status === "submitted" || status === "streaming";
  const reply = messages.at(-1);
  return (
    <main data-status={status}>
      <ul>
        {messages.map((message) => (
          <li key={message.id} data-id={message.id} data-role={message.role}>
            {message.parts.map((part, index) =>
              part.type === "text" ? (
                <span key={index} data-state={part.state}>
                  {part.text}
                </span>
              ) : null,
            )}
          </li>
        ))}
      </ul>
      <form
        onSubmit={(event) => {
          event.preventDefault();
          void sendMessage({ text: input });
          setInput("");
        }}
      >
        <input value={input} onChange={(event) => setInput(event.target.value)} />
        <button type="submit" disabled={busy || !input}>
          Send
        </button>
        {status === "streaming" && reply?.role === "assistant" ? (
          <button type="button" onClick={() => stopReply(reply.id)}>
            Stop
          </button>
        ) : null}
      </form>
    </main>
  );
}
