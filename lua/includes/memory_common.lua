--[[
  Shared helpers of the conversation-memory scripts (inlined by the loader).

  Session keys of a member are derived from the partition prefix
  ("{<ns>:m:<p>}:"), so they hash to the same slot as the declared keys: the one
  documented exception to "scripts touch only KEYS" (see memtier/keys.py).
]]
local rcall = redis.call

-- Non-decreasing clock (ms) per partition: max(server TIME, high-water mark).
-- override ~= "" is the test-only clock hook (never reachable from configuration).
-- Returns clock_ms (for TTL arithmetic) and wall_ms (for people).
local function memtier_clock(meta_key, override, write)
  local wall
  if override ~= "" then
    wall = tonumber(override)
  else
    local t = rcall('TIME')
    wall = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local now = wall
  local hwm = tonumber(rcall('HGET', meta_key, 'clock') or '0')
  if now < hwm then
    now = hwm
  elseif write and now > hwm then
    rcall('HSET', meta_key, 'clock', now)
  end
  return now, wall
end

local function memtier_session_keys(prefix, member)
  return prefix .. 's:' .. member, prefix .. 't:' .. member, prefix .. 'i:' .. member
end

local function memtier_channel_of(member)
  return string.match(member, ':([a-z]+)$')
end

-- Publish one reason-code event (never content) on the bounded stream.
local function memtier_emit(events_key, max_events, reason, member, session_id, now, wall, detail)
  rcall('XADD', events_key, 'MAXLEN', max_events, '*',
    'reason', reason, 'member', member or '', 'sid', session_id or '',
    'ts', now, 'wall', wall, 'detail', detail or '')
end

-- Remove one session and everything it owns; keeps the partition's byte total exact.
-- The byte count comes from the index hash, so it is exact even when Redis already
-- dropped the session's keys by their TTL.  Returns the bytes freed (-1 if absent).
local function memtier_drop(prefix, member, lru_key, index_key, meta_key, events_key,
                            max_events, reason, now, wall)
  local s_key, t_key, i_key = memtier_session_keys(prefix, member)
  local bytes = rcall('HGET', index_key, member)
  local sid = rcall('HGET', s_key, 'id')
  -- UNLINK: a victim at the turn ceiling is thousands of list/zset elements; Redis frees
  -- them on its lazy-free thread instead of inside this script (tests/faults measures
  -- an append evicting 64 such sessions against a low busy-reply threshold).
  rcall('UNLINK', s_key, t_key, i_key)
  local removed = rcall('ZREM', lru_key, member)
  if not bytes and removed == 0 then
    return -1
  end
  bytes = tonumber(bytes or '0')
  rcall('HDEL', index_key, member)
  if bytes ~= 0 then
    rcall('HINCRBY', meta_key, 'bytes', -bytes)
  end
  memtier_emit(events_key, max_events, reason, member, sid, now, wall, '')
  return bytes
end

-- Sweep up to max_n sessions of one channel whose deadline (last + ttl) has passed.
local function memtier_sweep_channel(prefix, lru_key, ttl_ms, index_key, meta_key, events_key,
                                     max_events, now, wall, max_n, skip_member)
  if max_n <= 0 then
    return 0
  end
  local expired = rcall('ZRANGE', lru_key, '-inf', now - ttl_ms, 'BYSCORE', 'LIMIT', 0, max_n)
  local n = 0
  for _, member in ipairs(expired) do
    if member ~= skip_member then
      memtier_drop(prefix, member, lru_key, index_key, meta_key, events_key, max_events,
        'expired', now, wall)
      n = n + 1
    end
  end
  return n
end
