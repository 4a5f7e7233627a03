"""The Lua scripts of the Redis broker: each change to Redis is one of them, so it is atomic.

Keys per channel ``C`` are described in :mod:`token_relay.brokers.redis`; ``tr:own:C``
maps each id in progress on ``C`` to the one owner (producer session) that holds it, and
``tr:held:C`` each id whose message ended there within ``--id-hold`` to ``UNTIL|OWNER``
(``UNTIL`` in milliseconds of Redis's clock): until then another owner may not open it.
"""

EVICT_TRIES = 10
"""Channels ``TERMINAL`` looks at, at most, to drop the least recently used past
``--max-history-channels`` (see ``_CHANNELS``)."""

_HELD = """
local function held_by_another(channel, id, owner)
  local held = redis.call('HGET', 'tr:held:' .. channel, id)
  if not held then
    return false
  end
  local sep = string.find(held, '|', 1, true)
  local now = redis.call('TIME')
  if tonumber(string.sub(held, 1, sep - 1)) <= now[1] * 1000 + math.floor(now[2] / 1000) then
    return false
  end
  return string.sub(held, sep + 1) ~= owner
end
"""
"""A Lua function: whether another owner's message under the id ended on the channel within
the hold (the value's ``UNTIL`` is still ahead of Redis's clock)."""

OPEN = (
    _HELD
    + """
if redis.call('EXISTS', 'tr:gone:' .. ARGV[5]) == 1 then
  return 0
end
local holder = redis.call('HGET', KEYS[5], ARGV[2])
if (holder and holder ~= ARGV[5])
    or (not holder and held_by_another(ARGV[7], ARGV[2], ARGV[5])) then
  redis.call('SET', 'tr:refused:' .. ARGV[8], '1', 'EX', ARGV[3])
  return 0
end
redis.call('HSET', 'tr:msg:' .. ARGV[5], ARGV[2], ARGV[6] .. '|' .. ARGV[7])
redis.call('EXPIRE', 'tr:msg:' .. ARGV[5], ARGV[4])
redis.call('HSET', KEYS[5], ARGV[2], ARGV[5])
redis.call('EXPIRE', KEYS[5], ARGV[4])
redis.call('SADD', KEYS[2], ARGV[8])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('SET', KEYS[3], ARGV[1], 'EX', ARGV[3])
if ARGV[1] == '' then
  return 1
end
local seq = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
local head = 'd|' .. seq .. '|' .. string.len(ARGV[2]) .. '|'
redis.call('PUBLISH', KEYS[4], head .. ARGV[2] .. ARGV[1])
return seq
"""
)
"""Claim the id in the channel for this owner (0 if another owner holds it, in progress or
within its hold, or the owner's
session moved to another process; a refused claim is noted in ``tr:refused:OWNER|ID`` for as
long as a message's text lives, so that nothing of the message is published later), note
the message and its seq in the owner's session, and list it as in progress with the text of
the deltas that joined the open in the queue (published as one delta), if any. Its arguments
are those of DELTA, and its member."""

DELTA = (
    _HELD
    + """
if redis.call('EXISTS', 'tr:gone:' .. ARGV[5]) == 1 then
  return 0
end
local holder = redis.call('HGET', KEYS[5], ARGV[2])
if holder ~= ARGV[5] and (holder or (ARGV[8] == '1'
    and redis.call('EXISTS', 'tr:refused:' .. ARGV[5] .. '|' .. ARGV[2]) == 1)
    or held_by_another(ARGV[7], ARGV[2], ARGV[5])) then
  return 0
end
if ARGV[6] ~= '0' then
  redis.call('HSET', 'tr:msg:' .. ARGV[5], ARGV[2], ARGV[6] .. '|' .. ARGV[7])
end
redis.call('APPEND', KEYS[3], ARGV[1])
redis.call('EXPIRE', KEYS[3], ARGV[3])
local seq = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
local head = 'd|' .. seq .. '|' .. string.len(ARGV[2]) .. '|'
redis.call('PUBLISH', KEYS[4], head .. ARGV[2] .. ARGV[1])
return seq
"""
)
"""Append a delta to the text in Redis, note its seq, and publish it, unless another owner
holds the id (in progress or within its hold), the owner's session moved, or (``claimed``,
ARGV[8]: the message opened before) its claim was refused."""

