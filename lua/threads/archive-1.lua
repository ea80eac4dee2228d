#!lua
--[[
  Archive a thread: a compare-and-swap on its version; archiving an archived thread is a no-op.

  Input:
    KEYS[1] thread            thread hash T:t:<thread_id>
    ARGV[1] marker            thread marker
    ARGV[2] expected_version  the version the caller read (its snapshot)
    ARGV[3] now_ms            wall clock, ms
    ARGV[4] tenant            owner tenant id (checked against the row before any write)
    ARGV[5] user              owner user id

  Output (checked in this order):
    { -1 }             NOT_FOUND (missing, deleted, or stored for another owner)
    { 1, hgetall... }  EXISTED: already archived (whatever the version); unchanged
    { -2, version }    METADATA_CONFLICT: version moved since the caller's snapshot
    { 0, hgetall... }  OK: archived; version + 1

  Side effects: state, version, updated.
]]
--- @include "thread_common"

local thread_key = KEYS[1]
local marker = ARGV[1]
local expected_version = thread_int(ARGV[2])
local now_ms = ARGV[3]
local tenant, user = ARGV[4], ARGV[5]
if not (expected_version and thread_int(now_ms)) then
  return redis.error_reply('memtier: archive: malformed ARGV')
end

if not thread_owned(thread_key, marker, tenant, user) then
  return { -1 }
end
local fields = rcall('HMGET', thread_key, 'version', 'state')
local version, state = tonumber(fields[1]), fields[2]
if state == 'archived' then
  return thread_reply(1, thread_key)
end
if version ~= expected_version then
  return { -2, version }
end
rcall('HSET', thread_key, 'state', 'archived', 'version', version + 1, 'updated', now_ms)
return thread_reply(0, thread_key)
