--[[
  Benchmark floor only (never used by memtier): the Redis commands run_commit cannot do
  without for a completed turn (two entries, two closing rows), with no Lua logic (see
  floor_claim-6.lua).

  Input:
    KEYS[1] thread   thread hash   T:t:<id>
    KEYS[2] entries  entries hash  T:e:<id>
    KEYS[3] parents  parents hash  T:p:<id>
    KEYS[4] runs     runs hash     T:r:<id>
    KEYS[5] lease    lease string  T:l:<id>
    KEYS[6] events   events stream T:v:<id>
    ARGV[1]  request_id    the run's request id
    ARGV[2]  done_record   run record JSON
    ARGV[3]  user_id       ARGV[4] base      ARGV[5] user entry JSON
    ARGV[6]  asst_id       ARGV[7] asst entry JSON
    ARGV[8]  path          the new head's path (memtier extends the cached one)
    ARGV[9]  reply_row     assistant_message row data
    ARGV[10] finished_row  agent_finished row data

  Output: 0

  Side effects: HMGET thread (live, entries count), HGET runs (a retried commit), GET lease,
  HSET entries x2 fields, HSET parents (2 fields + "~path"), XADD x2, HSET thread (entries,
  updated, head), HINCRBY bytes, HSET runs, DEL lease.
]]
local rcall = redis.call
local thread, entries, parents, runs, lease, events =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local request_id, done = ARGV[1], ARGV[2]
local user_id, base, user, asst_id, asst = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local path, reply_row, finished_row = ARGV[8], ARGV[9], ARGV[10]

rcall('HMGET', thread, 'marker', 'entries')
rcall('HGET', runs, request_id)
rcall('GET', lease)
rcall('HSET', entries, user_id, user, asst_id, asst)
rcall('HSET', parents, user_id, base, asst_id, user_id, '~path', path)
rcall('XADD', events, '*', 'type', 'assistant_message', 'data', reply_row, 'run', request_id)
rcall('XADD', events, '*', 'type', 'agent_finished', 'data', finished_row, 'run', request_id)
rcall('HSET', thread, 'entries', 42, 'updated', 1700000000000, 'head', asst_id)
rcall('HINCRBY', thread, 'bytes', #user + #asst + #reply_row + #finished_row)
rcall('HSET', runs, request_id, done)
rcall('DEL', lease)
return 0