_GUARD_END = DELTA.index("if ARGV[6] ~= '0' then")
PART = (
    DELTA[:_GUARD_END]
    + """if ARGV[6] ~= '0' then
  redis.call('HSET', 'tr:msg:' .. ARGV[5], ARGV[2], ARGV[6] .. '|' .. ARGV[7])
end
if ARGV[11] ~= '' then
  local seq = redis.call('INCR', KEYS[1])
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  redis.call('PUBLISH', KEYS[4], 'p|' .. seq .. '|' .. ARGV[11])
end
local head = redis.call('GETRANGE', KEYS[3], 0, 1)
if string.byte(head, 1) ~= 255 then
  if ARGV[9] == '' then
    return 1
  end
  local before = redis.call('GET', KEYS[3]) or ''
  local entries = ARGV[1]
  if ARGV[9] == 'x' then
    entries = ''
  end
  redis.call('SET', KEYS[3], '\\255' .. ARGV[9] .. string.len(before) .. ':' .. before .. entries,
    'EX', ARGV[3])
  return 1
end
if string.sub(head, 2, 2) ~= 'x' then
  if ARGV[9] == 'x' or redis.call('STRLEN', KEYS[3]) + string.len(ARGV[1]) > tonumber(ARGV[10]) then
    redis.call('SETRANGE', KEYS[3], 1, 'x')
  else
    redis.call('APPEND', KEYS[3], ARGV[1])
  end
end
redis.call('EXPIRE', KEYS[3], ARGV[3])
return 1
"""
)
"""Add entries to a structured message's log in Redis (see :mod:`.partlog`), note its seq,
and publish its ``chunks`` frame (ARGV[11], unless empty) to its deltas subscribers, in the
channel's event order. ``convert`` (ARGV[9], ``1``
or ``0``: whether its text so far is its implicit text part) marks the message structured
first: its text becomes the log's head (an entry for a message not structured in Redis, its
text lost or expired, is dropped). A log that would pass ``max_bytes`` (ARGV[10]) is cut
(its flag becomes ``x``) and grows no more; so is one whose earlier entries may have been
lost (``convert`` ``x``: a write of it failed). Refused as DELTA is."""

PROGRESS = """
if redis.call('EXISTS', 'tr:gone:' .. ARGV[1]) == 1 then
  return 0
end
if redis.call('HEXISTS', 'tr:msg:' .. ARGV[1], ARGV[2]) == 1 then
  redis.call('HSET', 'tr:msg:' .. ARGV[1], ARGV[2], ARGV[3] .. '|' .. ARGV[4])
end
return 1
"""
"""Note the seq of an event that carried no text."""

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

_CHANNELS = (
    """
local function keep_channel(channel, most, ttl)
  local now = redis.call('TIME')
  local at = string.format('%.0f', now[1] * 1000000 + now[2])
  redis.call('ZADD', 'tr:channels', at, channel)
  redis.call('EXPIRE', 'tr:channels', ttl)
  local extra = redis.call('ZCARD', 'tr:channels') - most
  local tries = 0
  while extra > 0 and tries < """
    + str(EVICT_TRIES)
    + """ do
    tries = tries + 1
    local name = redis.call('ZPOPMIN', 'tr:channels')[1]
    if redis.call('EXISTS', 'tr:live:' .. name) == 1
        or redis.call('PUBSUB', 'NUMSUB', 'tr:m:' .. name)[2] > 0 then
      redis.call('ZADD', 'tr:channels', at, name)
    else
      redis.call('DEL', 'tr:epoch:' .. name, 'tr:offset:' .. name, 'tr:seq:' .. name,
        'tr:history:' .. name, 'tr:held:' .. name, 'tr:published:' .. name)
      extra = extra - 1
    end
  end
end
"""
)
"""A Lua function: list the channel in ``tr:channels`` as used now, and while that lists
more than ``most`` channels, drop the least recently used one's epoch, offset, event number,
history and held ids (as the memory broker drops a channel's log past
``--max-history-channels``: it starts a new epoch when it comes back; its holds end early),
passing over, as used now, a channel that has a message in progress or a subscriber on some
process (its terminal topic has one): at most :data:`EVICT_TRIES` channels looked at per
call."""

