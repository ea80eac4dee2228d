#!lua
--[[
  Record a branch ref (a leaf entry id) on a thread: a compare-and-swap on its version.

  Input:
    KEYS[1] thread            thread hash T:t:<thread_id>
    KEYS[2] parents           parents hash T:p:<thread_id>: entry id -> parent entry id ("" = root)
    ARGV[1] marker            thread marker
    ARGV[2] leaf_id           entry id to branch from
    ARGV[3] expected_version  the version the caller read (its snapshot)
    ARGV[4] max_branches      active-branch cap
    ARGV[5] now_ms            wall clock, ms
    ARGV[6] tenant            owner tenant id (checked against the row before any write)
    ARGV[7] user              owner user id

  Output (checked in this order):
    { -1 }             NOT_FOUND (missing, deleted, or stored for another owner: a branch
                       never re-creates a thread nor touches a row it does not own)
    { 1, hgetall... }  EXISTED: leaf_id already is a branch ref (refs are append-only;
                       replay-safe)
    { -2, version }    METADATA_CONFLICT: version moved since the caller's snapshot
    { -3 }             THREAD_ARCHIVED
    { -5 }             UNKNOWN_LEAF: no such entry in this thread
    { -4, count }      BRANCH_LIMIT: max_branches refs already recorded
    { 0, hgetall... }  OK: recorded; version + 1

  Side effects: branches JSON array gains {leafId, createdAt}; version and updated change.
]]
--- @include "thread_common"

local thread_key, parents_key = KEYS[1], KEYS[2]
local marker, leaf_id = ARGV[1], ARGV[2]
local expected_version = thread_int(ARGV[3])
local max_branches = thread_int(ARGV[4])
local now_ms = ARGV[5]
local tenant, user = ARGV[6], ARGV[7]
if not (expected_version and max_branches and thread_int(now_ms)) or leaf_id == '' then
  return redis.error_reply('memtier: branch: malformed ARGV')
end

if not thread_owned(thread_key, marker, tenant, user) then
  return { -1 }
end
local fields = rcall('HMGET', thread_key, 'version', 'state', 'branches')
local version, state = tonumber(fields[1]), fields[2]
local branches = cjson.decode(fields[3])
for _, ref in ipairs(branches) do
  if ref.leafId == leaf_id then
    return thread_reply(1, thread_key)
  end
end
if version ~= expected_version then
  return { -2, version }
end
if state ~= 'active' then
  return { -3 }
end
if rcall('HEXISTS', parents_key, leaf_id) == 0 then
  return { -5 }
end
if #branches >= max_branches then
  return { -4, #branches }
end
branches[#branches + 1] = { leafId = leaf_id, createdAt = now_ms }
rcall('HSET', thread_key, 'branches', cjson.encode(branches),
  'version', version + 1, 'updated', now_ms)
return thread_reply(0, thread_key)
