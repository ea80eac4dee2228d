#!lua
--[[
  Append a batch of redacted events of a running turn to the thread's ledger.

  Input:
    KEYS[1] thread       thread hash T:t:<thread_id>
    KEYS[2] events       events stream T:v:<thread_id>
    KEYS[3] lease        lease string T:l:<thread_id>
    ARGV[1] marker       thread marker
    ARGV[2] token        the run's token (must hold the lease)
    ARGV[3] seq          batch number within the run, 1, 2, ... (replays are dropped)
    ARGV[4] lease_ms     lease extension, ms
    ARGV[5] now_ms       wall clock, ms (row ids: see thread_xadd)
    ARGV[6] request_id   the run's request id (stored on each row)
    ARGV[7] n_events     number of events in this batch
    then n_events pairs  type, data JSON (already redacted and bounded)

  Output:
    { 0, last_id }  OK: appended (last_id = "" when n_events = 0)
    { 1 }           EXISTED: batch seq already applied (a retried call); nothing added
    { -1 }          NOT_FOUND (deleted: never re-creates the ledger)
    { -10 }         LEASE_LOST: this run no longer holds the thread
    { -11 }         CANCELLED: the run was cancelled (nothing added)

  Side effects: n stream rows (capacity reserved by run_claim); bytes counter; lease PEXPIRE.

  Ownership: this script writes only for the holder of the lease token, which run_claim
  hands out after checking the row's stored owner (thread_owned), so it cannot write a row
  whose owner differs.
]]
--- @include "thread_common"

local thread_key, events_key, lease_key = KEYS[1], KEYS[2], KEYS[3]
local marker, token = ARGV[1], ARGV[2]
local seq, lease_ms, now_ms = thread_int(ARGV[3]), thread_int(ARGV[4]), ARGV[5]
local request_id = ARGV[6]
local n = thread_int(ARGV[7])
if not (seq and lease_ms and n and thread_int(now_ms)) or #ARGV ~= 7 + 2 * n then
  return redis.error_reply('memtier: events_append: malformed ARGV')
end
-- One read of the thread hash: the marker (live), the batch number and the bytes counter.
local thread = rcall('HMGET', thread_key, 'marker', 'eseq', 'bytes')
if thread[1] ~= marker then
  return { -1 }
end
local lease = thread_lease_state(lease_key, token)
if lease == 'cancelled' then
  return { -11 }
elseif lease == 'lost' then
  return { -10 }
end
if seq <= tonumber(thread[2]) then
  return { 1 }
end
local last_id, added = '', 0
for i = 0, n - 1 do
  local etype, data = ARGV[8 + 2 * i], ARGV[9 + 2 * i]
  last_id = thread_xadd(events_key, now_ms, etype, data, request_id)
  added = added + #etype + #data
end
-- (The counter as read plus this batch: what HINCRBY would store, in the same write.)
rcall('HSET', thread_key, 'eseq', seq, 'bytes', (tonumber(thread[3]) or 0) + added)
rcall('PEXPIRE', lease_key, lease_ms)
return { 0, last_id }
