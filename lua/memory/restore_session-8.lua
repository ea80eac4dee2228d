#!lua
--[[
  Restore one validated session from a snapshot generation: create-only, so live data
  in Redis is never overwritten by an older snapshot. Time since the flush counts
  against the channel TTL: the session's inactivity at the flush (age_ms) plus the
  server wall time elapsed since it was read -- zero if the wall clock is now behind the
  flush (a clock stepped backwards neither expires nor extends anything). A session past
  its TTL is not restored (an `expired` event, detail "recovery").

  Input:
    KEYS[1] session        T:s:<member>, hash
    KEYS[2] turns          T:t:<member>, list
    KEYS[3] turn_ids       T:i:<member>, zset
    KEYS[4] lru            T:lru:<channel of this member>, zset
    KEYS[5] other_lru      T:lru:<the other channel>, zset (session count)
    KEYS[6] index          T:ix, hash: member -> session bytes
    KEYS[7] meta           T:meta, hash: bytes, clock
    KEYS[8] events         T:events, stream
    ARGV[1]  member            "<avatar-uuid>:<channel>"
    ARGV[2]  session_id
    ARGV[3]  created_ms        clock (ms) of the session's creation, flush epoch
    ARGV[4]  created_wall_ms   wall time of the creation (for people)
    ARGV[5]  last_ms           clock of the last activity, flush epoch
    ARGV[6]  last_wall_ms
    ARGV[7]  seq               the session's sequence counter
    ARGV[8]  summary           summary JSON ("" = none)
    ARGV[9]  summary_version
    ARGV[10] age_ms            inactivity when the flush read the session, ms
    ARGV[11] read_wall_ms      server wall time of that read, ms
    ARGV[12] flush_wall_ms     server wall time at the end of the flush, ms
    ARGV[13] ttl_ms            inactivity TTL of this member's channel (current config), ms
    ARGV[14] grace_ms          Redis key TTL = remaining TTL + grace
    ARGV[15] max_sessions      live sessions allowed in this partition
    ARGV[16] max_aggregate     bytes allowed in this partition
    ARGV[17] max_session_bytes
    ARGV[18] max_turns
    ARGV[19] max_events        MAXLEN of the event stream
    ARGV[20] clock_override    "" = server TIME (production); ms = test clock
    ARGV[21] detail            event detail, e.g. "generation=42"
    ARGV[22] n_records
    ARGV[23 .. 22+n]           records "<seq>|<clock>|<wall>|<bytes>|<is_tool>|<json>" (flush epoch)
    ARGV[23+n ..]              receipts as pairs: turn_id, "<sid>|<seq>|<clock>|<wall>|<bytes>|<rotated>"

  Output (negative = refused, zero = done, positive = a variant: RestoreStatus in
  memtier/memory/restorestatus.py):
    RESTORED  0   { 0, bytes, last_ms } (last_ms = the restored last activity, new epoch)
    EXISTS    1   { 1 } the key is live in Redis; nothing changed
    EXPIRED   2   { 2, age_ms } past its TTL on recovery; `expired` event
    NO_ROOM  -1   { -1, "sessions"|"bytes" } the partition's ceilings are full; event
                  evicted_session_pressure / evicted_aggregate_pressure

  Side effects (RESTORED): session hash, turns, turn ids and receipts created; clocks moved
  into the current epoch (last = now - recovered age, created and record clocks shifted
  by the same amount); LRU score, index bytes, partition total and key TTLs
  (remaining TTL + grace) set exactly as append would have; one `restored` event.
]]
--- @include "memory_common"

local s_key, t_key, i_key = KEYS[1], KEYS[2], KEYS[3]
local lru_key, other_lru_key = KEYS[4], KEYS[5]
local index_key, meta_key, events_key = KEYS[6], KEYS[7], KEYS[8]

