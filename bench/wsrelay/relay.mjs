// A minimal relay on Node's ws package, the WebSocket benchmark's peer: as much of the
// relay's protocol as the ingest and fan-out cases use. Producers of /produce?channel=C
// send {"id", "delta"?, "final"?} events, one per frame; each message's deltas are joined
// (the seed's rules: empty deltas count, a repeated final returns the same text), and at
// each final the message frame is serialized once for all the channel's subscribers, then
// the producer gets its ack. Subscribers of /subscribe?channel=C[&deltas=1] get subscribed
// (again for a subscribe frame) and, with deltas, each delta. Usage: node relay.mjs PORT.
import { WebSocketServer } from "ws"

const MAX_STREAMING = 10_000 // unfinished messages per producer; past it, close 1008
const MAX_COMPLETED = 10_000 // finished ids remembered per producer, oldest dropped first
const MAX_BUFFERED = 16 * 1024 * 1024 // bytes queued to one subscriber; past it, drop it
const channels = new Map() // name -> {offset, plain: Set, deltas: Set}
const server = new WebSocketServer({ host: "127.0.0.1", port: Number(process.argv[2] ?? 0),
  maxPayload: 1024 * 1024, perMessageDeflate: false, backlog: 4096 })

function channelOf(name) {
  let channel = channels.get(name)
  if (!channel) channels.set(name, (channel = { offset: 0, plain: new Set(), deltas: new Set() }))
  return channel
}

function broadcast(sockets, frame) {
  const bytes = Buffer.from(JSON.stringify(frame)) // once, for every subscriber
  for (const socket of sockets) {
    if (socket.bufferedAmount > MAX_BUFFERED) socket.terminate()
    else socket.send(bytes, { binary: false })
  }
}

function subscribe(socket, channel, name, deltas) {
  channel.plain.add(socket)
  if (deltas) channel.deltas.add(socket)
  else channel.deltas.delete(socket)
  socket.send(JSON.stringify({ type: "subscribed", channel: name, offset: channel.offset }))
}

server.on("connection", (socket, request) => {
  const url = new URL(request.url, "http://relay")
  const name = url.searchParams.get("channel") ?? ""
  const channel = channelOf(name)
  if (url.pathname === "/subscribe") {
    subscribe(socket, channel, name, url.searchParams.get("deltas") === "1")
    socket.on("message", (data) => {
      const frame = JSON.parse(data.toString())
      if (frame.type === "subscribe") subscribe(socket, channel, name, Boolean(frame.deltas))
    })
    socket.on("close", () => {
      channel.plain.delete(socket)
      channel.deltas.delete(socket)
    })
    return
  }
  const streaming = new Map() // id -> parts
  const completed = new Map() // id -> text
  socket.on("message", (data) => {
    const { id, delta, final } = JSON.parse(data.toString())
    let text = completed.get(id)
    if (text === undefined) {
      let parts = streaming.get(id)
      if (!parts) {
        if (streaming.size >= MAX_STREAMING) return socket.close(1008, "too many messages")
        streaming.set(id, (parts = []))
      }
      if (typeof delta === "string") {
        parts.push(delta)
        if (channel.deltas.size) broadcast(channel.deltas, { type: "delta", channel: name, id, delta })
      }
      if (!final) return
      text = parts.join("")
      streaming.delete(id)
      if (completed.size >= MAX_COMPLETED) completed.delete(completed.keys().next().value)
      completed.set(id, text)
      channel.offset += 1
      broadcast(channel.plain, { type: "message", channel: name, id, text, offset: channel.offset })
    } else if (!final) return
    socket.send(JSON.stringify({ type: "ack", id, channel: name }))
  })
})

server.on("listening", () => {
  const { port } = server.address()
  process.stderr.write(`Node ws relay listening on port ${port}: ws://127.0.0.1:${port}/\n`)
})
for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => process.exit(0))
