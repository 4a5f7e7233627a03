// Read a chat's replies from the relay as UIMessages and check them with the AI SDK's own
// validateUIMessages, as an app does before useChat({ messages }); print them as JSON.
// Usage: node ui_history.mjs BASE_URL CHAT_ID [QUERY]
// The AI SDK at its current major ("ai"), or the package AI_PACKAGE names ("ai-v6").
const { validateUIMessages } = await import(process.env.AI_PACKAGE ?? "ai");

const [base, chatId, query = ""] = process.argv.slice(2);
const response = await fetch(`${base}/ai-sdk/${encodeURIComponent(chatId)}/messages${query}`);
const body = await response.json();
// validateUIMessages refuses an empty list: a new chat has no messages to check.
const messages = body.length ? await validateUIMessages({ messages: body }) : [];
console.log(JSON.stringify({ status: response.status, messages }));
