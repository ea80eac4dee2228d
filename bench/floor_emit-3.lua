--[[
  Benchmark floor only (never used by memtier): the Redis commands events_append cannot do
  without for one runner event of a running turn, with no Lua logic (see floor_claim-6.lua).

  Input:
    KEYS[1] thread  thread hash   T:t:<id>
    KEYS[2] events  events stream T:v:<id>
    KEYS[3] lease   lease string  T:l:<id>
    ARGV[1] request_id   the run's request id
    ARGV[2] type         event type
    ARGV[3] data         event data JSON (redacted)

  Output: the new row's id.

  Side effects: HMGET thread (live, batch number), GET lease (the run holds it), XADD,
  HSET eseq, HINCRBY bytes, PEXPIRE lease.
]]
local rcall = redis.call
local thread, events, lease = KEYS[1], KEYS[2], KEYS[3]
local request_id, etype, data = ARGV[1], ARGV[2], ARGV[3]

rcall('HMGET', thread, 'marker', 'eseq')
rcall('GET', lease)
local id = rcall('XADD', events, '*', 'type', etype, 'data', data, 'run', request_id)
rcall('HSET', thread, 'eseq', 2)
rcall('HINCRBY', thread, 'bytes', #etype + #data)
rcall('PEXPIRE', lease, 30000)
return id
