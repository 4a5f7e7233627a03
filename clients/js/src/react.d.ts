// Type declarations of token-relay-client/react.

import type { ChannelSnapshot, RelayClient } from "./index.js";

export type {
  ChannelSnapshot,
  ChannelStatus,
  DynamicToolUIPart,
  ReasoningUIPart,
  RelayMessage,
  TextUIPart,
  ToolUIPart,
  UIPart,
} from "./index.js";

/**
 * The state of one channel, `{ messages, status, error, gap, channel }`, re-rendered as its
 * frames arrive; each message has its `text` and its `parts` (live, then exact). The channel is subscribed while the component is mounted. With no client
 * or channel yet, the state is empty and "idle".
 */
export declare function useRelayChannel(
  client: RelayClient | null | undefined,
  channel: string | null | undefined,
): ChannelSnapshot;
