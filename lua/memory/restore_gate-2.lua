#!lua
--[[
  The restore gate of one namespace: several workers start at once, exactly one restores.
  A lock with a random token and an expiry (PX) elects the restorer; a state hash records
  that the namespace was initialised (restored, or found live, or started empty), so a
  later start does not restore again. Redis losing its data loses the state too: then
  the next start restores.

  Input:
    KEYS[1] lock        {<ns>:m:restore}:lock    STRING token, PX expiry
    KEYS[2] state hash  {<ns>:m:restore}:state   status ("restoring" | "done"), generation,
                                                 outcome, wall ms
    ARGV[1] op          "acquire" | "begin" | "extend" | "finish"
    ARGV[2] token       random per restorer
    ARGV[3] lock_ms     lock expiry, ms (acquire, begin, extend)
    ARGV[4] generation  generation being restored ("" = none; begin, finish)
    ARGV[5] outcome     finish: "restored" | "live" | "empty" | ...
    ARGV[6] force       acquire: "1" = ignore a finished state (operator restore)

  Output:
    acquire: { 1, status, generation }  ACQUIRED (status "" or "restoring": a restorer died
                                        midway; continue its work)
             { 0 }                       BUSY: another worker holds the lock
             { 2, generation, outcome }  DONE: the namespace was initialised already
    begin / extend / finish: { 1 } OK, { -1 } LOST: the lock is no longer ours

  Side effects: the lock key (SET NX PX / PEXPIRE / DEL); the state hash (no TTL).
]]
local rcall = redis.call
local lock_key, state_key = KEYS[1], KEYS[2]
local op, token = ARGV[1], ARGV[2]
local lock_ms = tonumber(ARGV[3])
local generation, outcome, force = ARGV[4], ARGV[5], ARGV[6]
if token == '' or not lock_ms or lock_ms <= 0 then
  return redis.error_reply('memtier: restore_gate: malformed ARGV')
end

local function wall_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

if op == 'acquire' then
  local status = rcall('HGET', state_key, 'status')
  if status == 'done' and force ~= '1' then
    return { 2, rcall('HGET', state_key, 'generation') or '',
      rcall('HGET', state_key, 'outcome') or '' }
  end
  if rcall('SET', lock_key, token, 'NX', 'PX', lock_ms) or rcall('GET', lock_key) == token then
    rcall('PEXPIRE', lock_key, lock_ms)
    if status == 'done' then status = '' end
    return { 1, status or '', rcall('HGET', state_key, 'generation') or '' }
  end
  return { 0 }
end

if rcall('GET', lock_key) ~= token then
  return { -1 }
end
if op == 'begin' then
  rcall('PEXPIRE', lock_key, lock_ms)
  rcall('HSET', state_key, 'status', 'restoring', 'generation', generation, 'wall', wall_ms())
  return { 1 }
elseif op == 'extend' then
  rcall('PEXPIRE', lock_key, lock_ms)
  return { 1 }
elseif op == 'finish' then
  rcall('HSET', state_key, 'status', 'done', 'generation', generation, 'outcome', outcome,
    'wall', wall_ms())
  rcall('DEL', lock_key)
  return { 1 }
end
return redis.error_reply('memtier: restore_gate: unknown op')