local member = ARGV[1]
local session_id = ARGV[2]
local created_ms = tonumber(ARGV[3])
local created_wall = tonumber(ARGV[4])
local last_ms = tonumber(ARGV[5])
local last_wall = tonumber(ARGV[6])
local seq_counter = tonumber(ARGV[7])
local summary = ARGV[8]
local summary_version = tonumber(ARGV[9])
local age_ms = tonumber(ARGV[10])
local read_wall = tonumber(ARGV[11])
local flush_wall = tonumber(ARGV[12])
local ttl_ms = tonumber(ARGV[13])
local grace_ms = tonumber(ARGV[14])
local max_sessions = tonumber(ARGV[15])
local max_aggregate = tonumber(ARGV[16])
local max_session_bytes = tonumber(ARGV[17])
local max_turns = tonumber(ARGV[18])
local max_events = tonumber(ARGV[19])
local clock_override = ARGV[20]
local detail = ARGV[21]
local n_records = tonumber(ARGV[22])
local CHUNK = 1000 -- arguments per RPUSH / HSET / ZADD (well under Lua's unpack limit)

if not (created_ms and created_wall and last_ms and last_wall and seq_counter
        and summary_version and age_ms and read_wall and flush_wall and ttl_ms and grace_ms
        and max_sessions and max_aggregate and max_session_bytes and max_turns and max_events
        and n_records)
    or member == '' or session_id == '' or n_records < 0 or n_records > max_turns
    or (#ARGV - 22 - n_records) % 2 ~= 0 then
  return redis.error_reply('memtier: restore_session: malformed ARGV')
end

local now, wall = memtier_clock(meta_key, clock_override, true)

-- 1. Create-only: a live key (even one created after the restart) always wins.
if rcall('EXISTS', s_key) == 1 or rcall('EXISTS', t_key) == 1
    or rcall('HEXISTS', index_key, member) == 1 then
  return { 1 }
end

-- 2. Time since the flush: forward elapsed counts, a clock behind the flush counts zero.
local elapsed = 0
if wall >= flush_wall and wall > read_wall then
  elapsed = wall - read_wall
end
local age = age_ms + elapsed
if age >= ttl_ms then
  memtier_emit(events_key, max_events, 'expired', member, session_id, now, wall, 'recovery')
  return { 2, age }
end

-- 3. Exact accounting from the records themselves.
local nbytes, ntools = string.len(summary), 0
local records = {}
local prev_seq = 0
local shift = (now - age) - last_ms
for i = 1, n_records do
  local rec = ARGV[22 + i]
  local seq, clock, rest = string.match(rec, '^(%d+)|(%d+)|(%d+|%d+|[01]|.*)$')
  if not seq then
    return redis.error_reply('memtier: restore_session: malformed record')
  end
  local rb, rt = string.match(rest, '^%d+|(%d+)|([01])|')
  seq = tonumber(seq)
  if seq <= prev_seq or seq > seq_counter then
    return redis.error_reply('memtier: restore_session: record sequence out of order')
  end
  prev_seq = seq
  nbytes = nbytes + tonumber(rb)
  if rt == '1' then ntools = ntools + 1 end
  records[#records + 1] = seq .. '|' .. (tonumber(clock) + shift) .. '|' .. rest
end
if nbytes > max_session_bytes then
  return redis.error_reply('memtier: restore_session: session larger than its bound')
end

-- 4. Ceilings of the partition (the configuration may have been lowered since the flush).
local live = rcall('ZCARD', lru_key) + rcall('ZCARD', other_lru_key)
if live + 1 > max_sessions then
  memtier_emit(events_key, max_events, 'evicted_session_pressure', member, session_id, now,
    wall, 'recovery')
  return { -1, 'sessions' }
end
local aggregate = tonumber(rcall('HGET', meta_key, 'bytes') or '0')
if aggregate + nbytes > max_aggregate then
  memtier_emit(events_key, max_events, 'evicted_aggregate_pressure', member, session_id, now,
    wall, 'recovery')
  return { -1, 'bytes' }
end

-- 5. Create.
local new_last = now - age
local fields = { 'id', session_id, 'created', created_ms + shift, 'created_wall', created_wall,
  'seq', seq_counter, 'turns', n_records, 'bytes', nbytes, 'tools', ntools,
  'summary_bytes', string.len(summary), 'last', new_last, 'last_wall', last_wall }
if summary ~= '' then
  fields[#fields + 1] = 'summary'
  fields[#fields + 1] = summary
  fields[#fields + 1] = 'sv'
  fields[#fields + 1] = summary_version
end
rcall('HSET', s_key, unpack(fields))
for i = 1, #records, CHUNK do
  rcall('RPUSH', t_key, unpack(records, i, math.min(i + CHUNK - 1, #records)))
end
local first_receipt = 23 + n_records
local pairs_n = (#ARGV - first_receipt + 1) / 2
for j = 0, pairs_n - 1, CHUNK / 2 do
  local h, z = {}, {}
  for p = j, math.min(j + CHUNK / 2, pairs_n) - 1 do
    local turn_id, receipt = ARGV[first_receipt + 2 * p], ARGV[first_receipt + 2 * p + 1]
    local rseq = string.match(receipt, '^[^|]+|(%d+)|')
    if not rseq then
      return redis.error_reply('memtier: restore_session: malformed receipt')
    end
    h[#h + 1] = 'r:' .. turn_id
    h[#h + 1] = receipt
    z[#z + 1] = tonumber(rseq)
    z[#z + 1] = turn_id
  end
  if #h > 0 then
    rcall('HSET', s_key, unpack(h))
    rcall('ZADD', i_key, unpack(z))
  end
end
rcall('ZADD', lru_key, new_last, member)
rcall('HSET', index_key, member, nbytes)
rcall('HINCRBY', meta_key, 'bytes', nbytes)
local expire_ms = ttl_ms - age + grace_ms
rcall('PEXPIRE', s_key, expire_ms)
if #records > 0 then rcall('PEXPIRE', t_key, expire_ms) end
if pairs_n > 0 then rcall('PEXPIRE', i_key, expire_ms) end
memtier_emit(events_key, max_events, 'restored', member, session_id, now, wall, detail)
return { 0, nbytes, new_last }
