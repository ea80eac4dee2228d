--[[
  Benchmark floor only (never used by memtier): the Redis commands run_claim cannot do
  without on the success path of a continue on the head of a live thread, with no Lua logic
  around them (no argument checks, no caps arithmetic, no branch lookup, no replay
  handling).  With floor_emit-3.lua and floor_commit-6.lua, run from redis-benchmark (a C
  client), it is the floor of the server cost of one continue.

  Input:
    KEYS[1] thread   thread hash   T:t:<id>
    KEYS[2] runs     runs hash     T:r:<id>
    KEYS[3] lease    lease string  T:l:<id>
    KEYS[4] parents  parents hash  T:p:<id> (the cached path "~path")
    KEYS[5] events   events stream T:v:<id>
    KEYS[6] entries  entries hash  T:e:<id>
    ARGV[1] request_id   idempotency key
    ARGV[2] token        lease token
    ARGV[3] record       run record JSON
    ARGV[4] started      agent_started row data
    ARGV[5] message      user_message row data (the redacted message)
    ARGV[6..] ids        the history entries the client does not hold yet, root first: on
                         the head after its own last turn, that turn's two (memtier's
                         run_claim reads the path from "~path" and skips the prefix the
                         client names)

  Output: { thread hash (HGETALL), history entries (HMGET) }

  Side effects: HMGET thread (owner, state, head, counters in one read), GET lease, HGET
  runs (idempotency), XLEN (ledger cap), HGET parents "~path", SET lease PX, HSET runs,
  XADD x2 (the opening rows), HINCRBY eidseq, HSET eseq, HINCRBY bytes, HGETALL thread,
  HMGET entries.
]]
local rcall = redis.call
local thread, runs, lease, parents, events, entries =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local request_id, token, record, started, message = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

rcall('HMGET', thread, 'marker', 'tenant', 'user', 'state', 'branches', 'head', 'entries',
  'bytes', 'eidseq')
rcall('GET', lease)
rcall('HGET', runs, request_id)
rcall('XLEN', events)
rcall('HGET', parents, '~path')
rcall('SET', lease, token, 'PX', 30000)
rcall('HSET', runs, request_id, record)
rcall('XADD', events, '*', 'type', 'agent_started', 'data', started, 'run', request_id)
rcall('XADD', events, '*', 'type', 'user_message', 'data', message, 'run', request_id)
rcall('HINCRBY', thread, 'eidseq', 2)
rcall('HSET', thread, 'eseq', 1)
rcall('HINCRBY', thread, 'bytes', #started + #message)
return { rcall('HGETALL', thread), rcall('HMGET', entries, unpack(ARGV, 6)) }
