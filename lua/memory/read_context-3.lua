#!lua flags=no-writes
--[[
  Read one session for the LLM-facing context projection, in one round trip. Read-only:
  an expired session reads as absent (the sweep that removes it publishes the event).

  Input:
    KEYS[1] session    session hash  T:s:<member>
    KEYS[2] turns      turns list    T:t:<member>
    KEYS[3] meta       meta hash     T:meta (clock high-water mark)
    ARGV[1] ttl_ms          inactivity TTL of the member's channel, ms
    ARGV[2] clock_override  "" = server TIME; ms = test clock
    ARGV[3] limit           newest turns to return (0 = all)

  Output:
    { 0, sid, created_ms, created_wall, last_ms, last_wall, turns, bytes, summary, turn_1, ... }
        summary is "" when there is none; turns oldest first, each "<seq>|<clock>|<wall>|<bytes>|<is_tool>|<json>"
    { -1 }  NOT_FOUND (no session, or it has expired)

  Side effects: none.
]]
--- @include "memory_common"

local s_key, t_key, meta_key = KEYS[1], KEYS[2], KEYS[3]
local ttl_ms = tonumber(ARGV[1])
local clock_override = ARGV[2]
local limit = tonumber(ARGV[3])
if not (ttl_ms and limit) then
  return redis.error_reply('memtier: read_context: malformed ARGV')
end

local h = rcall('HMGET', s_key, 'id', 'created', 'created_wall', 'last', 'last_wall', 'turns',
  'bytes', 'summary')
if not h[1] or not h[4] then
  return { -1 }
end
local now = memtier_clock(meta_key, clock_override, false)
if now >= tonumber(h[4]) + ttl_ms then
  return { -1 }
end
local start = 0
if limit > 0 then start = -limit end
local reply = { 0, h[1], tonumber(h[2]), tonumber(h[3]), tonumber(h[4]), tonumber(h[5]),
  tonumber(h[6]), tonumber(h[7]), h[8] or '' }
local turns = rcall('LRANGE', t_key, start, -1)
for i = 1, #turns do reply[#reply + 1] = turns[i] end
return reply
