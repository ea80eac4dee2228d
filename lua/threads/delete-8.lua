#!lua
--[[
  Delete a thread and every key it owns, unless a legal hold is set.

  Input:
    KEYS[1] thread          thread hash T:t:<thread_id>
    KEYS[2] entries         entries hash T:e:<thread_id>
    KEYS[3] parents         parents hash T:p:<thread_id>
    KEYS[4] runs            runs hash T:r:<thread_id>
    KEYS[5] events          events stream T:v:<thread_id>
    KEYS[6] lease           lease string T:l:<thread_id>
    KEYS[7] index           owner index T:ix
    KEYS[8] recent_deletes  T:dx: ZSET member "<thread_id>|<token>", score = ms of the delete
    ARGV[1] marker      thread marker
    ARGV[2] tenant      owner tenant id (checked against the row before any write)
    ARGV[3] user        owner user id
    ARGV[4] thread_id   the thread's id
    ARGV[5] token       random token of this delete call (the same for each of its attempts)
    ARGV[6] now_ms      wall clock, ms
    ARGV[7] keep_ms     how long a recent delete is remembered
    ARGV[8] keep_max    at most this many recent deletes are remembered per owner

  Output:
    { -1 }  NOT_FOUND: missing (and not deleted by this token), or stored for another owner
    { 4 }   HELD: a legal hold blocks the delete; nothing removed
    { 0 }   OK: deleted: every key above removed, index member removed
    { 3 }   DONE: an earlier attempt of this same delete (same token) deleted it; its reply
            was lost.  Only the token proves that: a retry never claims a delete of a
            thread that did not exist or is not the caller's.

  Side effects: a run in flight loses its lease (its commit then fails NOT_FOUND and
  writes nothing: a delete always wins).  The recent-deletes ZSET is trimmed by age and size,
  and expires keep_ms after the owner's last delete.
]]
--- @include "thread_common"

local thread_key, index_key, deletes_key = KEYS[1], KEYS[7], KEYS[8]
local marker, tenant, user, thread_id, token = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now_ms, keep_ms, keep_max = thread_int(ARGV[6]), thread_int(ARGV[7]), thread_int(ARGV[8])
if not (now_ms and keep_ms and keep_max) or token == '' or thread_id == '' then
  return redis.error_reply('memtier: delete: malformed ARGV')
end
local member = thread_id .. '|' .. token
if not thread_owned(thread_key, marker, tenant, user) then
  if rcall('ZSCORE', deletes_key, member) then
    return { 3 }
  end
  return { -1 }
end
if rcall('HGET', thread_key, 'held') == '1' then
  return { 4 }
end
local index_member = rcall('HGET', thread_key, 'ixm')
if index_member then
  rcall('ZREM', index_key, index_member)
end
rcall('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
rcall('ZADD', deletes_key, now_ms, member)
rcall('ZREMRANGEBYSCORE', deletes_key, '-inf', '(' .. (now_ms - keep_ms))
if rcall('ZCARD', deletes_key) > keep_max then
  rcall('ZREMRANGEBYRANK', deletes_key, 0, -(keep_max + 1))
end
rcall('PEXPIRE', deletes_key, keep_ms)  -- the set itself goes once nothing is recent
return { 0 }
