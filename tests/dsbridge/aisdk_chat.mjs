// An AI SDK chat carried by @durable-streams/aisdk-transport, its streams on the relay.
// The app (a small Node server here, as an app would be) answers the chat's POST with
// toDurableStreamResponse: the reply's UI message chunks are appended to a Durable Stream on
// the relay, and the client reads them from there. Usage: node aisdk_chat.mjs RELAY_URL
// Prints {"sent": {...}, "resumed": {...}, "idle": ...} as JSON.
import http from "node:http";
import { createDurableChatTransport, toDurableStreamResponse } from "@durable-streams/aisdk-transport";
import { readUIMessageStream } from "ai";

const relay = process.argv[2];
const WORDS = ["Hello", ", ", "durable ", "world", "!"];
const active = new Map(); // chat id -> the read URL of its reply in progress
let release; // lets the second half of the reply go
const halfway = new Promise((resolve) => (release = resolve));
let count = 0;

async function* reply(messageId) {
  yield { type: "start", messageId };
  yield { type: "text-start", id: "t1" };
  for (const [n, word] of WORDS.entries()) {
    if (n === 2) await halfway;
    yield { type: "text-delta", id: "t1", delta: word };
  }
  yield { type: "text-end", id: "t1" };
  yield { type: "finish", finishReason: "stop" };
}

async function body(request) {
  const parts = [];
  for await (const part of request) parts.push(part);
  return JSON.parse(Buffer.concat(parts).toString());
}

async function send(res, response) {
  res.writeHead(response.status, Object.fromEntries(response.headers));
  res.end(Buffer.from(await response.arrayBuffer()));
}

const app = http.createServer(async (req, res) => {
  const url = new URL(req.url, "http://app");
  if (req.method === "POST" && url.pathname === "/api/chat") {
    const { id } = await body(req);
    count += 1;
    const streamUrl = `${relay}/v1/stream/chats/${id}/${count}`;
    active.set(id, streamUrl);
    const response = await toDurableStreamResponse({
      source: reply(`reply-${count}`),
      stream: { writeUrl: streamUrl },
      waitUntil: (done) => done.then(() => active.delete(id)),
    });
    return send(res, response);
  }
  const resume = url.pathname.match(/^\/api\/chat\/([^/]+)\/stream$/);
  if (req.method === "GET" && resume) {
    const streamUrl = active.get(resume[1]);
    if (!streamUrl) return send(res, new Response(null, { status: 204 }));
    return send(res, Response.json({ streamUrl }, { headers: { Location: streamUrl } }));
  }
  res.writeHead(404).end();
});
await new Promise((resolve) => app.listen(0, "127.0.0.1", resolve));
const api = `http://127.0.0.1:${app.address().port}/api/chat`;
const transport = createDurableChatTransport({ api });

const user = { id: "u1", role: "user", parts: [{ type: "text", text: "Hi" }] };
const sent = await transport.sendMessages({
  trigger: "submit-message",
  chatId: "chat-1",
  messageId: undefined,
  messages: [user],
  abortSignal: undefined,
});
// The first half of the reply, then the page "reloads": this reader goes.
let before;
for await (const message of readUIMessageStream({ stream: sent })) {
  before = message;
  if (message.parts[0]?.text === "Hello, ") break;
}
// Resume: the app names the reply's stream; it is read again from its start.
const again = await transport.reconnectToStream({ chatId: "chat-1" });
release();
let resumed;
for await (const message of readUIMessageStream({ stream: again })) resumed = message;
// The reply is over: nothing to resume.
while (active.has("chat-1")) await new Promise((resolve) => setTimeout(resolve, 10));
const idle = await transport.reconnectToStream({ chatId: "chat-1" });
process.stdout.write(JSON.stringify({ sent: before, resumed, idle }) + "\n");
app.close();
process.exit(0);
