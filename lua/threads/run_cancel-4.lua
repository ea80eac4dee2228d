#!lua
--[[
  Cancel one run of a thread by its request id (the caller's DELETE .../runs/<requestId>).
  Idempotent: cancelling again answers the same way, and never touches a finished run.

  Input:
    KEYS[1] thread      thread hash T:t:<thread_id>
    KEYS[2] runs        runs hash T:r:<thread_id>
    KEYS[3] lease       lease string T:l:<thread_id>
    KEYS[4] events      events stream T:v:<thread_id>
    ARGV[1] marker      thread marker
    ARGV[2] request_id  the run to cancel
    ARGV[3] tenant      owner tenant id (checked against the row before any write)
    ARGV[4] user        owner user id
    ARGV[5] now_ms      wall clock, ms
    ARGV[6] data        data JSON of the "cancelled" row written for an abandoned run

  Output:
    { -1 }             NOT_FOUND: no such thread for this owner, or no such run
    { 0 }              OK: cancelling: the run is running; its lease is marked "<token>:cancel"
                       (its heartbeat, emits and commit see CANCELLED; it closes the ledger)
    { 2 }              ENDED_CANCELLED: the run already ended cancelled (or was abandoned by a dead
                       process: this call closed it with a "cancelled" row)
    { 3, status }      DONE: the run finished before ("completed" | "denied"); unchanged

  Side effects: the lease value (same expiry); for an abandoned run a "cancelled" record
  and, when no other run holds the thread, a "cancelled" ledger row.
]]
--- @include "thread_common"

local thread_key, runs_key, lease_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local marker, request_id, tenant, user = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now_ms, data = ARGV[5], ARGV[6]
if not thread_int(now_ms) or request_id == '' then
  return redis.error_reply('memtier: run_cancel: malformed ARGV')
end
if not thread_owned(thread_key, marker, tenant, user) then
  return { -1 }
end
local rec = thread_run_record(runs_key, request_id)
if not rec then
  return { -1 }
end
if rec.s == 'done' then
  local status = 'completed'
  if type(rec.res) == 'table' and rec.res.status then
    status = rec.res.status
  end
  return { 3, status }
end
if rec.s == 'cancelled' then
  return { 2 }
end
local holder = rcall('GET', lease_key)
if holder == rec.tok .. ':cancel' then
  return { 0 }
end
if holder == rec.tok then
  local ttl = rcall('PTTL', lease_key)
  if ttl > 0 then
    rcall('SET', lease_key, rec.tok .. ':cancel', 'PX', ttl)
    return { 0 }
  end
end
-- Abandoned: its process died and the lease expired (or another run holds the thread).
rcall('HSET', runs_key, request_id,
  cjson.encode({ s = 'cancelled', tok = rec.tok, fp = rec.fp, at = tonumber(now_ms) }))
if not holder then
  thread_xadd(events_key, now_ms, 'cancelled', data, request_id)
  rcall('HINCRBY', thread_key, 'bytes', #data + 9)
end
return { 2 }
