--[[
  Read helpers of the worker scripts (compaction and snapshots), inlined by the loader.

  memtier_read_session appends one session to a reply array in the shape decoded by
  memtier/memory/state.py (iter_sessions):
    member, n_fields, field_1, value_1, ..., n_records, record_1, ...
  It reads the hash and the whole turns list inside the calling script, so the copy is
  a consistent point in time (never half of an append or of a compaction), and returns
  the number of hash fields and records it copied.
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

local function memtier_read_session(s_key, t_key, member, out)
  local h = redis.call('HGETALL', s_key)
  out[#out + 1] = member
  out[#out + 1] = #h
  for i = 1, #h do out[#out + 1] = h[i] end
  local recs = redis.call('LRANGE', t_key, 0, -1)
  out[#out + 1] = #recs
  for i = 1, #recs do out[#out + 1] = recs[i] end
  return #h + #recs -- the reply elements it added (callers bound their work by it)
end
