-- wrk: every request is the relay's POST /produce of one completed message, as JSON
-- ({"id", "delta", "final": true}), a new id each time (PRODUCE_PREFIX, then a counter).
-- An answer that is not 200 with one ack and no errors counts as unacked.
-- At the end, one JSON line on stderr: the requests completed, the errors, the wall time.
local text = os.getenv("APPEND_TEXT") or ""
local prefix = os.getenv("PRODUCE_PREFIX") or "w"
local headers = { ["Content-Type"] = "application/json" }
local threads = {}
local sent = 0
unacked = 0

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function request()
  sent = sent + 1
  local body = string.format(
    '{"id":"%s-%d-%d","delta":"%s","final":true}', prefix, id, sent, text)
  return wrk.format("POST", nil, headers, body)
end

function response(status, headers, body)
  if status ~= 200 or not body:find('"acks":[{"type":"ack"', 1, true)
      or body:find('},{', 1, true) or not body:find('"errors":[]', 1, true) then
    unacked = unacked + 1
  end
end

function done(summary, latency, requests)
  local e, bad = summary.errors, 0
  for _, thread in ipairs(threads) do bad = bad + thread:get("unacked") end
  io.stderr:write(string.format(
    '{"requests": %d, "non2xx": %d, "connect": %d, "read": %d, "write": %d, ' ..
    '"timeout": %d, "unacked": %d, "micros": %d}\n',
    summary.requests, e.status, e.connect, e.read, e.write, e.timeout, bad, summary.duration))
end
