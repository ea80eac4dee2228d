#!lua
--[[
  Close a failed turn: one terminal error row on the ledger, the run record removed (so the
  same request id may run again), the lease released.  No entries are written.

  Input:
    KEYS[1] thread hash    T:t:<thread_id>
    KEYS[2] runs hash      T:r:<thread_id>
    KEYS[3] lease string   T:l:<thread_id>
    KEYS[4] events stream  T:v:<thread_id>
    ARGV[1] marker      thread marker
    ARGV[2] token       the run's token (must hold the lease)
    ARGV[3] request_id  the run's request id
    ARGV[4] now_ms      wall clock, ms
    ARGV[5] type        closing event type ("error")
    ARGV[6] data        its data JSON (redacted, bounded)

  Output:
    { 0 }    closed
    { -1 }   NOT_FOUND: the thread was deleted meanwhile (nothing written)
    { -10 }  LEASE_LOST: this run no longer holds the thread (nothing written)

  Side effects: one ledger row; run record deleted; lease deleted.

  Ownership: this script writes only for the holder of the lease token, which run_claim
  hands out after checking the row's stored owner (thread_owned), so it cannot write a row
  whose owner differs.
]]
--- @include "thread_common"

local thread_key, runs_key, lease_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local marker, token, request_id, now_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local etype, data = ARGV[5], ARGV[6]
if not thread_int(now_ms) or etype == '' then
  return redis.error_reply('memtier: run_abort: malformed ARGV')
end
if not thread_live(thread_key, marker) then
  return { -1 }
end
if rcall('GET', lease_key) ~= token then
  return { -10 }
end
thread_xadd(events_key, now_ms, etype, data, request_id)
rcall('HINCRBY', thread_key, 'bytes', #etype + #data)
local rec = thread_run_record(runs_key, request_id)
if rec and rec.tok == token then
  rcall('HDEL', runs_key, request_id)
end
rcall('DEL', lease_key)
return { 0 }
