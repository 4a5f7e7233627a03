"""The Lua scripts of the Redis broker: each change to Redis is one of them, so it is atomic.

Keys per channel ``C`` are described in :mod:`token_relay.brokers.redis`; ``tr:own:C``
maps each id in progress on ``C`` to the one owner (producer session) that holds it.
"""

OPEN = """
local holder = redis.call('HGET', KEYS[3], ARGV[4])
if holder and holder ~= ARGV[5] then
  return 0
end
redis.call('HSET', KEYS[3], ARGV[4], ARGV[5])
redis.call('EXPIRE', KEYS[3], ARGV[3])
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], '', 'EX', ARGV[2])
return 1
"""
"""Claim the id in the channel for this owner (0 if another owner holds it), and list
the message as in progress with empty text."""

DELTA = """
local holder = redis.call('HGET', KEYS[5], ARGV[2])
if holder and holder ~= ARGV[5] then
  return 0
end
redis.call('APPEND', KEYS[3], ARGV[1])
redis.call('EXPIRE', KEYS[3], ARGV[3])
local seq = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
local head = 'd|' .. seq .. '|' .. string.len(ARGV[2]) .. '|'
redis.call('PUBLISH', KEYS[4], head .. ARGV[2] .. ARGV[1])
return seq
"""
"""Append a delta to the text in Redis and publish it, unless another owner holds the id."""

RESYNC = """
local holder = redis.call('HGET', KEYS[5], ARGV[6])
if holder and holder ~= ARGV[7] then
  return 0
end
redis.call('HSET', KEYS[5], ARGV[6], ARGV[7])
redis.call('EXPIRE', KEYS[5], ARGV[5])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[4])
local seq = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('PUBLISH', KEYS[4], 's|' .. seq .. '|' .. ARGV[3])
return seq
"""
"""Rewrite a message's whole text (after an outage) and publish it as a snapshot."""

TERMINAL = """
local holder = redis.call('HGET', KEYS[8], ARGV[8])
if holder and holder ~= ARGV[9] then
  return 0
end
if holder then
  redis.call('HDEL', KEYS[8], ARGV[8])
end
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = ARGV[2]
  redis.call('DEL', KEYS[2], KEYS[4])
end
redis.call('SET', KEYS[1], epoch, 'EX', ARGV[7])
local offset = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[7])
local seq = redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ARGV[7])
local frame = string.sub(ARGV[1], 1, -2) .. ',"offset":' .. offset .. ',"epoch":"' .. epoch .. '"}'
redis.call('XADD', KEYS[4], 'MAXLEN', ARGV[3], offset .. '-0', 't', ARGV[4], 'f', frame)
redis.call('EXPIRE', KEYS[4], ARGV[6])
redis.call('SREM', KEYS[5], ARGV[5])
redis.call('DEL', KEYS[6])
redis.call('PUBLISH', KEYS[7], 't|' .. seq .. '|' .. frame)
return frame
"""
"""Give a terminal frame its offset, record and publish it, and release the id's claim;
0 if another owner holds the id."""

CATCH_UP = """
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = ARGV[2]
  redis.call('SET', KEYS[1], epoch, 'EX', ARGV[4])
  redis.call('DEL', KEYS[2], KEYS[4])
end
local offset = tonumber(redis.call('GET', KEYS[2]) or '0')
local seq = tonumber(redis.call('GET', KEYS[3]) or '0')
local since = tonumber(ARGV[1])
local entries = {}
if since >= 0 and since < offset then
  entries = redis.call('XRANGE', KEYS[4], (since + 1) .. '-0', '+')
end
local live = {}
if ARGV[3] == '1' then
  for _, member in ipairs(redis.call('SMEMBERS', KEYS[5])) do
    local text = redis.call('GET', ARGV[5] .. member)
    if text then
      table.insert(live, member)
      table.insert(live, text)
    else
      redis.call('SREM', KEYS[5], member)
      local sep = string.find(member, '|', 1, true)
      local id = string.sub(member, sep + 1)
      if redis.call('HGET', KEYS[6], id) == string.sub(member, 1, sep - 1) then
        redis.call('HDEL', KEYS[6], id)
      end
    end
  end
end
return {epoch, offset, seq, entries, live}
"""
"""A joiner's consistent cut: epoch, offset, event number, missed history, texts in
progress (dropping, with their claims, those whose text expired)."""

SCRIPTS = {
    "open": OPEN,
    "delta": DELTA,
    "resync": RESYNC,
    "terminal": TERMINAL,
    "catch_up": CATCH_UP,
}
