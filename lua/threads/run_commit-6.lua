#!lua
--[[
  Record a finished turn: its entries, its closing events and its run result, atomically,
  then release the thread lease.

  Input:
    KEYS[1] thread    thread hash T:t:<thread_id>
    KEYS[2] entries   entries hash T:e:<thread_id>: entry id -> entry JSON
    KEYS[3] parents   parents hash T:p:<thread_id>: entry id -> parent id
    KEYS[4] runs      runs hash T:r:<thread_id>
    KEYS[5] lease     lease string T:l:<thread_id>
    KEYS[6] events    events stream T:v:<thread_id>
    ARGV[1] marker          thread marker
    ARGV[2] token           the run's token (must hold the lease)
    ARGV[3] request_id      the run's request id
    ARGV[4] now_ms          wall clock, ms
    ARGV[5] expected_count  entries count seen by run_claim (nothing else was committed since)
    ARGV[6] new_head        "" = head unchanged; else the turn's last entry
    ARGV[7] done_record     run record JSON {"s":"done","tok":...,"fp":...,"res":{...}}
    ARGV[8] n_entries       entries of this turn
    ARGV[9] n_events        closing events of this turn
    ARGV[10] usage          shared run-limit consumption JSON {"<meter>": n} ("" = none),
                            added to the thread's "use.<meter>" counters
    then n_entries triples  id, parent id, entry JSON (redacted, bounded)
    then n_events pairs     type, data JSON (redacted, bounded)

  Output:
    { 0 }    OK: committed
    { 3 }    DONE: already committed by this token (a retried call); nothing changed
    { -1 }   NOT_FOUND: the thread was deleted meanwhile (delete wins; nothing written)
    { -10 }  LEASE_LOST: the lease expired and another run took the thread
    { -11 }  CANCELLED: the run was cancelled: nothing is committed (it closes with run_abort)

  Side effects: entries, parents, head, entries count, bytes, updated, ledger rows,
  run record; the lease is deleted; the parents hash's path cache ("~path") extended to
  new_head when the turn's entries are a chain off its leaf (or off the root).

  Ownership: this script writes only for the holder of the lease token, which run_claim
  hands out after checking the row's stored owner (thread_owned), so it cannot write a row
  whose owner differs.
]]
--- @include "thread_common"

local thread_key, entries_key, parents_key, runs_key, lease_key, events_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local marker, token, request_id, now_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local expected_count = thread_int(ARGV[5])
local new_head, done_record = ARGV[6], ARGV[7]
local n_entries, n_events = thread_int(ARGV[8]), thread_int(ARGV[9])
local usage = ARGV[10]
if not (expected_count and n_entries and n_events and thread_int(now_ms))
    or #ARGV ~= 10 + 3 * n_entries + 2 * n_events then
  return redis.error_reply('memtier: run_commit: malformed ARGV')
end

-- One read of the thread hash: the marker (live), the entry count and the bytes counter.
local thread = rcall('HMGET', thread_key, 'marker', 'entries', 'bytes')
if thread[1] ~= marker then
  return { -1 }
end
-- The lease first: while this run's token holds it, this run has not committed (a commit
-- deletes the lease with the same call, and no later claim hands out this token again),
-- so the run record needs no read or decode on the common path.  Otherwise a retried
-- commit whose first call went through finds its own done record.
local lease = thread_lease_state(lease_key, token)
if lease ~= 'held' then
  local rec = thread_run_record(runs_key, request_id)
  if rec and rec.s == 'done' and rec.tok == token then
    return { 3 }
  end
end
if lease == 'cancelled' then
  return { -11 }
elseif lease == 'lost' then
  return { -10 }
end
if tonumber(thread[2]) ~= expected_count then
  return { -10 }
end

local added = 0
-- The path cache (see thread_path_ends_at): when this turn's entries hang off the cached
-- path's leaf (or off the root), as a chain, the new head's path is the cache plus them.
local cached = nil
if n_entries > 0 and new_head ~= '' then
  local parent = ARGV[12]
  if parent == '' then
    cached = ''
  else
    cached = rcall('HGET', parents_key, THREAD_PATH_FIELD)
    if cached and not thread_path_ends_at(cached, parent) then
      cached = nil
    end
  end
end
-- The turn's entries and parents go in one HSET each (fields in turn order: a repeated
-- id keeps its last value, as one HSET per entry would).
local entry_args, parent_args = {}, {}
local tip = ARGV[12]
for i = 0, n_entries - 1 do
  local id, parent, entry = ARGV[11 + 3 * i], ARGV[12 + 3 * i], ARGV[13 + 3 * i]
  entry_args[2 * i + 1], entry_args[2 * i + 2] = id, entry
  parent_args[2 * i + 1], parent_args[2 * i + 2] = id, parent
  added = added + #entry
  if cached and parent == tip then
    cached = (cached == '' and id) or (cached .. ' ' .. id)
    tip = id
  else
    cached = nil
  end
end
if n_entries > 0 then
  rcall('HSET', entries_key, unpack(entry_args))
  if cached and tip == new_head then
    parent_args[2 * n_entries + 1], parent_args[2 * n_entries + 2] = THREAD_PATH_FIELD, cached
  end
  rcall('HSET', parents_key, unpack(parent_args))
end
local base = 11 + 3 * n_entries
for i = 0, n_events - 1 do
  local etype, data = ARGV[base + 2 * i], ARGV[base + 1 + 2 * i]
  thread_xadd(events_key, now_ms, etype, data, request_id)
  added = added + #etype + #data
end
-- (The bytes counter as read plus this turn's: what HINCRBY would store, in one HSET.)
local bytes = (tonumber(thread[3]) or 0) + added
if new_head ~= '' then
  rcall('HSET', thread_key, 'entries', expected_count + n_entries, 'updated', now_ms,
    'head', new_head, 'bytes', bytes)
else
  rcall('HSET', thread_key, 'entries', expected_count + n_entries, 'updated', now_ms,
    'bytes', bytes)
end
thread_charge(thread_key, usage)
rcall('HSET', runs_key, request_id, done_record)
rcall('DEL', lease_key)
return { 0 }
