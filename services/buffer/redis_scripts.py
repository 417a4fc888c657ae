"""Lua scripts of the Redis store. Each runs atomically inside Redis, so a buffer process killed at any
point leaves every group in exactly one state: unread, leased, queued for redelivery, or acked.

Layout (P = stream prefix, G = consumer group):
  P:stream          the stream; one entry per group: g=group_id n=count v=min version vc="v:c,.."
  P:data            hash: stream entry id -> payload (the group's GetBatchResponse bytes). Kept out of the
                    stream so that LEASE's peek and XREADGROUP move a few small fields, not payloads
                    (each payload a script reads is copied into Lua); only the leased ones are read, by
                    one HMGET. An entry an older version wrote with its payload in a `d` field is read there
  P:meta            hash: size (live experiences), accepted, rejected
  P:versions        hash: model_version -> live experiences
  P:producers       hash: producer_id -> last stored sequence (idempotent puts)
  P:accepted        list: uid of every accepted experience, in order (the accepted log of lineage audits)
  P:g:G:leases      hash: lease_id -> "deadline\\nn\\nepoch\\nconsumer\\nid n vc\\n..." (deadline 0: no expiry)
  P:g:G:deadlines   zset: lease_id scored by deadline (ms, Redis clock); fenced leases are not in it
  P:g:G:epochs      hash: consumer -> epoch (fencing token handed out by OPEN)
  P:g:G:expired     zset: lease ids that expired, scored by when (kept 24 h), so Ack/Nack says "expired"
  P:g:G:taken       zset: lease ids now held, scored by when they were taken (ms; Stats' oldest lease age)
  P:g:G:requeue     list: "id n vc" of groups to redeliver (nacked, expired, or orphaned)
  P:g:G:stats       hash: acked, dropped_stale, redelivered, pending_n
  P:g:G:acked:L     string with expiry: lease L was acked (n), so a retried Ack is answered again
Entries stay in the stream until every consumer group has acked or dropped them (then XDEL and HDEL), so the
approximate MAXLEN = capacity on XADD never trims a live entry: live entries <= live experiences <=
capacity.
"""

from __future__ import annotations

# KEYS of group scripts: stream, meta, versions, leases, deadlines, requeue, gstats, epochs, expired, data,
# taken.
# ARGV[1] = group.
COMMON = r"""
local stream, meta, versions = KEYS[1], KEYS[2], KEYS[3]
local leases, deadlines, requeue, gstats, epochs = KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local expired, data, taken = KEYS[9], KEYS[10], KEYS[11]
local group = ARGV[1]
-- how long an expired lease id is remembered (ms; the Redis store's ACKED_KEPT_MS)
local EXPIRED_KEPT_MS = 86400000

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function parse_item(s)
  local id, cnt, vc = string.match(s, '^(%S+) (%d+) (%S+)$')
  return {id, tonumber(cnt), vc}
end

-- deadline, n, items, epoch, consumer
local function parse_lease(rec)
  local lines = {}
  for line in string.gmatch(rec, '[^\n]+') do lines[#lines + 1] = line end
  local items = {}
  for i = 5, #lines do items[#items + 1] = parse_item(lines[i]) end
  return tonumber(lines[1]), tonumber(lines[2]), items, tonumber(lines[3]), lines[4]
end

-- (code, current epoch): code 0 when `epoch` is current for `consumer` (or unfenced), else -3 (older:
-- stale, fenced), -4 (the consumer was never opened), -5 (newer than the current one: never handed out)
local function check_epoch(consumer, epoch)
  if epoch == 0 then return 0, 0 end
  local current = tonumber(redis.call('HGET', epochs, consumer) or '0')
  if current == 0 then return -4, 0 end
  if epoch < current then return -3, current end
  if epoch > current then return -5, current end
  return 0, current
end

local function item_text(it) return it[1] .. ' ' .. it[2] .. ' ' .. it[3] end

local function min_version(vc) return tonumber(string.match(vc, '^(-?%d+):')) end

local function expire(now)
  local due = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now)
  for _, lid in ipairs(due) do
    local rec = redis.call('HGET', leases, lid)
    if rec then
      local _, n, items = parse_lease(rec)
      for _, it in ipairs(items) do redis.call('RPUSH', requeue, item_text(it)) end
      redis.call('HINCRBY', gstats, 'pending_n', -n)
      redis.call('HDEL', leases, lid)
      redis.call('ZREM', taken, lid)
      redis.call('ZADD', expired, now, lid)
    end
    redis.call('ZREM', deadlines, lid)
  end
  if #due > 0 then redis.call('ZREMRANGEBYSCORE', expired, '-inf', now - EXPIRED_KEPT_MS) end
end

local function id_lt(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end

local function group_info()
  local out = {}
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', stream)
  if not ok then return out end
  for _, g in ipairs(groups) do
    local info = {}
    for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
    out[#out + 1] = {name = info['name'], last = info['last-delivered-id']}
  end
  return out
end

-- `group` has XACKed these items; delete each once no other consumer group still needs it.
local function finish(items, ginfo)
  local done, size, by_version = {}, 0, {}
  for _, it in ipairs(items) do
    local needed = false
    for _, g in ipairs(ginfo) do
      if g.name ~= group then
        if id_lt(g.last, it[1]) or #redis.call('XPENDING', stream, g.name, it[1], it[1], 1) > 0 then
          needed = true
          break
        end
      end
    end
    if not needed then
      done[#done + 1] = it[1]
      size = size + it[2]
      for v, c in string.gmatch(it[3], '(-?%d+):(%d+)') do by_version[v] = (by_version[v] or 0) + tonumber(c) end
    end
  end
  if #done == 0 then return end
  redis.call('XDEL', stream, unpack(done))
  redis.call('HDEL', data, unpack(done))
  redis.call('HINCRBY', meta, 'size', -size)
  for v, c in pairs(by_version) do
    if redis.call('HINCRBY', versions, v, -c) <= 0 then redis.call('HDEL', versions, v) end
  end
end

local function ack_items(items)
  if #items == 0 then return end
  local ids = {}
  for i, it in ipairs(items) do ids[i] = it[1] end
  redis.call('XACK', stream, group, unpack(ids))
  finish(items, group_info())
end
"""

