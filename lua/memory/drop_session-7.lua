#!lua
--[[
  Operator delete or expire of one exact key: removes the session and everything it owns.

  Input:
    KEYS[1] session hash   T:s:<member>     (declared for routing; derived again by the helper)
    KEYS[2] turns list     T:t:<member>
    KEYS[3] turn-id zset   T:i:<member>
    KEYS[4] lru zset       T:lru:<channel>
    KEYS[5] index hash     T:ix
    KEYS[6] meta hash      T:meta
    KEYS[7] events stream  T:events
    ARGV[1] prefix          "T:"
    ARGV[2] member          "<avatar-uuid>:<channel>"
    ARGV[3] reason          "operator_deleted" | "operator_expired"
    ARGV[4] max_events      MAXLEN of the event stream
    ARGV[5] clock_override  "" = server TIME; ms = test clock

  Output:
    { 1, bytes_freed }  removed
    { 0 }               NOT_FOUND: nothing to remove

  Side effects: one event with the reason; partition byte total lowered exactly.
]]
--- @include "memory_common"

local lru_key, index_key, meta_key, events_key = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local prefix, member, reason = ARGV[1], ARGV[2], ARGV[3]
local max_events = tonumber(ARGV[4])
local clock_override = ARGV[5]
if not max_events or (reason ~= 'operator_deleted' and reason ~= 'operator_expired') then
  return redis.error_reply('memtier: drop_session: malformed ARGV')
end
local now, wall = memtier_clock(meta_key, clock_override, true)
local freed = memtier_drop(prefix, member, lru_key, index_key, meta_key, events_key,
  max_events, reason, now, wall)
if freed < 0 then
  return { 0 }
end
return { 1, freed }
