#!lua
--[[
  The restore gate of one namespace: several workers start at once, exactly one restores.
  A lock with a random token and an expiry (PX) elects the restorer; a state hash records
  that the namespace was initialised (restored, or found live, or started empty), so a
  later start does not restore again. Redis losing its data loses the state too: then
  the next start restores, and running processes notice (see "epoch").

  The state's `epoch` is a random id written once, when the hash is created (begin or
  finish of the first restorer after Redis lost its data, or ever). A running process
  remembers the epoch it saw; the hash missing, or holding another epoch, means the
  state was created again: Redis lost its data under that process. A loss that a fresh
  start found as live data (outcome "live" with an epoch the caller did not see) is not
  handled yet: `acquire` with ARGV[8] = that epoch takes the gate again for it.

  Input:
    KEYS[1] lock        {<ns>:m:restore}:lock    STRING token, PX expiry
    KEYS[2] state       {<ns>:m:restore}:state   hash: status ("restoring" | "done"),
                                                 generation, outcome, wall ms, epoch
    ARGV[1] op          "acquire" | "begin" | "extend" | "finish"
    ARGV[2] token       random per restorer
    ARGV[3] lock_ms     lock expiry, ms (acquire, begin, extend)
    ARGV[4] generation  generation being restored ("" = none; begin, finish)
    ARGV[5] outcome     finish: "restored" | "live" | "empty" | ...
    ARGV[6] force       acquire: "1" = ignore a finished state (operator restore)
    ARGV[7] epoch       begin, finish: the epoch to record if the state has none yet
    ARGV[8] unhandled   acquire: an epoch whose "live" outcome hid a data loss ("" = none)

  Output (negative = refused, zero = done, positive = a variant: GateStatus in
  memtier/memory/restorestatus.py):
    OK           0   acquire: { 0, status, generation } the gate is the caller's (status ""
                     or "restoring": a restorer died midway; continue its work);
                     begin / extend: { 0 }; finish: { 0, epoch } (the state's epoch)
    INITIALISED  1   acquire: { 1, generation, outcome, epoch } the namespace was
                     initialised already
    LOST        -1   begin / extend / finish: { -1 } the lock is no longer the caller's
    BUSY        -2   acquire: { -2 } another worker holds the lock

  Side effects: the lock key (SET NX PX / PEXPIRE / DEL); the state hash (no TTL).
]]
local rcall = redis.call
local lock_key, state_key = KEYS[1], KEYS[2]
local op, token = ARGV[1], ARGV[2]
local lock_ms = tonumber(ARGV[3])
local generation, outcome, force = ARGV[4], ARGV[5], ARGV[6]
local epoch, unhandled = ARGV[7] or '', ARGV[8] or ''
if token == '' or not lock_ms or lock_ms <= 0 then
  return redis.error_reply('memtier: restore_gate: malformed ARGV')
end

local function wall_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function record_epoch()
  if epoch ~= '' then rcall('HSETNX', state_key, 'epoch', epoch) end
end

if op == 'acquire' then
  local status = rcall('HGET', state_key, 'status')
  if status == 'done' and force ~= '1' then
    local state_epoch = rcall('HGET', state_key, 'epoch') or ''
    local state_outcome = rcall('HGET', state_key, 'outcome') or ''
    if not (unhandled ~= '' and state_epoch == unhandled and state_outcome == 'live') then
      return { 1, rcall('HGET', state_key, 'generation') or '', state_outcome, state_epoch }
    end
  end
  if rcall('SET', lock_key, token, 'NX', 'PX', lock_ms) or rcall('GET', lock_key) == token then
    rcall('PEXPIRE', lock_key, lock_ms)
    if status == 'done' then status = '' end
    return { 0, status or '', rcall('HGET', state_key, 'generation') or '' }
  end
  return { -2 }
end

if rcall('GET', lock_key) ~= token then
  return { -1 }
end
if op == 'begin' then
  rcall('PEXPIRE', lock_key, lock_ms)
  rcall('HSET', state_key, 'status', 'restoring', 'generation', generation, 'wall', wall_ms())
  record_epoch()
  return { 0 }
elseif op == 'extend' then
  rcall('PEXPIRE', lock_key, lock_ms)
  return { 0 }
elseif op == 'finish' then
  rcall('HSET', state_key, 'status', 'done', 'generation', generation, 'outcome', outcome,
    'wall', wall_ms())
  record_epoch()
  rcall('DEL', lock_key)
  return { 0, rcall('HGET', state_key, 'epoch') or '' }
end
return redis.error_reply('memtier: restore_gate: unknown op')
