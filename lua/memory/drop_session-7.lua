#!lua
--[[
  Operator delete or expire of one exact key: removes the session and everything it owns.

  Input:
    KEYS[1] session    session hash   T:s:<member>     (declared for routing; derived again by the helper)
    KEYS[2] turns      turns list     T:t:<member>
    KEYS[3] turn_ids   turn-id zset   T:i:<member>
    KEYS[4] lru        lru zset       T:lru:<channel>
    KEYS[5] index      index hash     T:ix
    KEYS[6] meta       meta hash      T:meta
    KEYS[7] events     events stream  T:events
    ARGV[1] prefix          "T:"
    ARGV[2] member          "<avatar-uuid>:<channel>"
    ARGV[3] reason          "operator_deleted" | "operator_expired"
    ARGV[4] max_events      MAXLEN of the event stream
    ARGV[5] clock_override  "" = server TIME; ms = test clock
    ARGV[6] receipt_key    optional "T:op:<op id>" (same slot: must start with the prefix):
                            the result of this operation, kept for its retries
    ARGV[7] receipt_ttl_ms how long the receipt is kept

  Output:
    { 1, bytes_freed }  removed
    { 0 }               NOT_FOUND: nothing to remove

  Side effects: one event with the reason; partition byte total lowered exactly; with a
  receipt key, the result is stored there, and a call that finds its receipt returns the
  stored result and changes nothing (a retry after a lost reply: exactly once).
]]
--- @include "memory_common"

local lru_key, index_key, meta_key, events_key = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local prefix, member, reason = ARGV[1], ARGV[2], ARGV[3]
local max_events = tonumber(ARGV[4])
local clock_override = ARGV[5]
if not max_events or (reason ~= 'operator_deleted' and reason ~= 'operator_expired') then
  return redis.error_reply('memtier: drop_session: malformed ARGV')
end
local receipt_key, receipt_ttl = ARGV[6] or '', tonumber(ARGV[7] or '0')
if receipt_key ~= '' then
  if string.sub(receipt_key, 1, #prefix + 3) ~= prefix .. 'op:' or not receipt_ttl
      or receipt_ttl <= 0 then
    return redis.error_reply('memtier: drop_session: malformed receipt ARGV')
  end
  local done = redis.call('GET', receipt_key)
  if done then
    local freed_before = string.match(done, '^1:(%d+)$')
    if freed_before then
      return { 1, tonumber(freed_before) }
    end
    return { 0 }
  end
end
local now, wall = memtier_clock(meta_key, clock_override, true)
local freed = memtier_drop(prefix, member, lru_key, index_key, meta_key, events_key,
  max_events, reason, now, wall)
local result = { 0 }
if freed >= 0 then
  result = { 1, freed }
end
if receipt_key ~= '' then
  local stored = '0'
  if freed >= 0 then
    stored = '1:' .. freed
  end
  redis.call('SET', receipt_key, stored, 'PX', receipt_ttl)
end
return result
