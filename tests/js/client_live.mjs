// The browser client token-relay-client (clients/js) in Node, over real WebSockets to a relay:
// each client follows one channel and prints, on every change of a message, one JSON line
// {"client", "id", "status", "text", "parts"}.
// Usage: node --experimental-websocket client_live.mjs URL CHANNEL
// Each line on stdin names a client to start ("a", "b", ...): it joins the channel then, so
// it gets what a page opened at that moment gets. "close" closes them all and exits.
import { createInterface } from "node:readline";

import { RelayClient } from "../../clients/js/src/index.js";

const [url, channel] = process.argv.slice(2);
const clients = [];

function start(name) {
  const client = new RelayClient(url, { channels: [channel], transport: "websocket", rewind: 0 });
  const shown = new Map(); // id -> the message object last printed
  client.watch(channel, (state) => {
    for (const message of state.messages) {
      if (shown.get(message.id) === message) continue;
      shown.set(message.id, message);
      const { id, status, text, parts } = message;
      process.stdout.write(`${JSON.stringify({ client: name, id, status, text, parts })}\n`);
    }
  });
  client.on("status", (status) => {
    if (status === "open") process.stdout.write(`${JSON.stringify({ client: name, open: true })}\n`);
  });
  clients.push(client);
}

for await (const line of createInterface({ input: process.stdin })) {
  if (line === "close") break;
  if (line) start(line);
}
for (const client of clients) client.close();
process.exit(0);