TERMINAL = (
    _HELD
    + _CHANNELS
    + """
local owner = ARGV[9]
if redis.call('EXISTS', 'tr:gone:' .. owner) == 1 then
  return 0
end
if ARGV[11] == 'm' then
  -- The same frame, completed here already within the hold: the frame as published, nothing
  -- done again. This owner's (the reply to its script was lost, and the script was sent
  -- again), or, for a message that claimed nothing (strict 0: a whole message), anyone's
  -- while nobody has the id in progress (a whole message sent again by a new producer, a
  -- one-shot post retried after its answer was lost).
  local published = redis.call('HGET', 'tr:published:' .. ARGV[14], ARGV[8])
  if published and string.sub(published, -41) == '|' .. redis.sha1hex(ARGV[1]) then
    local bar = string.find(published, '|', 1, true)
    if string.sub(published, bar + 1, -42) == owner
        or (ARGV[13] == '0' and not redis.call('HGET', KEYS[8], ARGV[8])) then
      local at = redis.call('GET', KEYS[1]) or ARGV[2]
      return {string.sub(ARGV[1], 1, -2) .. ',"offset":' .. string.sub(published, 1, bar - 1)
        .. ',"epoch":"' .. at .. '"}', 0, 1}
    end
  end
end
local holder = redis.call('HGET', KEYS[8], ARGV[8])
if holder and holder ~= owner then
  return 0
end
if not holder and held_by_another(ARGV[14], ARGV[8], owner) then
  return 0
end
if holder ~= owner and (ARGV[13] == '1' or (ARGV[13] == '2'
    and redis.call('EXISTS', 'tr:refused:' .. owner .. '|' .. ARGV[8]) == 1)) then
  return 0
end
if holder then
  redis.call('HDEL', KEYS[8], ARGV[8])
end
if ARGV[12] ~= '0' then
  -- Remembered in the owner's session; an owner with none (max_done 0) keeps nothing.
  redis.call('HDEL', 'tr:msg:' .. owner, ARGV[8])
  local done = 'tr:done:' .. owner
  local order = 'tr:dl:' .. owner
  redis.call('HSET', done, ARGV[8], ARGV[11] .. '|' .. ARGV[10] .. '|' .. ARGV[14])
  local listed = redis.call('LPUSH', order, ARGV[8])
  local most = tonumber(ARGV[12])
  while listed > most do
    local old = redis.call('RPOP', order)
    if old ~= ARGV[8] then
      redis.call('HDEL', done, old)
    end
    listed = listed - 1
  end
  redis.call('EXPIRE', done, ARGV[7])
  redis.call('EXPIRE', order, ARGV[7])
end
local hold = tonumber(ARGV[19])
if hold > 0 then
  -- Held for its owner until the hold ends; one hash per channel, at most ARGV[20] ids
  -- (past it, the hash starts again: the oldest holds end early), gone once all ended.
  local held = 'tr:held:' .. ARGV[14]
  if redis.call('HLEN', held) >= tonumber(ARGV[20])
      and redis.call('HEXISTS', held, ARGV[8]) == 0 then
    -- tr:published:C (below) is written with it, so it holds no more ids: reset together.
    redis.call('DEL', held, 'tr:published:' .. ARGV[14])
  end
  local now = redis.call('TIME')
  local expiry = now[1] * 1000 + math.floor(now[2] / 1000) + hold
  redis.call('HSET', held, ARGV[8], string.format('%.0f', expiry) .. '|' .. owner)
  redis.call('PEXPIRE', held, hold)
end
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  -- The first terminal frame keeps the epoch a subscribe may have reserved, for good.
  epoch = redis.call('HGET', 'tr:reserved', ARGV[14]) or ARGV[2]
  redis.call('HDEL', 'tr:reserved', ARGV[14])
  redis.call('ZREM', 'tr:reserved:at', ARGV[14])
  redis.call('DEL', KEYS[2], KEYS[4])
end
redis.call('SET', KEYS[1], epoch, 'EX', ARGV[7])
keep_channel(ARGV[14], tonumber(ARGV[21]), ARGV[7])
local offset = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[7])
local seq = redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ARGV[7])
local frame = string.sub(ARGV[1], 1, -2) .. ',"offset":' .. offset .. ',"epoch":"' .. epoch .. '"}'
if hold > 0 then
  -- Where it was published, for the same owner's script sent again (above): written with
  -- the hold, reset and expiring with it, so bounded as the holds are.
  local published = 'tr:published:' .. ARGV[14]
  redis.call('HSET', published, ARGV[8], offset .. '|' .. owner .. '|' .. redis.sha1hex(ARGV[1]))
  redis.call('PEXPIRE', published, hold)
end
redis.call('XADD', KEYS[4], 'MAXLEN', ARGV[3], offset .. '-0', 't', ARGV[4], 'f', frame)
redis.call('EXPIRE', KEYS[4], ARGV[6])
redis.call('SREM', KEYS[5], ARGV[5])
redis.call('DEL', KEYS[6])
redis.call('PUBLISH', KEYS[7], 't|' .. seq .. '|' .. frame)
local queued = 0
if ARGV[15] == '1' then
  local size = string.len(frame) + string.len(ARGV[16])
  local held = tonumber(redis.call('GET', KEYS[10]) or '0')
  if redis.call('XLEN', KEYS[9]) < tonumber(ARGV[17]) and held + size <= tonumber(ARGV[18]) then
    redis.call('XADD', KEYS[9], '*', 'c', ARGV[14], 'f', frame, 'p', ARGV[16], 't', ARGV[4])
    redis.call('INCRBY', KEYS[10], size)
    queued = 1
  end
end
return {frame, queued}
"""
)
"""Give a terminal frame its offset, record and publish it, release the id's claim, hold
the id for its owner for ``hold`` milliseconds (ARGV[19]) in ``tr:held:C`` (and where it
was published, ``OFFSET|OWNER|SHA1`` of the frame, in ``tr:published:C``, as long), and
remember the id as completed (``m``) or aborted (``a``) in the owner's session, the last
``max_done`` of them (ARGV[12]; 0 for an owner with no session, a one-shot message, which
keeps nothing of it per owner); 0 if another owner holds the id (in progress or within its hold) or
the session moved; with ``strict``
1, also if nobody holds it (a reaper's abort happens once); with 2 (a message that opened),
also if its claim was refused (``tr:refused:``), even once the holder is done; 3 is a
message that opened in the same script (WHOLE: its open and deltas joined its final). With a
webhook wanted, queue the frame in the webhook outbox ``tr:wh`` in the same step, unless it
is full; returns the frame and whether it was queued. The same frame of a completed message
that the same owner's script published already within the hold (its reply was lost, and it
was sent again) is not published again: the frame as it was (its offset, the current
epoch), 0, and 1. So is a whole message's (``strict`` 0) that any owner published within
the hold, while nobody has the id in progress (a one-shot post retried after its answer was
lost)."""

