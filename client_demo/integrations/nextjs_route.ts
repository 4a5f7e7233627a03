// app/api/chat/route.ts: the chat endpoint useChat posts to. It starts the model, whose
// reply goes to the relay as it is generated, and answers with the relay's stream of it.
const RELAY = process.env.RELAY_URL ?? "http://127.0.0.1:8765";

export async function POST(request: Request): Promise<Response> {
  const { id: chatId, messages } = (await request.json()) as { id: string; messages: unknown[] };
  const replyId = crypto.randomUUID();
  void generate(chatId, replyId, messages);
  const channel = encodeURIComponent(chatId);
  const relay = await fetch(`${RELAY}/ai-sdk/${channel}/stream?wait=10&id=${replyId}`);
  return new Response(relay.body, { status: relay.status, headers: relay.headers });
}

// Each token is one POST of a named producer: a serverless function can stop and start.
async function generate(chatId: string, replyId: string, messages: unknown[]): Promise<void> {
  const url = `${RELAY}/produce?channel=${encodeURIComponent(chatId)}&producer=${replyId}`;
  const post = (event: object) =>
    fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(event) });
  let seq = 0;
  for await (const delta of model(messages)) {
    await post({ id: replyId, delta, seq: ++seq });
  }
  await post({ id: replyId, final: true, seq: ++seq });
}

// Stands in for your model client.
async function* model(messages: unknown[]): AsyncGenerator<string> {
  for (const token of ["Hello", " from", " the", " relay", ` (${messages.length} messages)`]) {
    yield token;
  }
}
