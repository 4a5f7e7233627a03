// The app's server in the test, standing in for Next.js: it serves the built page (dist/) and
// hands each POST /api/chat to the route module's POST as Next.js does, a Request in and its
// Response streamed out; a client that goes away aborts the request and cancels the response.
// It prints {"port": N} once it listens; the route's own logs follow on stdout.
// Usage: RELAY_URL=http://127.0.0.1:PORT node server.mjs ROUTE_MODULE.js DIST_FOLDER
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { extname, join, normalize } from "node:path";

const [routeModule, dist] = process.argv.slice(2);
const { POST } = await import(routeModule);
const TYPES = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css" };
const HOP_BY_HOP = new Set(["connection", "keep-alive", "transfer-encoding", "content-length"]);

async function route(request, response) {
  const chunks = [];
  for await (const chunk of request) chunks.push(chunk);
  const gone = new AbortController();
  response.on("close", () => gone.abort());
  const answer = await POST(
    new Request(`http://${request.headers.host}${request.url}`, {
      method: "POST",
      headers: { "content-type": request.headers["content-type"] ?? "application/json" },
      body: Buffer.concat(chunks),
      signal: gone.signal,
    }),
  );
  const headers = {};
  answer.headers.forEach((value, name) => {
    if (!HOP_BY_HOP.has(name)) headers[name] = value;
  });
  response.writeHead(answer.status, headers);
  if (answer.body) {
    const reader = answer.body.getReader();
    gone.signal.addEventListener("abort", () => reader.cancel().catch(() => {}));
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        response.write(value);
      }
    } catch {
      // the client went away: its stream was cancelled
    }
  }
  response.end();
}

async function page(request, response) {
  const path = new URL(request.url, "http://app").pathname;
  const file = extname(path) ? normalize(join(dist, path)) : join(dist, "index.html");
  if (!file.startsWith(normalize(dist))) return response.writeHead(404).end();
  try {
    const body = await readFile(file);
    response.writeHead(200, { "content-type": TYPES[extname(file)] ?? "application/octet-stream" });
    response.end(body);
  } catch {
    response.writeHead(404).end();
  }
}

const server = createServer((request, response) => {
  const handle = request.method === "POST" && request.url === "/api/chat" ? route : page;
  handle(request, response).catch((error) => {
    console.error(error);
    if (!response.headersSent) response.writeHead(500);
    response.end();
  });
});
server.listen(0, "127.0.0.1", () => console.log(JSON.stringify({ port: server.address().port })));
