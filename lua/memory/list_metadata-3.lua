#!lua flags=no-writes
--[[
  One page of session metadata for a partition (never content): HSCAN over the index hash,
  so every session live for the whole listing is returned at least once.

  Input:
    KEYS[1] index      index hash  T:ix
    KEYS[2] meta       meta hash   T:meta
    KEYS[3] lru_public lru zset    T:lru:public   (declared for routing only)
    ARGV[1] prefix          "T:"
    ARGV[2] cursor          HSCAN cursor ("0" to start)
    ARGV[3] count           HSCAN COUNT hint (page size)
    ARGV[4] public_ttl_ms
    ARGV[5] im_ttl_ms
    ARGV[6] clock_override  "" = server TIME; ms = test clock

  Output:
    { next_cursor, member, sid, created, created_wall, last, last_wall, turns, bytes, ... }
        8 fields per live session; next_cursor "0" = done. Expired sessions are skipped.

  Side effects: none.
]]
--- @include "memory_common"

local index_key, meta_key = KEYS[1], KEYS[2]
local prefix, cursor = ARGV[1], ARGV[2]
local count = tonumber(ARGV[3])
local pub_ttl, im_ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
if not (count and pub_ttl and im_ttl) then
  return redis.error_reply('memtier: list_metadata: malformed ARGV')
end
local now = memtier_clock(meta_key, ARGV[6], false)
local page = rcall('HSCAN', index_key, cursor, 'COUNT', count)
local reply = { page[1] }
local entries = page[2]
for i = 1, #entries, 2 do
  local member = entries[i]
  local h = rcall('HMGET', prefix .. 's:' .. member, 'id', 'created', 'created_wall', 'last',
    'last_wall', 'turns', 'bytes')
  if h[1] and h[4] then
    local ttl = pub_ttl
    if memtier_channel_of(member) == 'im' then ttl = im_ttl end
    if now < tonumber(h[4]) + ttl then
      reply[#reply + 1] = member
      for j = 1, 7 do reply[#reply + 1] = h[j] end
    end
  end
end
return reply