# KEYS: stream, meta, versions, producers, accepted, data. ARGV: capacity, total, producer, sequence, then
# (group_id, n, min_version, versions_text, payload, uids joined by newlines) per group.
PUT = r"""
local stream, meta, versions, producers, accepted = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local data = KEYS[6]
local cap, total = tonumber(ARGV[1]), tonumber(ARGV[2])
local producer, seq = ARGV[3], tonumber(ARGV[4])
if producer ~= '' and seq > 0 then
  local last = tonumber(redis.call('HGET', producers, producer) or '0')
  if last >= seq then return {0, 0} end
end
local size = tonumber(redis.call('HGET', meta, 'size') or '0')
if size + total > cap then return {-1, size} end
for i = 5, #ARGV, 6 do
  local id = redis.call('XADD', stream, 'MAXLEN', '~', cap, '*',
    'g', ARGV[i], 'n', ARGV[i + 1], 'v', ARGV[i + 2], 'vc', ARGV[i + 3])
  redis.call('HSET', data, id, ARGV[i + 4])
  for v, c in string.gmatch(ARGV[i + 3], '(-?%d+):(%d+)') do redis.call('HINCRBY', versions, v, c) end
  local uids = {}
  for uid in string.gmatch(ARGV[i + 5], '[^\n]+') do uids[#uids + 1] = uid end
  if #uids > 0 then redis.call('RPUSH', accepted, unpack(uids)) end
end
if producer ~= '' and seq > 0 then redis.call('HSET', producers, producer, seq) end
redis.call('HINCRBY', meta, 'size', total)
redis.call('HINCRBY', meta, 'accepted', total)
return {1, size + total}
"""

