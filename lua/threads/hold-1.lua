#!lua
--[[
  Set or release the legal hold of a thread (operators).  A held thread cannot be deleted.

  Input:
    KEYS[1] thread   thread hash T:t:<thread_id>
    ARGV[1] marker   thread marker
    ARGV[2] held     "1" to set the hold, "0" to release it
    ARGV[3] tenant   owner tenant id (checked against the row before any write)
    ARGV[4] user     owner user id

  Output:
    { -1 }             NOT_FOUND (missing, or stored for another owner)
    { 0, hgetall... }  OK: the thread after the change (idempotent: setting a set hold is fine)

  Side effects: the held field only (version unchanged: a hold is not thread metadata).
]]
--- @include "thread_common"

local thread_key = KEYS[1]
local marker, held, tenant, user = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if held ~= '0' and held ~= '1' then
  return redis.error_reply('memtier: hold: held must be 0 or 1')
end
if not thread_owned(thread_key, marker, tenant, user) then
  return { -1 }
end
rcall('HSET', thread_key, 'held', held)
return thread_reply(0, thread_key)
