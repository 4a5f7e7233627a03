// Read an SSE stream with the `eventsource` npm package, which reconnects with Last-Event-ID
// after a cut, and print every message and aborted frame it saw, as JSON lines.
// Usage: node eventsource_read.mjs URL COUNT
import { EventSource } from "eventsource";

const [url, count] = process.argv.slice(2);
const source = new EventSource(url);
let seen = 0;
let opened = 0;
source.addEventListener("open", () => {
  opened += 1;
  console.log(JSON.stringify({ opened }));
});
for (const kind of ["message", "aborted"]) {
  source.addEventListener(kind, (event) => {
    console.log(JSON.stringify({ frame: JSON.parse(event.data), lastEventId: event.lastEventId }));
    seen += 1;
    if (seen >= Number(count)) {
      source.close();
      process.exit(0);
    }
  });
}
