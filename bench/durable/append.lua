-- wrk: with APPEND_TEXT set, every request appends that text to the stream wrk was given;
-- with it empty, every request is a plain GET of the URL.
-- At the end, one JSON line on stderr: the requests completed, the errors, the wall time.
local text = os.getenv("APPEND_TEXT") or ""
if text ~= "" then
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "text/plain; charset=utf-8"
  wrk.body = text
end

function done(summary, latency, requests)
  local e = summary.errors
  io.stderr:write(string.format(
    '{"requests": %d, "non2xx": %d, "connect": %d, "read": %d, "write": %d, ' ..
    '"timeout": %d, "micros": %d}\n',
    summary.requests, e.status, e.connect, e.read, e.write, e.timeout, summary.duration))
end