_CLAIMED = TERMINAL.index("if holder ~= owner and (ARGV[13]")
WHOLE = (
    TERMINAL[:_CLAIMED]
    + """if ARGV[22] ~= '' then
  local seq = redis.call('INCR', KEYS[3])
  redis.call('EXPIRE', KEYS[3], ARGV[7])
  local head = 'd|' .. seq .. '|' .. string.len(ARGV[8]) .. '|'
  redis.call('PUBLISH', KEYS[11], head .. ARGV[8] .. ARGV[22])
end
"""
    + TERMINAL[_CLAIMED:]
)
"""A whole message in one step, when its final came before its open (and the deltas that
joined it) went to Redis: what OPEN and then TERMINAL do, without listing it as in progress
in between (nobody could have seen it there). Its keys and arguments are TERMINAL's, then
the channel's delta topic and the text of the joined deltas, published as one delta (if
any) before the terminal frame, as OPEN would have."""

WEBHOOK_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 2
end
return 0
"""
"""Keep (1) or take (2) the right to deliver the webhook outbox; 0 if another process has it."""

WEBHOOK_SETTLE = """
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if redis.call('XDEL', KEYS[1], ARGV[2]) == 1 then
  local left = redis.call('DECRBY', KEYS[2], ARGV[3])
  if left <= 0 or redis.call('XLEN', KEYS[1]) == 0 then
    redis.call('SET', KEYS[2], math.max(left, 0))
  end
end
return 1
"""
"""Remove a delivered (or dead) entry from the webhook outbox, and its bytes from the count."""

WEBHOOK_BURY = """
local size = string.len(ARGV[1])
local max_bytes = tonumber(ARGV[3])
local held = tonumber(redis.call('GET', KEYS[2]) or '-1')
if held < 0 then
  held = 0
  for _, item in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    held = held + string.len(item)
  end
end
if size > max_bytes then
  redis.call('SET', KEYS[2], held)
  return 1
