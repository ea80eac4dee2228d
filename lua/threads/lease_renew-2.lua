#!lua
--[[
  Heartbeat of a running turn: extend the thread lease while the runner works.

  Input:
    KEYS[1] thread     thread hash T:t:<thread_id>
    KEYS[2] lease      lease string T:l:<thread_id>
    ARGV[1] marker     thread marker
    ARGV[2] token      the run's token
    ARGV[3] lease_ms   new lease duration from now, ms

  Output:
    { 0 }    OK: renewed
    { -1 }   NOT_FOUND (the thread was deleted)
    { -10 }  LEASE_LOST: another token holds the lease, or it expired
    { -11 }  CANCELLED: run_cancel marked this run (the lease is left as it is)

  Side effects: PEXPIRE of the lease.

  Ownership: this script writes only for the holder of the lease token, which run_claim
  hands out after checking the row's stored owner (thread_owned), so it cannot write a row
  whose owner differs.
]]
--- @include "thread_common"

local thread_key, lease_key = KEYS[1], KEYS[2]
local marker, token = ARGV[1], ARGV[2]
local lease_ms = thread_int(ARGV[3])
if not lease_ms or lease_ms == 0 then
  return redis.error_reply('memtier: lease_renew: malformed ARGV')
end
if not thread_live(thread_key, marker) then
  return { -1 }
end
local lease = thread_lease_state(lease_key, token)
if lease == 'cancelled' then
  return { -11 }
elseif lease == 'lost' then
  return { -10 }
end
rcall('PEXPIRE', lease_key, lease_ms)
return { 0 }
