-- wrk: every request appends the same text (APPEND_TEXT) to the stream wrk was given.
-- At the end, one JSON line on stderr: the requests completed, the errors, the wall time.
wrk.method = "POST"
wrk.headers["Content-Type"] = "text/plain; charset=utf-8"
wrk.body = os.getenv("APPEND_TEXT") or "x"

function done(summary, latency, requests)
  local e = summary.errors
  io.stderr:write(string.format(
    '{"requests": %d, "non2xx": %d, "connect": %d, "read": %d, "write": %d, ' ..
    '"timeout": %d, "micros": %d}\n',
    summary.requests, e.status, e.connect, e.read, e.write, e.timeout, summary.duration))
end