end
redis.call('LPUSH', KEYS[1], ARGV[1])
held = held + size
local dropped = 0
while redis.call('LLEN', KEYS[1]) > tonumber(ARGV[2]) or held > max_bytes do
  held = held - string.len(redis.call('RPOP', KEYS[1]))
  dropped = dropped + 1
end
redis.call('SET', KEYS[2], held)
return dropped
"""
"""Keep a dead letter, the newest first, at most ``max_dead`` of them and ``max_bytes`` in
all (their total kept in ``KEYS[2]``, counted from the list if it is missing); a letter alone
over ``max_bytes`` is not kept. Returns how many were dropped."""

WEBHOOK_ADD = """
local size = string.len(ARGV[2]) + string.len(ARGV[3])
local held = tonumber(redis.call('GET', KEYS[2]) or '0')
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[6]) or held + size > tonumber(ARGV[7]) then
  return 0
end
redis.call('XADD', KEYS[1], '*', 'c', ARGV[1], 'f', ARGV[2], 'p', ARGV[3], 't', ARGV[4],
  'u', ARGV[5])
redis.call('INCRBY', KEYS[2], size)
if redis.call('LREM', KEYS[3], 1, ARGV[8]) == 1 and redis.call('EXISTS', KEYS[4]) == 1 then
  local left = redis.call('DECRBY', KEYS[4], string.len(ARGV[8]))
  if left < 0 or redis.call('LLEN', KEYS[3]) == 0 then
    redis.call('SET', KEYS[4], math.max(left, 0))
  end
end
return 1
"""
"""Queue a revived dead letter again (for its one URL) and take it off the dead list, unless
the outbox is full."""

TAKE = """
local session = KEYS[1]
local old = redis.call('HGET', session, 'owner')
if not old or redis.call('HGET', session, 'grant') ~= ARGV[3] then
  return false
end
local new = ARGV[1]
local old_instance = redis.call('HGET', session, 'instance')
local messages = redis.call('HGETALL', 'tr:msg:' .. old)
local out = {}
for i = 1, #messages, 2 do
  local id = messages[i]
  local value = messages[i + 1]
  local channel = string.sub(value, string.find(value, '|', 1, true) + 1)
  local old_text = 'tr:text:' .. old .. '|' .. id
  local text = redis.call('GET', old_text)
  if text then
    redis.call('RENAME', old_text, 'tr:text:' .. new .. '|' .. id)
  else
    text = ''
    redis.call('SET', 'tr:text:' .. new .. '|' .. id, '', 'EX', ARGV[4])
  end
  redis.call('SREM', 'tr:live:' .. channel, old .. '|' .. id)
  redis.call('SADD', 'tr:live:' .. channel, new .. '|' .. id)
  if redis.call('HGET', 'tr:own:' .. channel, id) == old then
    redis.call('HSET', 'tr:own:' .. channel, id, new)
  end
  table.insert(out, id)
  table.insert(out, value)
  table.insert(out, text)
end
for _, kind in ipairs({'msg', 'done', 'dl'}) do
  if redis.call('EXISTS', 'tr:' .. kind .. ':' .. old) == 1 then
    redis.call('RENAME', 'tr:' .. kind .. ':' .. old, 'tr:' .. kind .. ':' .. new)
  end
end
redis.call('SET', 'tr:gone:' .. old, new, 'EX', ARGV[5])
redis.call('HSET', session, 'owner', new, 'instance', ARGV[2])
if old_instance then
  redis.call('SREM', 'tr:sessions:' .. old_instance, ARGV[6])
end
redis.call('SADD', 'tr:sessions:' .. ARGV[2], ARGV[6])
-- The owner in an entry's second field (UNTIL|OWNER in tr:held:C, OFFSET|OWNER|SHA1 in
-- tr:published:C) becomes the new one, if it was the old.
local function move(key, id)
  local entry = redis.call('HGET', key, id)
  if entry then
    local bar = string.find(entry, '|', 1, true)
    local tail = string.find(entry, '|', bar + 1, true) or #entry + 1
    if string.sub(entry, bar + 1, tail - 1) == old then
      redis.call('HSET', key, id, string.sub(entry, 1, bar) .. new .. string.sub(entry, tail))
    end
  end
