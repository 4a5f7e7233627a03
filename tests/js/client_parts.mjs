// Assemble parts with the browser client token-relay-client (clients/js), as a page would.
// Reads from stdin a JSON list of cases, each one of:
//   {"name", "steps": [...]}   UI message chunks, or {"delta": "..."} steps (a relay delta
//                              frame), fed to the client's MessageParts
//   {"name", "frames": [...], "id": "..."}
//                              relay frames of one channel, fed to the client's ChannelState;
//                              the case's result is message `id` as the state holds it
// Prints one JSON line per case, in order: {"name", "parts", "text"} for steps;
// {"name", "seen": [{"parts", "text", "status", "outcome"}, ...], "frozen"} for frames, one
// entry per frame (message `id` after it), and whether its last parts were frozen.
// Usage: node client_parts.mjs < cases.json
import { ChannelState, MessageParts } from "../../clients/js/src/index.js";

async function readStdin() {
  let text = "";
  process.stdin.setEncoding("utf8");
  for await (const piece of process.stdin) text += piece;
  return text;
}

function viaParts(steps) {
  const parts = new MessageParts();
  for (const step of steps) {
    if (Object.keys(step).length === 1 && typeof step.delta === "string") parts.delta(step.delta);
    else parts.apply(step);
  }
  return { parts: parts.parts(), text: parts.text() };
}

function viaState(frames, id) {
  const state = new ChannelState(frames[0]?.channel ?? "c");
  const seen = [];
  for (const frame of frames) {
    const outcome = state.apply(frame);
    const message = state.messages.get(id);
    seen.push(message ? { parts: message.parts, text: message.text, status: message.status, outcome } : { outcome });
  }
  const last = state.messages.get(id);
  const frozen = Object.isFrozen(last.parts) && last.parts.every((part) => Object.isFrozen(part));
  return { seen, frozen };
}

const cases = JSON.parse(await readStdin());
for (const testCase of cases) {
  const result = testCase.frames ? viaState(testCase.frames, testCase.id) : viaParts(testCase.steps);
  process.stdout.write(`${JSON.stringify({ name: testCase.name, ...result })}\n`);
}
