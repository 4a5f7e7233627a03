// Node's fetch (undici, which the AI SDK uses) keeps its sockets in a pool and reuses them.
// Each round resumes a chat's stream with the AI SDK's own reconnectToStream, reads it to
// its end, then fetches /healthz from the same origin, on the socket the stream left in the
// pool. Prints each round's outcome as JSON; a socket the relay closed after promising to
// keep it fails the next fetch ("fetch failed").
// Usage: node keep_alive.mjs BASE_URL CHAT_ID ROUNDS [QUERY]
// The AI SDK at its current major ("ai"), or the package AI_PACKAGE names ("ai-v6": the one
// before).
const { DefaultChatTransport, readUIMessageStream } = await import(process.env.AI_PACKAGE ?? "ai");

const [base, chatId, rounds, query = ""] = process.argv.slice(2);
const transport = new DefaultChatTransport({
  api: `${base}/ai-sdk`,
  prepareReconnectToStreamRequest: ({ id }) => ({
    api: `${base}/ai-sdk/${encodeURIComponent(id)}/stream${query}`,
  }),
});
const results = [];
for (let round = 0; round < Number(rounds); round += 1) {
  const result = {};
  try {
    const stream = await transport.reconnectToStream({ chatId });
    result.resumed = stream !== null;
    if (stream !== null) {
      let last = null;
      for await (const message of readUIMessageStream({ stream })) last = message;
      result.text = last.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
    }
  } catch (error) {
    result.stream = String(error.cause ?? error);
  }
  try {
    const health = await fetch(`${base}/healthz`);
    result.health = `${health.status} ${(await health.text()).trim()}`;
  } catch (error) {
    result.health = String(error.cause ?? error);
  }
  results.push(result);
}
console.log(JSON.stringify(results));
