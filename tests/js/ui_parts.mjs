// Assemble UI message parts with the AI SDK itself, as a chat app reading a stream would.
// Reads from stdin a JSON list of cases {"name", "chunks": [...]}; wraps each case's chunks in
// {"type":"start","messageId":...} ... {"type":"finish",...}, frames them as the SSE body of a UI
// message stream, and reads that body as DefaultChatTransport does (parseJsonEventStream with
// uiMessageChunkSchema: a chunk the schema refuses fails the stream) and then
// readUIMessageStream. Prints one JSON line per case, in order:
//   {"name", "parts": [...]}                       the final message.parts
//   {"name", "parts": [...], "error": "..."}       the package refused a chunk; parts as the
//                                                  last message before the refusal had them
// Usage: node ui_parts.mjs < cases.json
// The AI SDK at its current major ("ai"), or the package AI_PACKAGE names ("ai-v6": the one
// before).
const { parseJsonEventStream, readUIMessageStream, uiMessageChunkSchema } = await import(
  process.env.AI_PACKAGE ?? "ai"
);

async function readStdin() {
  let text = "";
  process.stdin.setEncoding("utf8");
  for await (const piece of process.stdin) text += piece;
  return text;
}

function sseBody(chunks) {
  const framed = chunks.map((chunk) => `data: ${JSON.stringify(chunk)}\n\n`).join("");
  const bytes = new TextEncoder().encode(`${framed}data: [DONE]\n\n`);
  return new ReadableStream({
    start(controller) {
      controller.enqueue(bytes);
      controller.close();
    },
  });
}

async function assemble(testCase, index) {
  const chunks = [
    { type: "start", messageId: `m-${index}` },
    ...testCase.chunks,
    // A finish with metadata makes the reader yield the message once more: it yields after
    // the chunks that write, and start-step does not, so a reply ending in a step's start
    // would otherwise be read without it. The metadata is not a part.
    { type: "finish", messageMetadata: {} },
  ];
  const validated = parseJsonEventStream({ stream: sseBody(chunks), schema: uiMessageChunkSchema });
  const stream = validated.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        if (!chunk.success) throw chunk.error;
        controller.enqueue(chunk.value);
      },
    }),
  );
  let parts = [];
  let error = null;
  try {
    for await (const message of readUIMessageStream({ stream, terminateOnError: true })) {
      parts = message.parts;
    }
  } catch (failure) {
    // The first line names the refusal; the schema's full report follows it.
    error = String(failure?.message ?? failure).split("\n")[0];
  }
  // JSON drops the keys the package left undefined, as the wire would.
  const line = { name: testCase.name, parts: JSON.parse(JSON.stringify(parts)) };
  if (error !== null) line.error = error;
  return line;
}

const cases = JSON.parse(await readStdin());
for (const [index, testCase] of cases.entries()) {
  process.stdout.write(`${JSON.stringify(await assemble(testCase, index))}\n`);
}
