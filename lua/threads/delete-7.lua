#!lua
--[[
  Delete a thread and every key it owns, unless a legal hold is set.

  Input:
    KEYS[1] thread hash    T:t:<thread_id>
    KEYS[2] entries hash   T:e:<thread_id>
    KEYS[3] parents hash   T:p:<thread_id>
    KEYS[4] runs hash      T:r:<thread_id>
    KEYS[5] events stream  T:v:<thread_id>
    KEYS[6] lease string   T:l:<thread_id>
    KEYS[7] owner index    T:ix
    ARGV[1] marker   thread marker

  Output:
    { -1 }      NOT_FOUND
    { 0, 1 }    HELD: a legal hold blocks the delete; nothing removed
    { 0, 0 }    deleted: every key above removed, index member removed

  Side effects: a run in flight loses its lease (its commit then fails NOT_FOUND and
  writes nothing: a delete always wins).
]]
--- @include "thread_common"

local thread_key, index_key = KEYS[1], KEYS[7]
local marker = ARGV[1]
if not thread_live(thread_key, marker) then
  return { -1 }
end
if rcall('HGET', thread_key, 'held') == '1' then
  return { 0, 1 }
end
local index_member = rcall('HGET', thread_key, 'ixm')
if index_member then
  rcall('ZREM', index_key, index_member)
end
rcall('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
return { 0, 0 }
