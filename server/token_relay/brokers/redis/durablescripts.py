"""The Lua scripts of the durable streams kept in Redis: each change to a stream is one of
them, so it is atomic across every relay process.

Keys (the ``tr:ds:`` prefix, :mod:`token_relay.brokers.redis.durable` describes them):
``tr:ds:p:PATH`` the id of the stream at a path; ``tr:ds:s:ID`` a stream's fields (``v`` its
version, ``state`` its protocol state as JSON, ``touched``, ``forks``, ``deleted``, ``bytes``,
``path``, ``source``, ``n`` its entries, ``ttl`` and ``exp``); ``tr:ds:l:ID`` its entries by
index; ``tr:ds:a:ID`` each entry's index scored by its start position; ``tr:ds:count`` and
``tr:ds:bytes`` the streams and bytes of all; ``tr:ds:deadlines`` each stream's expiry time;
``tr:ds:held`` each stream's bytes and source (``BYTES|SOURCE``), which never expire: a
stream whose keys Redis expired before the sweep dropped it is still counted there, and the
sweep takes it off the counts (and its source's forks). Bytes are counted as in one process:
each entry its data and ``OVERHEAD`` (:data:`~token_relay.core.durable.ENTRY_OVERHEAD`, which
the writer passes). A change publishes on ``tr:ds:w:PATH``.

The scripts name most keys as they go (a stream's sources are found on the way), so they
need one Redis server (or a primary with its replicas), not a Redis Cluster.
"""

from __future__ import annotations

__all__ = ["COMMIT", "CREATE", "DROP", "GRACE", "LOOKUP", "READ", "TOUCH"]

GRACE = 60
"""Seconds past a stream's expiry before Redis itself forgets its keys: the relay's sweep,
which keeps the counts, drops it first."""

_COMMON = f"""
local GRACE = {GRACE}
local function deadline_of(meta)
  local ttl = redis.call('HGET', meta, 'ttl')
  if ttl and ttl ~= '' then
    return tonumber(redis.call('HGET', meta, 'touched')) + tonumber(ttl)
  end
  local exp = redis.call('HGET', meta, 'exp')
  if exp and exp ~= '' then
    return tonumber(exp)
  end
  return nil
end
local function schedule(id)
  local meta = 'tr:ds:s:' .. id
  local deadline = deadline_of(meta)
  local forks = tonumber(redis.call('HGET', meta, 'forks') or '0')
  local deleted = redis.call('HGET', meta, 'deleted') == '1'
  if deadline and not deleted then
    redis.call('ZADD', 'tr:ds:deadlines', deadline, id)
  else
    redis.call('ZREM', 'tr:ds:deadlines', id)
  end
  local keys = {{meta, 'tr:ds:l:' .. id, 'tr:ds:a:' .. id}}
  local path = redis.call('HGET', meta, 'path')
  if path and redis.call('GET', 'tr:ds:p:' .. path) == id then
    keys[#keys + 1] = 'tr:ds:p:' .. path
  end
  for _, key in ipairs(keys) do
    if deadline and forks == 0 and not deleted then
      redis.call('PEXPIREAT', key, math.floor((deadline + GRACE) * 1000))
    else
      redis.call('PERSIST', key)
    end
  end
end
local function remove(id)
  local meta = 'tr:ds:s:' .. id
  local path = redis.call('HGET', meta, 'path')
  if path and redis.call('GET', 'tr:ds:p:' .. path) == id then
    redis.call('DEL', 'tr:ds:p:' .. path)
  end
  local held = redis.call('HGET', 'tr:ds:held', id)
  if held then
    local sep = string.find(held, '|', 1, true)
    redis.call('DECR', 'tr:ds:count')
    redis.call('DECRBY', 'tr:ds:bytes', tonumber(string.sub(held, 1, sep - 1)))
    redis.call('HDEL', 'tr:ds:held', id)
  end
  redis.call('ZREM', 'tr:ds:deadlines', id)
  redis.call('DEL', meta, 'tr:ds:l:' .. id, 'tr:ds:a:' .. id)
end
local function hold(id, added, source)
  local held = redis.call('HGET', 'tr:ds:held', id)
  local size = 0
  if held then
    local sep = string.find(held, '|', 1, true)
    size = tonumber(string.sub(held, 1, sep - 1))
    source = string.sub(held, sep + 1)
  end
  redis.call('HSET', 'tr:ds:held', id, (size + added) .. '|' .. source)
end
local function release(source)
  while source and source ~= '' do
    local held = 'tr:ds:s:' .. source
    if redis.call('EXISTS', held) == 0 then
      break
    end
    local forks = redis.call('HINCRBY', held, 'forks', -1)
    if forks > 0 or redis.call('HGET', held, 'deleted') ~= '1' then
      schedule(source)
      break
    end
    local next_source = redis.call('HGET', held, 'source')
    remove(source)
    source = next_source
  end
end
local function totals()
  return {{tonumber(redis.call('GET', 'tr:ds:count') or '0'),
          tonumber(redis.call('GET', 'tr:ds:bytes') or '0'),
          redis.call('HLEN', 'tr:ds:subs')}}
end
local function log_entries(id, first, args, from, overhead)
  local n = first
  local added = 0
  for i = from, #args, 2 do
    redis.call('HSET', 'tr:ds:l:' .. id, n, args[i + 1])
    redis.call('ZADD', 'tr:ds:a:' .. id, args[i], n)
    added = added + string.len(args[i + 1]) + overhead
    n = n + 1
  end
  return n, added
end
"""

