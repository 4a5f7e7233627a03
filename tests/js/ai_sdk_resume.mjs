// Resume a chat's stream with the AI SDK's own DefaultChatTransport and readUIMessageStream,
// as useChat({ resume: true }) does on mount, and print what the app would hold, as JSON: the
// message's id, text, text states and metadata, the chunk types read, and (as "message") the
// final message.parts.
// Usage: node ai_sdk_resume.mjs BASE_URL CHAT_ID [QUERY]
// With SAY_OPEN set, it writes "open" to stderr once the relay answered with a stream: the relay
// answers only once the stream has joined the channel, so what is sent from then on comes live.
// The AI SDK at its current major ("ai"), or the package AI_PACKAGE names ("ai-v6": the one
// before).
const { DefaultChatTransport, readUIMessageStream } = await import(process.env.AI_PACKAGE ?? "ai");

const [base, chatId, query = ""] = process.argv.slice(2);
const transport = new DefaultChatTransport({
  api: `${base}/ai-sdk`,
  prepareReconnectToStreamRequest: ({ id }) => ({
    api: `${base}/ai-sdk/${encodeURIComponent(id)}/stream${query}`,
  }),
});
const stream = await transport.reconnectToStream({ chatId });
if (stream !== null && process.env.SAY_OPEN) process.stderr.write("open\n");
if (stream === null) {
  console.log(JSON.stringify({ resumed: false }));
} else {
  let last = null;
  let updates = 0;
  const parts = [];
  const [forMessages, forParts] = stream.tee();
  const reading = (async () => {
    for await (const part of forParts) parts.push(part.type);
  })();
  for await (const message of readUIMessageStream({ stream: forMessages })) {
    last = message;
    updates += 1;
  }
  await reading;
  const text = last.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
  const states = last.parts.filter((p) => p.type === "text").map((p) => p.state);
  const metadata = last.metadata ?? null;
  const message = JSON.parse(JSON.stringify(last.parts)); // undefined keys dropped, as on the wire
  console.log(
    JSON.stringify({ resumed: true, id: last.id, text, states, updates, parts, metadata, message }),
  );
}
