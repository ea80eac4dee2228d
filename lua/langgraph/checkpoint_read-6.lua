#!lua flags=no-writes
--[[
  Read LangGraph checkpoints of one thread with their blobs and pending writes, in one
  round trip (get_tuple, list pages). Read-only.

  Input:
    KEYS[1] index        G:z    checkpoint index
    KEYS[2] checkpoints  G:ck
    KEYS[3] versions     G:v
    KEYS[4] blobs        G:b
    KEYS[5] writes       G:w
    KEYS[6] write_index  G:wz   write index
    ARGV[1] mode         "latest": then one checkpoint namespace: its newest checkpoint
                         "ids": then members "<ns>\0<checkpoint id>"

  Output:
    { n, record_1, ..., record_n }, each record flattened as
      member, checkpoint, versions, n_blobs, (blob field, blob value) * n_blobs,
      n_writes, write value * n_writes
    A member that does not exist is left out; a blob that does not exist has value "".
]]
--- @include "checkpoint_common"

local mode = ARGV[1]
local members = {}
if mode == 'latest' then
  local ns = ARGV[2]
  if not ns then return redis.error_reply('memtier: checkpoint_read: malformed ARGV') end
  members = rcall('ZRANGE', KEYS[1], '(' .. ns .. '\1', '(' .. ns .. '\0', 'BYLEX', 'REV',
    'LIMIT', 0, 1)
elseif mode == 'ids' then
  for i = 2, #ARGV do members[#members + 1] = ARGV[i] end
else
  return redis.error_reply('memtier: checkpoint_read: unknown mode')
end

local out = { 0 }
local n = 0
for _, member in ipairs(members) do
  local ck = rcall('HGET', KEYS[2], member)
  if ck then
    n = n + 1
    local v = rcall('HGET', KEYS[3], member) or ''
    out[#out + 1] = member
    out[#out + 1] = ck
    out[#out + 1] = v
    local fields = cp_blob_fields(v)
    out[#out + 1] = #fields
    if #fields > 0 then
      local values = rcall('HMGET', KEYS[4], unpack(fields))
      for j = 1, #fields do
        out[#out + 1] = fields[j]
        out[#out + 1] = values[j] or ''
      end
    end
    local wf = rcall('ZRANGE', KEYS[6], '[' .. member .. '\0', '(' .. member .. '\1', 'BYLEX')
    out[#out + 1] = #wf
    if #wf > 0 then
      local wv = rcall('HMGET', KEYS[5], unpack(wf))
      for j = 1, #wf do out[#out + 1] = wv[j] or '' end
    end
  end
end
out[1] = n
return out
