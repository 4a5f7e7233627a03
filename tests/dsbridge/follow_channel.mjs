// Follows a Durable Stream live with the official client, for as long as it runs, printing
// each batch as one JSON line as it comes: {"items": [...], "offset": "..."} (the offset to
// read on from after it); if the client gives up, {"error": "..."} and exit code 1.
// Usage: node follow_channel.mjs URL OFFSET LIVE   (LIVE: sse or long-poll)
import { stream } from "@durable-streams/client";

const [url, offset, live] = process.argv.slice(2);
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");
try {
  // The client's defaults end a live SSE read after three connections shorter than a
  // second in a row (0.2.7 says it falls back to long-poll, but closes the stream): a test's
  // rolling restart, one process after the other a fraction of a second apart, cuts that
  // often. A deployment's restarts come seconds apart; here the client is told to reconnect.
  const sseResilience = { maxShortConnections: 1000 };
  const response = await stream({ url, offset, live, json: true, sseResilience });
  say({ items: [], offset: response.offset, ready: true });
  response.subscribeJson(async (batch) => {
    say({ items: batch.items, offset: batch.offset, upToDate: batch.upToDate });
  });
  await response.closed;
  say({ error: "the stream closed" });
  process.exit(1);
} catch (error) {
  say({ error: String(error?.stack ?? error) });
  process.exit(1);
}
