// The @durable-streams/server reference server, in memory, on 127.0.0.1 and a free port.
// Prints "durable-streams server listening on port N: http://127.0.0.1:N/" to stderr once it
// is ready; exits on SIGTERM or SIGINT.
import { DurableStreamTestServer } from "@durable-streams/server"

// No dataDir: the in-memory store. Port 0: the system picks a free port.
const server = new DurableStreamTestServer({ host: "127.0.0.1", port: 0 })
const url = new URL(await server.start())
process.stderr.write(
  `durable-streams server listening on port ${url.port}: http://127.0.0.1:${url.port}/\n`
)

function shutdown() {
  // Live SSE readers hold their connections; don't wait long for them.
  setTimeout(() => process.exit(0), 1000).unref()
  server.stop().then(
    () => process.exit(0),
    () => process.exit(0)
  )
}
process.on("SIGTERM", shutdown)
process.on("SIGINT", shutdown)
