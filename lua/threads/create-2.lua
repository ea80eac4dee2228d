#!lua
--[[
  Create one conversation thread (create-only: never overwrites an existing thread).

  Input:
    KEYS[1] thread   thread hash T:t:<thread_id> (T = "{<ns>:o:<tenant>:<user>}")
    KEYS[2] index    owner index T:ix: ZSET, all scores 0, member "<created ms, 20 digits>|<id>"
    ARGV[1]  marker         thread marker ("memtier.conversation/1")
    ARGV[2]  thread_id      validated id
    ARGV[3]  tenant         owner tenant id (immutable after create)
    ARGV[4]  user           owner user id   (immutable after create)
    ARGV[5]  now_ms         wall clock, ms since the epoch
    ARGV[6]  has_title      "1" if ARGV[7] is a title, "0" for none
    ARGV[7]  title          redacted, bounded title
    ARGV[8]  metadata       host metadata, a JSON object (bounded by the client)
    ARGV[9]  fingerprint    sha256 of (title, metadata, request id): what makes a create "the same"
    ARGV[10] index_member   "<created ms, 20 digits>|<thread_id>"
    ARGV[11] max_threads    threads one owner may hold

  Output:
    { 0, hgetall... }  OK: created
    { 1, hgetall... }  EXISTED: the same create already happened (same fingerprint); unchanged
    { -2 }             METADATA_CONFLICT: the id exists with a different create, or as a row
                       of another owner / without the marker; unchanged.  The client reads
                       first (get-or-create), so it sees this only when it lost a true
                       create+create race: the row appeared between its read and this write.
    { -6, count }      LIMIT_EXCEEDED: the owner holds max_threads threads

  Side effects: the thread hash; one member in the owner index.
]]
--- @include "thread_common"

local thread_key, index_key = KEYS[1], KEYS[2]
local marker, thread_id, tenant, user = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now_ms = ARGV[5]
local has_title, title, metadata = ARGV[6], ARGV[7], ARGV[8]
local fingerprint, index_member = ARGV[9], ARGV[10]
local max_threads = thread_int(ARGV[11])
if not (max_threads and thread_int(now_ms)) or (has_title ~= '0' and has_title ~= '1') then
  return redis.error_reply('memtier: create: malformed ARGV')
end

if rcall('EXISTS', thread_key) == 1 then
  if thread_owned(thread_key, marker, tenant, user)
      and rcall('HGET', thread_key, 'cfp') == fingerprint then
    return thread_reply(1, thread_key)
  end
  return { -2 }
end

local count = rcall('ZCARD', index_key)
if count >= max_threads then
  return { -6, count }
end

rcall('HSET', thread_key,
  'marker', marker, 'id', thread_id, 'tenant', tenant, 'user', user,
  'state', 'active', 'version', 1, 'branches', '[]',
  'created', now_ms, 'updated', now_ms, 'metadata', metadata,
  'head', '', 'entries', 0, 'bytes', 0, 'held', 0,
  'ixm', index_member, 'cfp', fingerprint, 'eseq', 0)
if has_title == '1' then
  rcall('HSET', thread_key, 'title', title)
end
rcall('ZADD', index_key, 0, index_member)
return thread_reply(0, thread_key)
