// Follows a Durable Stream live with the official client, for as long as it runs, printing
// each batch as one JSON line as it comes: {"items": [...], "offset": "..."} (the offset to
// read on from after it); if the client gives up, {"error": "..."} and exit code 1.
// Usage: node follow_channel.mjs URL OFFSET LIVE   (LIVE: sse or long-poll)
import { stream } from "@durable-streams/client";

const [url, offset, live] = process.argv.slice(2);
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");
try {
  const response = await stream({ url, offset, live, json: true });
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
