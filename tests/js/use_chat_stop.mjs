// Send a chat message to a Next.js route module (compiled) as useChat does, and read its
// answer with readUIMessageStream while Stop is pressed on the relay. The route's own calls
// to the relay go through, and its producer call is watched: the body it sends (a copy of
// it, read here to its end) and the relay's answer to it. Prints, after what the route logs,
// one JSON line:
//   {id, parts, answer, model}   the page's message, the relay's answer to the producer call,
//                                and the UI message stream the model sent, as SSE text
// Usage: RELAY_URL=http://127.0.0.1:PORT node use_chat_stop.mjs ROUTE_MODULE.js CHAT_ID
const { DefaultChatTransport, readUIMessageStream } = await import(process.env.AI_PACKAGE ?? "ai");

const [app, chatId] = process.argv.slice(2);
const relayFetch = globalThis.fetch;
let answered;
const produced = new Promise((resolve) => {
  answered = resolve;
});
globalThis.fetch = async (url, init) => {
  if (!String(url).includes("/produce")) return relayFetch(url, init);
  const [toRelay, watched] = init.body.tee();
  const model = new Response(watched).text();
  const response = await relayFetch(url, { ...init, body: toRelay });
  answered({ answer: await response.clone().json(), model });
  return response;
};

const { POST } = await import(app);
const transport = new DefaultChatTransport({
  api: "http://app.example/api/chat",
  fetch: (url, init) => POST(new Request(url, init)),
});
const stream = await transport.sendMessages({
  chatId,
  messages: [{ id: "u1", role: "user", parts: [{ type: "text", text: "hi" }] }],
  trigger: "submit-message",
  messageId: undefined,
  abortSignal: undefined,
});
let last = null;
for await (const message of readUIMessageStream({ stream })) last = message;
const { answer, model } = await produced;
console.log(
  JSON.stringify({
    id: last.id,
    parts: JSON.parse(JSON.stringify(last.parts)),
    answer,
    model: await model,
  }),
);
process.exit(0);
