// Send a reply to the relay's AI SDK producer route, POST /ai-sdk/CHAT/produce, as an app's
// chat route would: a UI message stream built with the AI SDK's own createUIMessageStream,
// turned into a Response by createUIMessageStreamResponse, whose body is the request's body.
// Usage: node ai_sdk_produce.mjs RELAY_URL CHAT_ID MODE
//   reply  a whole reply (reasoning, a tool call whose input streams, its output, text, a
//          data part); prints {status, answer, id, parts, metadata}: the relay's answer, and
//          what readUIMessageStream builds from the very same chunks
//   slow   the reply's first chunks, then {"event":"sent"} on stdout; the rest once a line
//          comes on stdin; then prints {status, answer}
//   stop   the reply's first chunks, then {"event":"sent"}; holds the body open until the
//          relay answers (a Stop), prints {status, answer, bodyEndedAtAnswer}, then ends it
// The AI SDK at its current major ("ai"), or the package AI_PACKAGE names.
import readline from "node:readline";

const { createUIMessageStream, createUIMessageStreamResponse, readUIMessageStream } = await import(
  process.env.AI_PACKAGE ?? "ai"
);

const [relay, chatId, mode] = process.argv.slice(2);
const url = `${relay}/ai-sdk/${encodeURIComponent(chatId)}/produce`;

const head = [
  { type: "start", messageId: `${mode}-1`, messageMetadata: { model: "m-1" } },
  { type: "start-step" },
  { type: "reasoning-start", id: "r1" },
  { type: "reasoning-delta", id: "r1", delta: "The user wants " },
];
const tail = [
  { type: "reasoning-delta", id: "r1", delta: "the weather." },
  { type: "reasoning-end", id: "r1" },
  { type: "tool-input-start", toolCallId: "call-1", toolName: "weather" },
  { type: "tool-input-delta", toolCallId: "call-1", inputTextDelta: '{"city":' },
  { type: "tool-input-delta", toolCallId: "call-1", inputTextDelta: '"Paris"}' },
  { type: "tool-input-available", toolCallId: "call-1", toolName: "weather", input: { city: "Paris" } },
  { type: "tool-output-available", toolCallId: "call-1", output: { celsius: 21 } },
  { type: "finish-step" },
  { type: "start-step" },
  { type: "text-start", id: "t1" },
  { type: "text-delta", id: "t1", delta: "It is 21 °C " },
  { type: "text-delta", id: "t1", delta: "in Paris 🌤." },
  { type: "text-end", id: "t1" },
  { type: "data-weather", id: "w1", data: { city: "Paris", celsius: 21 } },
  { type: "finish-step" },
  { type: "finish", finishReason: "stop", messageMetadata: { usage: { outputTokens: 9 } } },
];

function say(line) {
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
let answered;
const answer = new Promise((resolve) => {
  answered = resolve;
});

const stream = createUIMessageStream({
  async execute({ writer }) {
    for (const chunk of head) writer.write(chunk);
    if (mode === "slow" || mode === "stop") {
      // Let the chunks so far go out before saying so.
      await new Promise((resolve) => setTimeout(resolve, 0));
      say({ event: "sent" });
    }
    if (mode === "slow") await lines.next();
    if (mode === "stop") {
      await answer; // the body stays open until the relay has answered
      return;
    }
    for (const chunk of tail) writer.write(chunk);
  },
});
const [toRelay, toReader] = stream.tee();

let bodyEnded = false;
const body = createUIMessageStreamResponse({ stream: toRelay }).body.pipeThrough(
  new TransformStream({
    flush() {
      bodyEnded = true;
    },
  }),
);
const reading = (async () => {
  let last = null;
  for await (const message of readUIMessageStream({ stream: toReader })) last = message;
  return last;
})();

const response = await fetch(url, { method: "POST", body, duplex: "half" });
const bodyEndedAtAnswer = bodyEnded;
const result = { status: response.status, answer: await response.json() };
answered();
if (mode === "stop") result.bodyEndedAtAnswer = bodyEndedAtAnswer;
const message = await reading;
if (mode === "reply") {
  // JSON drops the keys the package left undefined, as the wire would.
  Object.assign(result, JSON.parse(JSON.stringify({
    id: message.id, parts: message.parts, metadata: message.metadata,
  })));
}
say(result);
process.exit(0);
