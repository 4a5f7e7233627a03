// Renders the chat page (./chat.tsx: the tutorial's page, which the test copies in) as
// app/chat/[id]/page.tsx does, with the chat's id (here from ?chat=), in StrictMode as
// Next.js does in development.
import { StrictMode } from "react";
import { createRoot } from "react-dom/client";
import ChatPage from "./chat";

const chatId = new URLSearchParams(window.location.search).get("chat") ?? "chat";
createRoot(document.getElementById("root")!).render(
  <StrictMode>
    <ChatPage chatId={chatId} />
  </StrictMode>,
);