# ARGV: group, consumer, lease_id, size, min_version, lease_ms, allow_partial (0/1), epoch.
# Returns {1, deadline, n, dropped, redelivered, payload...}, {0, available, dropped}, or {code, current epoch}
# with a `check_epoch` code (-3 stale, -4 never opened, -5 never handed out). A lease with an epoch has
# deadline 0: it never expires.
LEASE = (
    COMMON
    + r"""
local consumer, lease_id = ARGV[2], ARGV[3]
local size, minv, lease_ms = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local allow_partial = ARGV[7] == '1'
local epoch = tonumber(ARGV[8])
local fenced, current_epoch = check_epoch(consumer, epoch)
if fenced ~= 0 then return {fenced, current_epoch} end
local now = now_ms()
expire(now)
local total, full = 0, false
local take_rq, stale, rq_scanned = {}, {}, 0
for i, s in ipairs(redis.call('LRANGE', requeue, 0, -1)) do
  local it = parse_item(s)
  if min_version(it[3]) < minv then
    stale[#stale + 1] = it
  else
    if total > 0 and total + it[2] > size then full = true break end
    take_rq[#take_rq + 1] = it
    total = total + it[2]
  end
  rq_scanned = i
  if total >= size then full = true break end
end
local new_count, ginfo = 0, group_info()
if not full then
  local last = '0-0'
  for _, g in ipairs(ginfo) do if g.name == group then last = g.last end end
  local cursor, guess = '(' .. last, 2
  while not full do
    -- Peek only about as many entries as the batch still needs.
    local entries = redis.call('XRANGE', stream, cursor, '+', 'COUNT', math.min(64, math.max(2, guess)))
    if #entries == 0 then break end
    for _, e in ipairs(entries) do
      local f = e[2]
      local cnt = tonumber(f[4])
      cursor = '(' .. e[1]
      if tonumber(f[6]) >= minv then
        if total > 0 and total + cnt > size then full = true break end
        total = total + cnt
      end
      new_count = new_count + 1
      if total >= size then full = true break end
      guess = math.ceil((size - total) / cnt) + 1
    end
  end
end
if total < size and not allow_partial then return {0, total, 0} end
if rq_scanned > 0 then redis.call('LTRIM', requeue, rq_scanned, -1) end
local items, redelivered = {}, 0
if #take_rq > 0 then
  local ids = {}
  for i, it in ipairs(take_rq) do ids[i] = it[1] end
  redis.call('XCLAIM', stream, group, consumer, 0, unpack(ids))
  for _, it in ipairs(take_rq) do
    items[#items + 1] = it
    redelivered = redelivered + it[2]
  end
end
if new_count > 0 then
  local res = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', new_count, 'STREAMS', stream, '>')
  for _, e in ipairs(res[1][2]) do
    local f = e[2]
    local it = {e[1], tonumber(f[4]), f[8]}
    if tonumber(f[6]) < minv then
      stale[#stale + 1] = it
    else
      items[#items + 1] = it
    end
  end
end
local dropped = 0
for _, it in ipairs(stale) do dropped = dropped + it[2] end
if #stale > 0 then
  ack_items(stale)
  redis.call('HINCRBY', gstats, 'dropped_stale', dropped)
end
if #items == 0 then return {0, 0, dropped} end
local deadline = now + lease_ms
if epoch > 0 then deadline = 0 end
local lines = {deadline, total, epoch, consumer}
for _, it in ipairs(items) do lines[#lines + 1] = item_text(it) end
redis.call('HSET', leases, lease_id, table.concat(lines, '\n'))
redis.call('ZADD', taken, now, lease_id)
if deadline > 0 then redis.call('ZADD', deadlines, deadline, lease_id) end
redis.call('HINCRBY', gstats, 'pending_n', total)
if redelivered > 0 then redis.call('HINCRBY', gstats, 'redelivered', redelivered) end
local out = {1, deadline, total, dropped, redelivered}
local ids = {}
for i, it in ipairs(items) do ids[i] = it[1] end
local found = redis.call('HMGET', data, unpack(ids))
for i = 1, #ids do
  local payload = found[i]
  if not payload then  -- written by an older version, with the payload in the entry's `d` field
    local e = redis.call('XRANGE', stream, ids[i], ids[i])
    payload = e[1] and e[1][2][10] or ''
  end
  out[#out + 1] = payload
end
return out
"""
)

# KEYS: the group keys + P:g:G:acked:<lease_id>. ARGV: group, lease_id, mode ('ack' | 'nack'), kept_ms,
# epoch, consumer ('' = not said). Returns {1, n}, {-1} unknown (or settled), {-2} expired, {-3, current} /
# {-5, current} (the consumer's epoch is newer / older than `epoch`), {-6, lease epoch} (the lease was taken
# with another epoch). Acking an acked lease again answers {1, n} for `kept_ms`, so a trainer may retry
# an Ack whose reply was lost.
SETTLE = (
    COMMON
    + r"""
local lease_id, mode = ARGV[2], ARGV[3]
local epoch, consumer = tonumber(ARGV[5]), ARGV[6]
local acked_key = KEYS[12]
local now = now_ms()
if consumer ~= '' then
  local code, current = check_epoch(consumer, epoch)
  if code == -3 or code == -5 then return {code, current} end
end
local rec = redis.call('HGET', leases, lease_id)
if not rec then
  local done = redis.call('GET', acked_key)
  if done and mode == 'ack' then return {1, tonumber(done)} end
  if redis.call('ZSCORE', expired, lease_id) then return {-2} end
  return {-1}
end
local deadline, n, items, lease_epoch = parse_lease(rec)
if epoch ~= lease_epoch then return {-6, lease_epoch} end
if deadline > 0 and deadline <= now then
  expire(now)
  return {-2}
end
redis.call('HDEL', leases, lease_id)
redis.call('ZREM', deadlines, lease_id)
redis.call('ZREM', taken, lease_id)
redis.call('HINCRBY', gstats, 'pending_n', -n)
if mode == 'ack' then
  ack_items(items)
  redis.call('HINCRBY', gstats, 'acked', n)
  redis.call('SET', acked_key, n, 'PX', tonumber(ARGV[4]))
else
  for i = #items, 1, -1 do redis.call('LPUSH', requeue, item_text(items[i])) end
end
return {1, n}
"""
)

