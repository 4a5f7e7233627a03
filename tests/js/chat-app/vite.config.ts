import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

// The relay's URL is built in, as Next.js builds in a NEXT_PUBLIC_ variable.
export default defineConfig({
  plugins: [react()],
  define: {
    "process.env.NEXT_PUBLIC_RELAY_URL": JSON.stringify(process.env.NEXT_PUBLIC_RELAY_URL),
  },
});
