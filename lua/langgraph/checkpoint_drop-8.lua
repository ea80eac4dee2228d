#!lua
--[[
  Remove checkpoints of one LangGraph thread atomically -- the whole thread, the
  checkpoints of some runs, or all but the newest per namespace -- with their pending
  writes and every blob no remaining checkpoint references, keeping the byte total exact.

  Input:
    KEYS[1] state        G:s    state hash: tid, bytes, checkpoints, writes
    KEYS[2] index        G:z    checkpoint index, ZSET, lex
    KEYS[3] checkpoints  G:ck   checkpoints HASH
    KEYS[4] versions     G:v    versions HASH
    KEYS[5] blobs        G:b    blobs HASH
    KEYS[6] writes       G:w    writes HASH
    KEYS[7] write_index  G:wz   write index, ZSET, lex
    KEYS[8] runs         G:rz   run index, ZSET, lex
    ARGV[1] mode   "thread": everything (delete_thread, prune "delete")
                   "runs": then the run ids whose checkpoints go (delete_for_runs)
                   "keep_latest": all but the newest checkpoint of each namespace (prune)

  Output:
    { removed_checkpoints, bytes_freed, bytes_left }

  Side effects: G:s counts and bytes updated (the keys are deleted when nothing is left).
  A namespace's newest checkpoint keeps its own pending writes and blobs.
]]
--- @include "checkpoint_common"

local mode = ARGV[1]
local s_key, z_key, ck_key, v_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local b_key, w_key, wz_key, rz_key = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local bytes = tonumber(rcall('HGET', s_key, 'bytes') or '0')

if mode == 'thread' then
  local n = rcall('ZCARD', z_key)
  rcall('DEL', s_key, z_key, ck_key, v_key, b_key, w_key, wz_key, rz_key)
  return { n, bytes, 0 }
end

local victims = {}
if mode == 'runs' then
  for i = 2, #ARGV do
    local run = ARGV[i]
    local found = rcall('ZRANGE', rz_key, '[' .. run .. '\0', '(' .. run .. '\1', 'BYLEX')
    for _, entry in ipairs(found) do
      victims[#victims + 1] = string.sub(entry, #run + 2)
      rcall('ZREM', rz_key, entry)
    end
  end
elseif mode == 'keep_latest' then
  local all = rcall('ZRANGE', z_key, '-', '+', 'BYLEX')
  for i = 1, #all do
    local ns = string.match(all[i], '^([^%z]*)%z')
    local next_ns = all[i + 1] and string.match(all[i + 1], '^([^%z]*)%z')
    if ns == next_ns then victims[#victims + 1] = all[i] end  -- not the newest of its ns
  end
else
  return redis.error_reply('memtier: checkpoint_drop: unknown mode')
end

local freed = 0
local removed = 0
for _, member in ipairs(victims) do
  if rcall('ZREM', z_key, member) == 1 then removed = removed + 1 end
  local v = rcall('HGET', v_key, member)
  if v then
    local _, run = cp_blob_fields(v)
    if run ~= '' then rcall('ZREM', rz_key, run .. '\0' .. member) end
  end
  freed = freed + rcall('HSTRLEN', ck_key, member) + rcall('HSTRLEN', v_key, member)
  rcall('HDEL', ck_key, member)
  rcall('HDEL', v_key, member)
  local wf = rcall('ZRANGE', wz_key, '[' .. member .. '\0', '(' .. member .. '\1', 'BYLEX')
  for _, field in ipairs(wf) do
    freed = freed + rcall('HSTRLEN', w_key, field)
    rcall('HDEL', w_key, field)
    rcall('ZREM', wz_key, field)
  end
end

-- Blobs no remaining checkpoint references.
if removed > 0 then
  local keep = {}
  local vals = rcall('HVALS', v_key)
  for _, v in ipairs(vals) do
    for _, field in ipairs((cp_blob_fields(v))) do keep[field] = true end
  end
  local fields = rcall('HKEYS', b_key)
  for _, field in ipairs(fields) do
    if not keep[field] then
      freed = freed + rcall('HSTRLEN', b_key, field)
      rcall('HDEL', b_key, field)
    end
  end
end

bytes = bytes - freed
if rcall('ZCARD', z_key) == 0 and rcall('ZCARD', wz_key) == 0 then
  rcall('DEL', s_key, z_key, ck_key, v_key, b_key, w_key, wz_key, rz_key)
  return { removed, freed, 0 }
end
rcall('HSET', s_key, 'bytes', bytes, 'checkpoints', rcall('ZCARD', z_key),
  'writes', rcall('ZCARD', wz_key))
return { removed, freed, bytes }
