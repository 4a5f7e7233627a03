// Send a chat message to a running app's chat endpoint as useChat does (the AI SDK's
// DefaultChatTransport), and read the answer with readUIMessageStream while the test presses
// Stop on the relay. Prints a JSON line {"replying": ID} once the reply's first text has
// arrived (the test then presses Stop), and, at the stream's end, {"id", "parts"}.
// Usage: node use_chat_stopped.mjs http://…/api/chat CHAT_ID TEXT
const { DefaultChatTransport, readUIMessageStream } = await import(process.env.AI_PACKAGE ?? "ai");

const [api, chatId, text] = process.argv.slice(2);
const transport = new DefaultChatTransport({ api });
const stream = await transport.sendMessages({
  chatId,
  messages: [{ id: "u1", role: "user", parts: [{ type: "text", text }] }],
  trigger: "submit-message",
  messageId: undefined,
  abortSignal: undefined,
});
let last = null;
for await (const message of readUIMessageStream({ stream })) {
  if (last === null && message.parts.some((part) => part.type === "text" && part.text)) {
    console.log(JSON.stringify({ replying: message.id }));
  }
  if (message.parts.some((part) => part.type === "text" && part.text)) last = message;
}
console.log(JSON.stringify({ id: last.id, parts: JSON.parse(JSON.stringify(last.parts)) }));
