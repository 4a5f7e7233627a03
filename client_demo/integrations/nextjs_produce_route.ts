// app/api/chat/route.ts: the chat endpoint useChat posts to. The model's reply goes to the
// relay in one call, as the AI SDK streams it, and the page reads it from the relay. A Stop
// pressed on any page (POST /ai-sdk/CHAT/stop) answers that call at once: abort the model.
import { convertToModelMessages, streamText, type UIMessage } from "ai";
import { MockLanguageModelV4, simulateReadableStream } from "ai/test";

const RELAY = process.env.RELAY_URL ?? "http://127.0.0.1:8765";

export async function POST(request: Request): Promise<Response> {
  const { id: chatId, messages } = (await request.json()) as { id: string; messages: UIMessage[] };
  const replyId = crypto.randomUUID();
  const channel = encodeURIComponent(chatId);
  const stop = new AbortController();
  const result = streamText({
    model,
    messages: await convertToModelMessages(messages),
    abortSignal: stop.signal,
  });
  void fetch(`${RELAY}/ai-sdk/${channel}/produce?id=${replyId}`, {
    method: "POST",
    body: result.toUIMessageStreamResponse().body,
    duplex: "half",
  } as RequestInit).then(async (relayed) => {
    const answer = (await relayed.json()) as { stopped: boolean };
    if (answer.stopped) stop.abort();
  });
  const relay = await fetch(`${RELAY}/ai-sdk/${channel}/stream?wait=10&id=${replyId}`);
  return new Response(relay.body, { status: relay.status, headers: relay.headers });
}

// Stands in for your model (openai("gpt-5.1"), anthropic("claude-sonnet-4-5")...): a reply
// of 40 words, one every 100 ms. Like a provider, it is handed the abort signal, and it logs
// when the route aborts it.
const model = new MockLanguageModelV4({
  doStream: async ({ abortSignal }) => {
    abortSignal?.addEventListener("abort", () => console.log("model: aborted"));
    return {
      stream: simulateReadableStream({
        chunkDelayInMs: 100,
        chunks: [
          { type: "text-start", id: "t" },
          ...Array.from({ length: 40 }, (_, n) => ({ type: "text-delta" as const, id: "t", delta: `word${n} ` })),
          { type: "text-end", id: "t" },
          {
            type: "finish",
            finishReason: { unified: "stop", raw: "stop" },
            usage: {
              inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
              outputTokens: { total: 40, text: 40, reasoning: 0 },
            },
          },
        ],
      }),
    };
  },
});
