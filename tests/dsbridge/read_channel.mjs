// Reads a Durable Stream with the official client until it has at least COUNT items (with
// LIVE false: what there is, up to the tail), then prints {"items": [...], "offset": "..."}: every item of the batches read, and the offset
// after the last batch. Usage: node read_channel.mjs URL OFFSET LIVE COUNT [TOKEN]
import { stream } from "@durable-streams/client";

const [url, offset, live, count, token] = process.argv.slice(2);
const wanted = Number(count);
const controller = new AbortController();
const response = await stream({
  url,
  offset,
  live: live === "false" ? false : live,
  json: true,
  signal: controller.signal,
  headers: token ? { Authorization: `Bearer ${token}` } : undefined,
});
const items = [];
let last = response.offset;
if (live === "false") {
  // Catch-up only: every item up to the tail (its offset once read).
  items.push(...(await response.json()));
  last = response.offset;
} else {
  await new Promise((resolve, reject) => {
    const unsubscribe = response.subscribeJson(async (batch) => {
      items.push(...batch.items);
      last = batch.offset;
      if (items.length >= wanted) {
        unsubscribe();
        resolve();
      }
    });
    response.closed.catch(reject);
  });
}
controller.abort();
process.stdout.write(JSON.stringify({ items, offset: last }) + "\n");
process.exit(0);
