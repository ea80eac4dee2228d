#!lua
--[[
  Compare-and-swap a compaction summary into one session: fold the oldest `fold_n` turn
  records into the new summary, only if the session is still the one that was read.
  New turns appended since the read are fine (only the old prefix is folded); a rotation,
  delete, eviction or concurrent compaction makes the swap fail, nothing lost or resurrected.

  Checks, in order: the session exists and is live, its id is `session_id` (else it was
  rotated, deleted or evicted: NOT_FOUND), its summary version is `expected_sv`, and its
  first `fold_n` records are exactly seq `first_seq` .. `last_seq` (else CONFLICT).

  Input:
    KEYS[1] session    session hash    T:s:<member>
    KEYS[2] turns      turns list      T:t:<member>
    KEYS[3] index      index hash      T:ix      member -> session bytes
    KEYS[4] meta       meta hash       T:meta    bytes (partition total), clock
    KEYS[5] events     events stream   T:events
    KEYS[6] compact    compact stream  T:compact (the job, acknowledged and deleted here)
    KEYS[7] turn_ids   turn-id zset    T:i:<member>  (turn id -> seq, the idempotency window)
    ARGV[1]  member             "<avatar-uuid>:<channel>"
    ARGV[2]  session_id         the id the plan was computed for
    ARGV[3]  expected_sv        summary version read with the session (absent = 0)
    ARGV[4]  fold_n             records to fold; 0 = nothing to fold, only release the job
    ARGV[5]  first_seq          seq of the first folded record
    ARGV[6]  last_seq           seq of the last folded record
    ARGV[7]  summary            the new summary JSON; its length in bytes is the summary size;
                                "" with fold_n > 0: the folded turns leave no summary (the
                                planner does this only when there is none and the turns hold
                                fewer bytes than the smallest summary: compaction never grows)
    ARGV[8]  ttl_ms             inactivity TTL of the member's channel, ms
    ARGV[9]  max_session_bytes  bytes per session (turns + summary)
    ARGV[10] max_summary_bytes  bytes of one summary
    ARGV[11] max_aggregate      bytes allowed in this partition
    ARGV[12] max_events         MAXLEN of the event stream
    ARGV[13] clock_override     "" = server TIME (production); ms = test clock
    ARGV[14] group              consumer group of the job ("" = inline, no job)
    ARGV[15] job_id             stream id of the job ("" = inline, no job)

  Output:
    { 0, folded, removed_bytes, removed_tools, session_bytes, turns, summary_version }
        APPLIED: records folded, summary stored, job acknowledged
    { 1 }                  RELEASED: fold_n = 0; the queued job (cq) cleared, job acknowledged
    { -1 }                 NOT_FOUND: no live session with that id; job acknowledged
    { -2, what }           CONFLICT: what = "sv" | "range"; nothing changed, job left pending
    { -3, what, value, limit }  OVER_BOUND: what = "summary" | "session" | "aggregate";
                           nothing changed, job left pending

  Side effects (APPLIED): turns list trimmed; session bytes, turns, tools, summary,
  summary_bytes, sv updated; index hash and partition total changed by exactly the same
  delta; a receipt `r:<turn_id>` = "<sid>|<seq>|<clock>|<wall>|<bytes>|<rotated>" in the
  session hash for every folded turn whose id is still in the id zset, so a retry of it
  keeps its first answer once its record is gone (append_turn answers other retries from
  the record itself; the receipts leave with their ids); `cq` cleared and the job it names deleted from the stream (APPLIED and RELEASED);
  one `compacted` event (detail "folded=<n> seq=<first>-<last>").
  Last activity, LRU score and key TTLs are unchanged: compaction is not activity.
]]
--- @include "memory_common"
--- @include "memory_session"

local s_key, t_key, index_key = KEYS[1], KEYS[2], KEYS[3]
local meta_key, events_key, compact_key = KEYS[4], KEYS[5], KEYS[6]
local i_key = KEYS[7]

local member = ARGV[1]
local session_id = ARGV[2]
local expected_sv = tonumber(ARGV[3])
local fold_n = tonumber(ARGV[4])
local first_seq = tonumber(ARGV[5])
local last_seq = tonumber(ARGV[6])
local summary = ARGV[7]
local ttl_ms = tonumber(ARGV[8])
local max_session_bytes = tonumber(ARGV[9])
local max_summary_bytes = tonumber(ARGV[10])
local max_aggregate = tonumber(ARGV[11])
local max_events = tonumber(ARGV[12])
local clock_override = ARGV[13]
local group = ARGV[14]
local job_id = ARGV[15]

if not (expected_sv and fold_n and first_seq and last_seq and ttl_ms and max_session_bytes
        and max_summary_bytes and max_aggregate and max_events)
    or member == '' or session_id == '' or fold_n < 0
    or (fold_n > 0 and first_seq > last_seq) then
  return redis.error_reply('memtier: apply_compaction: malformed ARGV')
