#!lua
--[[
  Close a failed or cancelled turn: one terminal row on the ledger ("error" or "cancelled"),
  the run record removed -- or, for a cancelled turn, replaced by a "cancelled" record -- (so
  the same request id may run again, as a new run), the lease released.  No entries are
  written.

  Input:
    KEYS[1] thread      thread hash T:t:<thread_id>
    KEYS[2] runs        runs hash T:r:<thread_id>
    KEYS[3] lease       lease string T:l:<thread_id>
    KEYS[4] events      events stream T:v:<thread_id>
    ARGV[1] marker      thread marker
    ARGV[2] token       the run's token (must hold the lease)
    ARGV[3] request_id  the run's request id
    ARGV[4] now_ms      wall clock, ms
    ARGV[5] type        closing event type ("error" or "cancelled")
    ARGV[6] data        its data JSON (redacted, bounded)
    ARGV[7] record      "" = delete the run record; else the record JSON to store
                        ({"s":"cancelled",...}: what run_cancel and run_claim read)
    ARGV[8] usage       shared run-limit consumption JSON ("" = none): what the turn used
                        is charged even though it commits nothing

  Output:
    { 0 }    OK: closed
    { -1 }   NOT_FOUND: the thread was deleted meanwhile (nothing written)
    { -10 }  LEASE_LOST: this run no longer holds the thread (nothing written)
                        (a lease marked cancelled by run_cancel still counts as this run's)

  Side effects: one ledger row; run record deleted; lease deleted.

  Ownership: this script writes only for the holder of the lease token, which run_claim
  hands out after checking the row's stored owner (thread_owned), so it cannot write a row
  whose owner differs.
]]
--- @include "thread_common"

local thread_key, runs_key, lease_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local marker, token, request_id, now_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local etype, data, final_record = ARGV[5], ARGV[6], ARGV[7] or ''
if not thread_int(now_ms) or etype == '' then
  return redis.error_reply('memtier: run_abort: malformed ARGV')
end
if not thread_live(thread_key, marker) then
  return { -1 }
end
if thread_lease_state(lease_key, token) == 'lost' then
  return { -10 }
end
thread_xadd(events_key, now_ms, etype, data, request_id)
rcall('HINCRBY', thread_key, 'bytes', #etype + #data)
thread_charge(thread_key, ARGV[8])
local rec = thread_run_record(runs_key, request_id)
if rec and rec.tok == token then
  if final_record == '' then
    rcall('HDEL', runs_key, request_id)
  else
    rcall('HSET', runs_key, request_id, final_record)
  end
end
rcall('DEL', lease_key)
return { 0 }
