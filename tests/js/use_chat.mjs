// Send a chat message as useChat does, with the AI SDK's DefaultChatTransport, and read the
// answer with readUIMessageStream. The app is either a Next.js route module (compiled),
// called in this process, or a running server's chat endpoint URL.
// Usage: RELAY_URL=http://127.0.0.1:PORT node use_chat.mjs ROUTE_MODULE.js|http://…/api/chat CHAT_ID
// The AI SDK at its current major ("ai"), or the package AI_PACKAGE names ("ai-v6": the one
// before).
const { DefaultChatTransport, readUIMessageStream } = await import(process.env.AI_PACKAGE ?? "ai");

const [app, chatId] = process.argv.slice(2);
let transport;
if (app.startsWith("http")) {
  transport = new DefaultChatTransport({ api: app });
} else {
  const { POST } = await import(app);
  transport = new DefaultChatTransport({
    api: "http://app.example/api/chat",
    fetch: (url, init) => POST(new Request(url, init)),
  });
}
const stream = await transport.sendMessages({
  chatId,
  messages: [{ id: "u1", role: "user", parts: [{ type: "text", text: "hi" }] }],
  trigger: "submit-message",
  messageId: undefined,
  abortSignal: undefined,
});
let last = null;
for await (const message of readUIMessageStream({ stream })) last = message;
const text = last.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
console.log(JSON.stringify({ id: last.id, text }));
