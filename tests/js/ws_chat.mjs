// Drive the relay's /ai-sdk/ws with the AI SDK's own WebSocketChatTransport (ai 7), as useChat
// would, and print one JSON line of what the app would hold.
// Usage: node --experimental-websocket ws_chat.mjs MODE WS_URL CHAT_ID [QUESTION]
//   send    sendMessages with one user message, read to the end:
//           {"ok": true, "id", "parts": [...], "chunks": [types...], "metadata"}
//           or, if the stream failed: {"ok": false, "error": "..."}
//   resume  reconnectToStream, as useChat({ resume: true }) does on mount: {"resumed": false}
//           when the relay answers no-active, else {"resumed": true, ...as send}
//   abort   sendMessages, and abort (Stop) after the first text-delta: prints {"aborted": true,
//           "text": what was held then} at once, and then waits for a line on stdin before it ends
// The token, if any, goes in the URL (?token=).
const { WebSocketChatTransport, readUIMessageStream } = await import(process.env.AI_PACKAGE ?? "ai");

const [mode, url, chatId, asked = "What is the weather in Paris?"] = process.argv.slice(2);
const transport = new WebSocketChatTransport({ url });
const question = {
  id: "u1",
  role: "user",
  parts: [{ type: "text", text: asked }],
};

async function read(stream) {
  const chunks = [];
  const [forMessages, forChunks] = stream.tee();
  const reading = (async () => {
    for await (const chunk of forChunks) chunks.push(chunk.type);
  })();
  let last = null;
  for await (const message of readUIMessageStream({ stream: forMessages })) last = message;
  await reading;
  return {
    id: last?.id ?? null,
    parts: JSON.parse(JSON.stringify(last?.parts ?? [])),
    chunks,
    metadata: last?.metadata ?? null,
  };
}

function print(value) {
  console.log(JSON.stringify(value));
}

try {
  if (mode === "send") {
    const stream = await transport.sendMessages({
      chatId, messages: [question], trigger: "submit-message", messageId: undefined,
      abortSignal: undefined, body: { app: "test" },
    });
    print({ ok: true, ...(await read(stream)) });
  } else if (mode === "resume") {
    const stream = await transport.reconnectToStream({ chatId });
    print(stream === null ? { resumed: false } : { resumed: true, ...(await read(stream)) });
  } else if (mode === "abort") {
    const controller = new AbortController();
    const stream = await transport.sendMessages({
      chatId, messages: [question], trigger: "submit-message", messageId: undefined,
      abortSignal: controller.signal,
    });
    let text = "";
    const reader = stream.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (value.type === "text-delta") {
        text += value.delta;
        controller.abort();
        break;
      }
    }
    print({ aborted: true, text });
    for await (const _ of process.stdin) break;
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
} catch (error) {
  print({ ok: false, error: String(error?.message ?? error) });
}
transport.close();