end

local function ack()
  if group ~= '' and job_id ~= '' then
    rcall('XACK', compact_key, group, job_id)
    rcall('XDEL', compact_key, job_id)
  end
end

-- The session no longer needs the job it queued (cq = that job's stream id): delete it
-- from the stream too, so an inline compaction leaves no stale job behind.
local function clear_queued()
  local queued = rcall('HGET', s_key, 'cq')
  if queued then
    if queued ~= job_id and string.match(queued, '^%d+%-%d+$') then
      rcall('XDEL', compact_key, queued)
    end
    rcall('HDEL', s_key, 'cq')
  end
end

local now, wall = memtier_clock(meta_key, clock_override, false)
if not memtier_session_live(s_key, ttl_ms, now) or rcall('HGET', s_key, 'id') ~= session_id then
  ack()
  return { -1 }
end

if fold_n == 0 then
  clear_queued()
  ack()
  return { 1 }
end

local h = rcall('HMGET', s_key, 'sv', 'bytes', 'turns', 'tools', 'summary_bytes')
local sv = tonumber(h[1] or '0')
local bytes = tonumber(h[2] or '0')
local turns = tonumber(h[3] or '0')
local tools = tonumber(h[4] or '0')
local old_summary_bytes = tonumber(h[5] or '0')
if sv ~= expected_sv then
  return { -2, 'sv' }
end

local folded = rcall('LRANGE', t_key, 0, fold_n - 1)
if #folded ~= fold_n then
  return { -2, 'range' }
end
local removed_bytes, removed_tools = 0, 0
local receipt_of = {} -- seq -> the receipt value of that folded turn
for i = 1, #folded do
  -- both record formats (memtier/memory/turncodec.py): wall empty = the clock
  local seq, clock, wall, nbytes, tool, rot =
    string.match(folded[i], '^(%d+)|(%d+)|(%d*)|(%d+)|([01])(r?)[v%d]*|')
  if not seq then
    return redis.error_reply('memtier: apply_compaction: malformed turn record in ' .. t_key)
  end
  seq = tonumber(seq)
  if (i == 1 and seq ~= first_seq) or (i == fold_n and seq ~= last_seq) then
    return { -2, 'range' }
  end
  removed_bytes = removed_bytes + tonumber(nbytes)
  if tool == '1' then removed_tools = removed_tools + 1 end
  if wall == '' then wall = clock end
  receipt_of[seq] = session_id .. '|' .. seq .. '|' .. clock .. '|' .. wall .. '|' .. nbytes
    .. '|' .. (rot == 'r' and 1 or 0)
end

local summary_bytes = string.len(summary)
if summary_bytes > max_summary_bytes then
  return { -3, 'summary', summary_bytes, max_summary_bytes }
end
local new_bytes = bytes - removed_bytes - old_summary_bytes + summary_bytes
if new_bytes > max_session_bytes then
  return { -3, 'session', new_bytes, max_session_bytes }
end
local delta = new_bytes - bytes
if delta > 0 then
  local aggregate = tonumber(rcall('HGET', meta_key, 'bytes') or '0')
  if aggregate + delta > max_aggregate then
    return { -3, 'aggregate', aggregate + delta, max_aggregate }
  end
end

rcall('LTRIM', t_key, fold_n, -1)
-- Receipts of the folded turns still in the id window (at most fold_n, one HSET).
local ids = rcall('ZRANGE', i_key, first_seq, last_seq, 'BYSCORE', 'WITHSCORES')
local receipts = {}
for j = 1, #ids, 2 do
  local value = receipt_of[tonumber(ids[j + 1])]
  if value then
    receipts[#receipts + 1] = 'r:' .. ids[j]
    receipts[#receipts + 1] = value
  end
end
if #receipts > 0 then
  for j = 1, #receipts, 1000 do -- well under Lua's unpack limit
    rcall('HSET', s_key, unpack(receipts, j, math.min(j + 999, #receipts)))
  end
end
local new_turns = turns - fold_n
local new_tools = tools - removed_tools
rcall('HSET', s_key, 'summary_bytes', summary_bytes, 'sv', sv + 1,
  'bytes', new_bytes, 'turns', new_turns, 'tools', new_tools)
if summary == '' then
  rcall('HDEL', s_key, 'summary')
else
  rcall('HSET', s_key, 'summary', summary)
end
clear_queued()
rcall('HSET', index_key, member, new_bytes)
if delta ~= 0 then
  rcall('HINCRBY', meta_key, 'bytes', delta)
end
memtier_emit(events_key, max_events, 'compacted', member, session_id, now, wall,
  'folded=' .. fold_n .. ' seq=' .. first_seq .. '-' .. last_seq)
ack()
return { 0, fold_n, removed_bytes, removed_tools, new_bytes, new_turns, sv + 1 }