# ARGV: group. Expires due leases, then returns {meta, versions, gstats, lease count, oldest lease age ms}.
STATS = (
    COMMON
    + r"""
local now = now_ms()
expire(now)
local oldest = 0
while true do
  local first = redis.call('ZRANGE', taken, 0, 0, 'WITHSCORES')
  if #first == 0 then break end
  if redis.call('HEXISTS', leases, first[1]) == 1 then
    oldest = now - tonumber(first[2])
    break
  end
  redis.call('ZREM', taken, first[1])  -- a lease settled by an older version of these scripts
end
return {redis.call('HGETALL', meta), redis.call('HGETALL', versions), redis.call('HGETALL', gstats),
        redis.call('HLEN', leases), oldest}
"""
)

# ARGV: group. Recovery after a restart: expire due leases, then XAUTOCLAIM every pending entry of the
# group and queue for redelivery those that belong to no lease and are not queued (a consumer that read
# them died before leasing them). Returns the number of orphaned experiences queued.
RECOVER = (
    COMMON
    + r"""
expire(now_ms())
local known = {}
for _, rec in ipairs(redis.call('HVALS', leases)) do
  local _, _, items = parse_lease(rec)
  for _, it in ipairs(items) do known[it[1]] = true end
end
for _, s in ipairs(redis.call('LRANGE', requeue, 0, -1)) do known[parse_item(s)[1]] = true end
local start, orphaned = '0-0', 0
repeat
  local res = redis.call('XAUTOCLAIM', stream, group, 'rft-recovery', 0, start, 'COUNT', 256)
  start = res[1]
  for _, e in ipairs(res[2]) do
    if not known[e[1]] then
      local f = e[2]
      redis.call('RPUSH', requeue, e[1] .. ' ' .. f[4] .. ' ' .. f[8])
      orphaned = orphaned + tonumber(f[4])
    end
  end
until start == '0-0'
return orphaned
"""
)

# KEYS: the group keys. ARGV: group, consumer, n_ack, the lease ids to ack, then the lease ids to keep.
# Bumps the consumer's epoch (fencing every older holder of the name), acks the named leases that the
# consumer holds, moves the kept ones to the new epoch, and queues every other lease of the consumer
# at the front of the redelivery queue in stream order. Returns {epoch, acked, released}.
OPEN = (
    COMMON
    + r"""
local consumer = ARGV[2]
expire(now_ms())
local epoch = redis.call('HINCRBY', epochs, consumer, 1)
local to_ack, to_keep = {}, {}
local n_ack = tonumber(ARGV[3])
for i = 4, 3 + n_ack do to_ack[ARGV[i]] = true end
for i = 4 + n_ack, #ARGV do to_keep[ARGV[i]] = true end
local acked, released, back = 0, 0, {}
local flat = redis.call('HGETALL', leases)
for i = 1, #flat, 2 do
  local lid = flat[i]
  local deadline, n, items, _, owner = parse_lease(flat[i + 1])
  if owner == consumer and to_keep[lid] then
    local lines = {deadline, n, epoch, consumer}
    for _, it in ipairs(items) do lines[#lines + 1] = item_text(it) end
    redis.call('HSET', leases, lid, table.concat(lines, '\n'))
  elseif owner == consumer then
    redis.call('HDEL', leases, lid)
    redis.call('ZREM', deadlines, lid)
    redis.call('ZREM', taken, lid)
    redis.call('HINCRBY', gstats, 'pending_n', -n)
    if to_ack[lid] then
      ack_items(items)
      redis.call('HINCRBY', gstats, 'acked', n)
      acked = acked + n
    else
      for _, it in ipairs(items) do back[#back + 1] = it end
      released = released + n
    end
  end
end
table.sort(back, function(a, b) return id_lt(a[1], b[1]) end)
for i = #back, 1, -1 do redis.call('LPUSH', requeue, item_text(back[i])) end
return {epoch, acked, released}
"""
)