end
local done = redis.call('HGETALL', 'tr:done:' .. new)
for i = 1, #done, 2 do
  -- An id the session ended is still held for it, under its new owner.
  local value = done[i + 1]
  local sep = string.find(value, '|', string.find(value, '|', 1, true) + 1, true)
  local channel = string.sub(value, sep + 1)
  move('tr:held:' .. channel, done[i])
  move('tr:published:' .. channel, done[i])
end
return {old, old_instance or '', out, done}
"""
"""Move a producer session to a new owner on this process: its messages in progress (with
their texts and claims) and its completed ids (with their holds); fence the old owner off,
so that none of its late writes lands. False if there is no such session, or the grant differs."""

CATCH_UP = """
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  -- Nobody published here: only reserve the epoch, in the one bounded map of reservations
  -- (tr:reserved, oldest first in tr:reserved:at), for a while. The first terminal frame
  -- keeps it for good.
  -- Microseconds, later than every reservation before: the order is the order of subscribes.
  local now, ttl = tonumber(ARGV[9]), tonumber(ARGV[6]) * 1000000
  local last = redis.call('ZRANGE', 'tr:reserved:at', -1, -1, 'WITHSCORES')[2]
  if last and tonumber(last) >= now then
    now = tonumber(last) + 1
  end
  epoch = redis.call('HGET', 'tr:reserved', ARGV[8])
  if not epoch then
    epoch = ARGV[2]
    redis.call('HSET', 'tr:reserved', ARGV[8], epoch)
    redis.call('DEL', KEYS[2], KEYS[4])
  end
  -- (as strings: Redis would write a number this big with 14 digits)
  redis.call('ZADD', 'tr:reserved:at', string.format('%.0f', now), ARGV[8])
  local oldest = string.format('%.0f', now - ttl)
  local stale = redis.call('ZRANGEBYSCORE', 'tr:reserved:at', '-inf', oldest)
  local over = redis.call('ZCARD', 'tr:reserved:at') - #stale - tonumber(ARGV[10])
  if over > 0 then
    stale = redis.call('ZRANGE', 'tr:reserved:at', 0, #stale + over - 1)
  end
  for _, old in ipairs(stale) do
    redis.call('HDEL', 'tr:reserved', old)
    redis.call('ZREM', 'tr:reserved:at', old)
  end
  redis.call('EXPIRE', 'tr:reserved', ARGV[6])
  redis.call('EXPIRE', 'tr:reserved:at', ARGV[6])
end
local offset = tonumber(redis.call('GET', KEYS[2]) or '0')
local seq = tonumber(redis.call('GET', KEYS[3]) or '0')
local since = tonumber(ARGV[1])
local entries = {}
if since >= 0 and since < offset then
  entries = redis.call('XRANGE', KEYS[4], (since + 1) .. '-0', '+')
elseif since < 0 and tonumber(ARGV[7]) > 0 then
  entries = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', ARGV[7])
end
local live = {}
if ARGV[3] == '1' then
  for _, member in ipairs(redis.call('SMEMBERS', KEYS[5])) do
    local text = redis.call('GET', ARGV[5] .. member)
    if text then
      -- A structured message's log (it starts with byte 255) goes too: it is compacted.
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
"""A joiner's consistent cut: epoch, offset, event number, missed history, texts (and
structured messages' logs) in progress, dropping, with their claims, those whose text
expired."""

META = """
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
return 1
"""
"""A message's merged metadata in ``tr:meta:OWNER`` (set, or forgotten with '')."""

REGISTER = """
local n = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], n, ARGV[1])
redis.call('SADD', KEYS[3], ARGV[2])
return n
"""
"""Register owner ``ARGV[1]`` in ``tr:q:C`` (``KEYS[1]``) under the next number of
``tr:qseq`` (``KEYS[2]``), and channel ``ARGV[2]`` in the process's ``tr:qc:INSTANCE``
(``KEYS[3]``)."""

SCRIPTS = {
    "register": REGISTER,
    "meta": META,
    "open": OPEN,
    "delta": DELTA,
    "part": PART,
    "resync": RESYNC,
    "terminal": TERMINAL,
    "whole": WHOLE,
    "catch_up": CATCH_UP,
    "progress": PROGRESS,
    "take": TAKE,
    "webhook_lease": WEBHOOK_LEASE,
    "webhook_settle": WEBHOOK_SETTLE,
    "webhook_bury": WEBHOOK_BURY,
    "webhook_add": WEBHOOK_ADD,
}
