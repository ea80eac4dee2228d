#!lua
--[[
  Write checkpoint data into one LangGraph thread atomically (put, put_writes,
  copy_thread), under the thread's byte ceiling, with exact byte accounting and the
  thread's TTL refreshed.

  Input:
    KEYS[1] state        G:s    state hash: tid, bytes, checkpoints, writes
    KEYS[2] index        G:z    checkpoint index, ZSET, lex
    KEYS[3] checkpoints  G:ck   checkpoints HASH
    KEYS[4] versions     G:v    versions HASH
    KEYS[5] blobs        G:b    blobs HASH
    KEYS[6] writes       G:w    writes HASH
    KEYS[7] write_index  G:wz   write index, ZSET, lex
    KEYS[8] runs         G:rz   run index, ZSET, lex
    ARGV[1] thread_id        stored in G:s `tid`
    ARGV[2] ttl_ms           PEXPIRE of every key of the thread (refreshed on each write)
    ARGV[3] max_bytes        byte ceiling of the thread (sum of the value bytes of hashes 3-6)
    then the ops, four arguments each: op, key index k (1-8), field, value:
      "set"  HSET KEYS[k] field value (replaces; accounting by the old HSTRLEN)
      "nx"   HSET KEYS[k] field value only if the field is absent (idempotent writes)
      "zadd" ZADD KEYS[k] 0 field (value ignored)

  Output:
    { 0, bytes, delta }        OK: written: the thread's bytes after, and the change
    { -1, needed, max_bytes }  THREAD_FULL: the ops would pass max_bytes; nothing written

  Side effects: G:s `checkpoints` = ZCARD G:z and `writes` = ZCARD G:wz after the ops;
  every key's TTL set to ttl_ms.  Only hashes 3-6 carry counted bytes.
]]
local rcall = redis.call
local tid = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
local max_bytes = tonumber(ARGV[3])
if not (ttl_ms and max_bytes) or ttl_ms <= 0 or (#ARGV - 3) % 4 ~= 0 then
  return redis.error_reply('memtier: checkpoint_write: malformed ARGV')
end

-- 1. Dry run: the byte change, with later ops on the same field seeing earlier ones.
local pending = {}
local skip = {}
local delta = 0
for i = 4, #ARGV, 4 do
  local op, k, field, value = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3]
  if not k or k < 1 or k > 8 or (op ~= 'set' and op ~= 'nx' and op ~= 'zadd') then
    return redis.error_reply('memtier: checkpoint_write: malformed op')
  end
  if op ~= 'zadd' then
    if k < 3 or k > 6 then
      return redis.error_reply('memtier: checkpoint_write: hash op on a non-hash key')
    end
    local slot = k .. '\0' .. field
    local current = pending[slot]
    if current == nil then
      current = rcall('HSTRLEN', KEYS[k], field)
      if current == 0 and rcall('HEXISTS', KEYS[k], field) == 0 then current = false end
    end
    if op == 'nx' and current then
      skip[i] = true
    else
      delta = delta + #value - (current or 0)
      pending[slot] = #value
    end
  end
end
local bytes = tonumber(rcall('HGET', KEYS[1], 'bytes') or '0')
if delta > 0 and bytes + delta > max_bytes then
  return { -1, bytes + delta, max_bytes }
end

-- 2. Apply.
for i = 4, #ARGV, 4 do
  if not skip[i] then
    local op, k, field, value = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3]
    if op == 'zadd' then
      rcall('ZADD', KEYS[k], 0, field)
    else
      rcall('HSET', KEYS[k], field, value)
    end
  end
end
bytes = bytes + delta
rcall('HSET', KEYS[1], 'tid', tid, 'bytes', bytes, 'checkpoints', rcall('ZCARD', KEYS[2]),
  'writes', rcall('ZCARD', KEYS[7]))
for k = 1, 8 do rcall('PEXPIRE', KEYS[k], ttl_ms) end
return { 0, bytes, delta }
