// The route of the app's server when the page runs against the FastAPI gateway (the
// chat-app tutorial's recipe 2): each POST /api/chat goes on to the FastAPI app at
// FASTAPI_URL, and its answer streams back as it comes, as a reverse proxy in front of the
// app would pass it; a page that goes away aborts the call.
export async function POST(request) {
  return fetch(`${process.env.FASTAPI_URL}/api/chat`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: await request.text(),
    signal: request.signal,
  });
}
