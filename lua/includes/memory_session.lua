--[[
  Read helpers of the worker scripts (compaction and snapshots), inlined by the loader.

  memtier_read_session appends one session to a reply array in the shape decoded by
  memtier/memory/state.py (iter_sessions):
    member, n_fields, field_1, value_1, ..., n_records, record_1, ...
  It reads the hash and the whole turns list inside the calling script, so the copy is
  a consistent point in time (never half of an append or of a compaction), and returns
  the number of hash fields and records it copied.  memtier_read_live_session does the
  same for a session that is live (the check of memtier_session_live, on the fields of
  the one HGETALL: a snapshot page does one command less per session) and returns nil,
  adding nothing, for one that is not.
]]

-- The inactivity TTL (ms) of a member's channel.
local function memtier_ttl_of(member, public_ttl, im_ttl)
  if string.match(member, ':([a-z]+)$') == 'im' then
    return im_ttl
  end
  return public_ttl
end

-- True when the session hash exists and its deadline (last + ttl) has not passed.
local function memtier_session_live(s_key, ttl_ms, now)
  local last = redis.call('HGET', s_key, 'last')
  return last ~= false and last ~= nil and now < tonumber(last) + ttl_ms
end

-- Appends the hash `h` (already read) and the turns list of one session to `out`.
local function memtier_copy_session(h, t_key, member, out)
  -- One length lookup per session, then a running index: `out[#out + 1]` per element
  -- costs a length search of the growing reply each time (Lua 5.1's `#`).
  local n = #out
  local nh = #h
  out[n + 1] = member
  out[n + 2] = nh
  n = n + 2
  for i = 1, nh do out[n + i] = h[i] end
  n = n + nh
  local recs = redis.call('LRANGE', t_key, 0, -1)
  local nr = #recs
  out[n + 1] = nr
  n = n + 1
  for i = 1, nr do out[n + i] = recs[i] end
  return nh + nr -- the hash fields and records it copied (callers bound their work by it)
end

local function memtier_read_live_session(s_key, t_key, member, ttl_ms, now, out)
  local h = redis.call('HGETALL', s_key)
  local last = nil
  for i = 1, #h, 2 do
    if h[i] == 'last' then
      last = h[i + 1]
      break
    end
  end
  if last == nil or not (now < tonumber(last) + ttl_ms) then
    return nil
  end
  return memtier_copy_session(h, t_key, member, out)
end

local function memtier_read_session(s_key, t_key, member, out)
  return memtier_copy_session(redis.call('HGETALL', s_key), t_key, member, out)
end
