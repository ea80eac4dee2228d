#!lua
--[[
  Remove and return the newest turn of one session (the undo of the last append), with
  exact byte accounting, atomically.

  Input:
    KEYS[1] session    session hash   T:s:<member>
    KEYS[2] turns      turns list     T:t:<member>
    KEYS[3] turn_ids   turn-id zset   T:i:<member>
    KEYS[4] index      index hash     T:ix       member -> session bytes
    KEYS[5] meta       meta hash      T:meta     bytes (partition total), clock
    KEYS[6] events     events stream  T:events
    ARGV[1] member          "<avatar-uuid>:<channel>"
    ARGV[2] ttl_ms          inactivity TTL of the member's channel, ms
    ARGV[3] max_events      MAXLEN of the event stream
    ARGV[4] clock_override  "" = server TIME (production); ms = test clock

  Output:
    { 1, record, turn_bytes, session_bytes, turns }  popped: record is the stored
        "<seq>|<clock>|<wall>|<bytes>|<flags>|<json>" (either format of
        memtier/memory/turncodec.py); session_bytes and turns are the
        session's totals after the pop
    { 0 }  NOT_FOUND: no live session, or it holds no turn (only a summary, or nothing)

  Side effects (popped): session turns/bytes/tools lowered by the record's own counts;
  index hash and partition total lowered by exactly turn_bytes; the turn id's receipt
  (`r:<id>` and its id-zset member) removed, so appending that turn id again stores it
  again; one `popped` event (detail "seq=<n>").  `seq` is not lowered: seqs are never
  reused, so a compaction planned before the pop fails its range check instead of folding
  a different turn.  Last activity, LRU score and key TTLs are unchanged.  An expired
  session reads as absent (the sweep that removes it publishes the event).
]]
--- @include "memory_common"

local s_key, t_key, i_key = KEYS[1], KEYS[2], KEYS[3]
local index_key, meta_key, events_key = KEYS[4], KEYS[5], KEYS[6]
local member = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
local max_events = tonumber(ARGV[3])
local clock_override = ARGV[4]
if not (ttl_ms and max_events) or member == '' then
  return redis.error_reply('memtier: pop_turn: malformed ARGV')
end

local h = rcall('HMGET', s_key, 'id', 'last', 'turns', 'bytes', 'tools')
if not h[1] or not h[2] then
  return { 0 }
end
local now, wall = memtier_clock(meta_key, clock_override, false)
if now >= tonumber(h[2]) + ttl_ms then
  return { 0 }
end
local record = rcall('RPOP', t_key)
if not record then
  return { 0 }
end
local seq, _c, _w, nbytes, is_tool, payload =
  string.match(record, '^(%d+)|(%d+)|(%d*)|(%d+)|([01])[rv%d]*|(.*)$')
if not seq then
  rcall('RPUSH', t_key, record)  -- never leave the list changed on a malformed record
  return redis.error_reply('memtier: pop_turn: malformed turn record')
end
local turn_bytes = tonumber(nbytes)
local turns = math.max(0, tonumber(h[3] or '0') - 1)
local bytes = math.max(0, tonumber(h[4] or '0') - turn_bytes)
local tools = math.max(0, tonumber(h[5] or '0') - tonumber(is_tool))
rcall('HSET', s_key, 'turns', turns, 'bytes', bytes, 'tools', tools)
rcall('HSET', index_key, member, bytes)
if turn_bytes ~= 0 then
  rcall('HINCRBY', meta_key, 'bytes', -turn_bytes)
end
local ids = rcall('ZRANGE', i_key, seq, seq, 'BYSCORE')
for _, id in ipairs(ids) do
  rcall('HDEL', s_key, 'r:' .. id)
end
if #ids > 0 then
  rcall('ZREMRANGEBYSCORE', i_key, seq, seq)
end
memtier_emit(events_key, max_events, 'popped', member, h[1], now, wall, 'seq=' .. seq)
return { 1, record, turn_bytes, bytes, turns }
