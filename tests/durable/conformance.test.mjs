// The Durable Streams conformance suite against the server at CONFORMANCE_TEST_URL.
// CONFORMANCE_LONG_POLL_MS is the server's long-poll timeout, in milliseconds: the suite
// waits that long (and a second more) for a long-poll that times out.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_TEST_URL
if (!baseUrl) throw new Error("CONFORMANCE_TEST_URL is required")
runConformanceTests({
  baseUrl,
  longPollTimeoutMs: Number(process.env.CONFORMANCE_LONG_POLL_MS ?? "1000"),
  subscriptions: process.env.CONFORMANCE_SUBSCRIPTIONS === "1",
})
