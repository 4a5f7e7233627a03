// token-relay-client/react: one hook, useRelayChannel(client, channel).
//
// It holds the channel while the component is mounted (subscribing it if nothing else
// does), and re-renders with the channel's state as frames arrive, through
// useSyncExternalStore: every render sees one consistent, immutable state. Under
// StrictMode's mount, unmount and mount again, the channel stays subscribed: a release is
// carried out a moment later, and only if nothing holds the channel again by then, so no
// text is lost or doubled. Each message carries its `parts` (reasoning, tool calls, text,
// sources, data): live while it streams, exact once it ends.

import { useCallback, useEffect, useSyncExternalStore } from "react";

const IDLE = Object.freeze({
  channel: "",
  status: "idle",
  error: null,
  gap: false,
  messages: Object.freeze([]),
});

export function useRelayChannel(client, channel) {
  useEffect(() => {
    if (!client || !channel) return undefined;
    return client.retain(channel);
  }, [client, channel]);
  const subscribe = useCallback(
    (onChange) => (client && channel ? client.watch(channel, onChange) : () => {}),
    [client, channel],
  );
  const read = useCallback(
    () => (client && channel ? client.getChannel(channel) : IDLE),
    [client, channel],
  );
  return useSyncExternalStore(subscribe, read, read);
}
