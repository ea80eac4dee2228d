#!lua flags=no-writes
--[[
  The session check of a context read: the session's head fields if it is live, in the
  same MULTI/EXEC as a plain LRANGE of its turns list (memtier.memory.core.context_read),
  so the turns never pass through Lua and the expiry verdict is atomic with the turns
  read.  Read-only: an expired session reads as absent (the sweep that removes it
  publishes the event); the caller ignores the LRANGE reply unless the status is 0.

  Input:
    KEYS[1] session    session hash  T:s:<member>
    KEYS[2] meta       meta hash     T:meta (clock high-water mark)
    ARGV[1] ttl_ms          inactivity TTL of the member's channel, ms
    ARGV[2] clock_override  "" = server TIME; ms = test clock

  Output:
    { 0, sid, summary }  summary is "" when there is none
    { -1 }  NOT_FOUND (no session, or it has expired)
    (what a context read uses; memtier/memory/contexthead.py computes the same reply
    from the same reads sent as plain commands, which the lean paths do)

  Side effects: none.
]]
--- @include "memory_common"

local s_key, meta_key = KEYS[1], KEYS[2]
local ttl_ms = tonumber(ARGV[1])
local clock_override = ARGV[2]
if not ttl_ms then
  return redis.error_reply('memtier: context_head: malformed ARGV')
end

local h = rcall('HMGET', s_key, 'id', 'last', 'summary')
if not h[1] or not h[2] then
  return { -1 }
end
local now = memtier_clock(meta_key, clock_override, false)
if now >= tonumber(h[2]) + ttl_ms then
  return { -1 }
end
return { 0, h[1], h[3] or '' }