LOOKUP = """
local id = redis.call('GET', KEYS[1])
local out = {}
while id do
  local meta = redis.call('HGETALL', 'tr:ds:s:' .. id)
  if #meta == 0 then
    break
  end
  out[#out + 1] = id
  out[#out + 1] = meta
  id = redis.call('HGET', 'tr:ds:s:' .. id, 'source')
  if id == '' then
    id = nil
  end
end
return out
"""
"""The stream at a path (``KEYS[1]``, its path key) and its sources, as one consistent cut:
``ID, FIELDS`` for each, the stream first."""

READ = """
local found = redis.call('ZREVRANGEBYSCORE', KEYS[2], ARGV[1], '-inf', 'LIMIT', 0, 1)
if #found == 0 then
  found = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #found == 0 then
    return {}
  end
end
local first = tonumber(found[1])
local budget = tonumber(ARGV[2])
local size = 0
local out = {}
while size < budget do
  local rows = redis.call('ZRANGE', KEYS[2], first, first + 63, 'WITHSCORES')
  if #rows == 0 then
    break
  end
  for k = 1, #rows, 2 do
    local entry = redis.call('HGET', KEYS[1], rows[k])
    out[#out + 1] = rows[k + 1]
    out[#out + 1] = entry
    size = size + string.len(entry)
    if size >= budget then
      break
    end
  end
  first = first + 64
end
return out
"""
"""A stream's entries (``KEYS[1]`` its log, ``KEYS[2]`` its starts) from the one holding
position ``ARGV[1]`` on, about ``ARGV[2]`` bytes of them: ``START, ENTRY`` for each."""

CREATE = (
    _COMMON
    + """
local path, id, source = ARGV[1], ARGV[2], ARGV[5]
local meta = 'tr:ds:s:' .. id
local other = redis.call('GET', 'tr:ds:p:' .. path)
if other and redis.call('EXISTS', 'tr:ds:s:' .. other) == 1 then
  return 'exists'
end
if source ~= '' and (redis.call('EXISTS', 'tr:ds:s:' .. source) == 0
    or redis.call('HGET', 'tr:ds:s:' .. source, 'deleted') == '1') then
  return 'source_gone'
end
local held = totals()
if held[1] >= tonumber(ARGV[7]) then
  return 'too_many'
end
if held[2] + tonumber(ARGV[6]) > tonumber(ARGV[8]) then
  return 'full'
end
redis.call('SET', 'tr:ds:p:' .. path, id)
local n, added = log_entries(id, 0, ARGV, 12, tonumber(ARGV[11]))
redis.call('HSET', meta, 'v', 1, 'state', ARGV[3], 'touched', ARGV[4], 'forks', 0,
  'deleted', 0, 'bytes', added, 'path', path, 'source', source, 'n', n,
  'ttl', ARGV[9], 'exp', ARGV[10])
redis.call('INCR', 'tr:ds:count')
redis.call('INCRBY', 'tr:ds:bytes', added)
hold(id, added, source)
if source ~= '' then
  redis.call('HINCRBY', 'tr:ds:s:' .. source, 'forks', 1)
  schedule(source)
end
schedule(id)
redis.call('PUBLISH', 'tr:ds:w:' .. path, 'c')
return totals()
"""
)
"""Make a stream at a path: ``PATH, ID, STATE, TOUCHED, SOURCE, BYTES, MAX_STREAMS,
MAX_BYTES, TTL, EXPIRES_AT, OVERHEAD``, then ``START, ENTRY`` pairs (``BYTES`` what they
count: each entry's data and ``OVERHEAD``). ``exists`` (another stream took the path),
``source_gone``, ``too_many`` or ``full`` refuse it and change nothing; else the totals."""

