#!lua
--[[
  Set or release the legal hold of a thread (operators).  A held thread cannot be deleted.

  Input:
    KEYS[1] thread hash    T:t:<thread_id>
    ARGV[1] marker   thread marker
    ARGV[2] held     "1" to set the hold, "0" to release it

  Output:
    { -1 }             NOT_FOUND
    { 0, hgetall... }  the thread after the change (idempotent: setting a set hold is fine)

  Side effects: the held field only (version unchanged: a hold is not thread metadata).
]]
--- @include "thread_common"

local thread_key = KEYS[1]
local marker, held = ARGV[1], ARGV[2]
if held ~= '0' and held ~= '1' then
  return redis.error_reply('memtier: hold: held must be 0 or 1')
end
if not thread_live(thread_key, marker) then
  return { -1 }
end
rcall('HSET', thread_key, 'held', held)
return thread_reply(0, thread_key)
