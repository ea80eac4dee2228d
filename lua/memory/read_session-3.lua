#!lua flags=no-writes
--[[
  Read one whole session (hash + every turn record) as a consistent point-in-time copy;
  used by compaction (worker and inline) before it plans a summary. Read-only.

  Input:
    KEYS[1] session    session hash  T:s:<member>
    KEYS[2] turns      turns list    T:t:<member>
    KEYS[3] meta       meta hash     T:meta (clock high-water mark)
    ARGV[1] member          "<avatar-uuid>:<channel>"
    ARGV[2] ttl_ms          inactivity TTL of the member's channel, ms
    ARGV[3] clock_override  "" = server TIME (production); ms = test clock

  Output:
    { clock_ms, wall_ms, 1, member, n_fields, field, value, ..., n_records, record, ... }
        the session (records oldest first, "<seq>|<clock>|<wall>|<bytes>|<is_tool>|<json>")
    { clock_ms, wall_ms, 0 }  NOT_FOUND: no session, or its deadline has passed

  Side effects: none.
]]
--- @include "memory_common"
--- @include "memory_session"

local s_key, t_key, meta_key = KEYS[1], KEYS[2], KEYS[3]
local member = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
local clock_override = ARGV[3]
if not ttl_ms or member == '' then
  return redis.error_reply('memtier: read_session: malformed ARGV')
end

local now, wall = memtier_clock(meta_key, clock_override, false)
if not memtier_session_live(s_key, ttl_ms, now) then
  return { now, wall, 0 }
end
local out = { now, wall, 1 }
memtier_read_session(s_key, t_key, member, out)
return out