COMMIT = (
    _COMMON
    + """
local id = ARGV[1]
local meta = 'tr:ds:s:' .. id
if redis.call('HGET', meta, 'v') ~= ARGV[2] or redis.call('HGET', meta, 'deleted') ~= '0' then
  return 'conflict'
end
local overhead = tonumber(ARGV[7])
local size = 0
for i = 8, #ARGV, 2 do
  size = size + string.len(ARGV[i + 1]) + overhead
end
if size > 0 and totals()[2] + size > tonumber(ARGV[5]) then
  return 'full'
end
local n, added = log_entries(id, tonumber(redis.call('HGET', meta, 'n')), ARGV, 8, overhead)
redis.call('HSET', meta, 'state', ARGV[3], 'n', n)
redis.call('HINCRBY', meta, 'v', 1)
redis.call('HINCRBY', meta, 'bytes', added)
redis.call('INCRBY', 'tr:ds:bytes', added)
hold(id, added, '')
if tonumber(ARGV[4]) > tonumber(redis.call('HGET', meta, 'touched')) then
  redis.call('HSET', meta, 'touched', ARGV[4])
end
schedule(id)
if ARGV[6] == '1' then
  redis.call('PUBLISH', 'tr:ds:w:' .. redis.call('HGET', meta, 'path'), 'a')
end
return totals()
"""
)
"""Write a stream's new state if it is still at the version it was read at: ``ID, VERSION,
STATE, TOUCHED, MAX_BYTES, CHANGED, OVERHEAD``, then the new ``START, ENTRY`` pairs (each
counts its data and ``OVERHEAD``). ``conflict`` (another write came first: read again) or
``full`` change nothing; else the totals."""

TOUCH = (
    _COMMON
    + """
local meta = 'tr:ds:s:' .. ARGV[1]
if redis.call('EXISTS', meta) == 1
    and tonumber(ARGV[2]) > tonumber(redis.call('HGET', meta, 'touched')) then
  redis.call('HSET', meta, 'touched', ARGV[2])
  schedule(ARGV[1])
end
return 1
"""
)
"""A read: the stream's sliding TTL starts again at ``ARGV[2]`` (``ID, NOW``)."""

DROP = (
    _COMMON
    + """
local id = ARGV[1]
local meta = 'tr:ds:s:' .. id
if redis.call('EXISTS', meta) == 0 then
  local held = redis.call('HGET', 'tr:ds:held', id)
  if held then  -- Redis expired its keys first: off the counts, and off its source's forks
    remove(id)
    release(string.sub(held, string.find(held, '|', 1, true) + 1))
  end
  redis.call('ZREM', 'tr:ds:deadlines', id)
  return false
end
if redis.call('HGET', meta, 'deleted') == '1' then
  return false
end
if ARGV[3] == '1' then
  local deadline = deadline_of(meta)
  if not deadline or deadline > tonumber(ARGV[2]) then
    return false
  end
end
local path = redis.call('HGET', meta, 'path')
redis.call('PUBLISH', 'tr:ds:w:' .. path, 'd')
if tonumber(redis.call('HGET', meta, 'forks')) > 0 then
  redis.call('HSET', meta, 'deleted', 1)
  redis.call('HINCRBY', meta, 'v', 1)
  schedule(id)
  return path
end
local source = redis.call('HGET', meta, 'source')
remove(id)
release(source)
return path
"""
)
"""Delete (``ID, NOW, 0``) or expire (``ID, NOW, 1``: only if it is past its deadline) a
stream: a tombstone while forks read it, else gone with its keys, and each source's
tombstone with it whose last fork it was. Its path, or false if nothing changed."""
