// Follow one chat reply to its end with the AI SDK's own DefaultChatTransport and
// readUIMessageStream, across cuts: resume the chat's stream (?wait=10: the reply about to
// start), and whenever a stream ends before its reply did (no finish nor abort: the relay it
// read from stopped), resume it again by its id, as an app's resumeStream() does; each resume
// replays the reply from its start under the same messageId. Prints, as JSON, the final
// message's id, text and text states, and per stream read the chunk types and the text it
// held. With SAY_OPEN set, it writes "open" to stderr once the first stream is open.
// Usage: node ai_sdk_follow.mjs BASE_URL CHAT_ID
const { DefaultChatTransport, readUIMessageStream } = await import(process.env.AI_PACKAGE ?? "ai");

const [base, chatId] = process.argv.slice(2);
let query = "?wait=10";
const streams = [];
const errors = [];
let last = null;
for (let attempt = 0; attempt < 40; attempt += 1) {
  const transport = new DefaultChatTransport({
    api: `${base}/ai-sdk`,
    prepareReconnectToStreamRequest: ({ id }) => ({
      api: `${base}/ai-sdk/${encodeURIComponent(id)}/stream${query}`,
    }),
  });
  let stream;
  try {
    stream = await transport.reconnectToStream({ chatId });
  } catch (error) {
    errors.push(`reconnect: ${error}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
    continue;
  }
  if (stream === null) {
    errors.push(`204 for ${query}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
    continue;
  }
  if (attempt === 0 && process.env.SAY_OPEN) process.stderr.write("open\n");
  const parts = [];
  let message = null;
  const [forMessages, forParts] = stream.tee();
  const reading = (async () => {
    for await (const part of forParts) parts.push(part.type);
  })().catch((error) => errors.push(`parts: ${error}`));
  try {
    for await (const update of readUIMessageStream({ stream: forMessages })) message = update;
  } catch (error) {
    errors.push(`read: ${error}`);
  }
  await reading;
  const text = message
    ? message.parts.filter((p) => p.type === "text").map((p) => p.text).join("")
    : null;
  streams.push({ parts, id: message?.id ?? null, text });
  if (message) last = message;
  if (parts.includes("finish") || parts.includes("abort") || parts.includes("error")) break;
  if (last) query = `?id=${encodeURIComponent(last.id)}`;
}
const text = last ? last.parts.filter((p) => p.type === "text").map((p) => p.text).join("") : null;
const states = last ? last.parts.filter((p) => p.type === "text").map((p) => p.state) : null;
console.log(JSON.stringify({ id: last?.id ?? null, text, states, streams, errors }));
