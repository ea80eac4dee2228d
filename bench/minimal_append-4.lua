--[[
  Benchmark baseline only (never used by memtier): the least an append to a session can do
  on Redis -- sequence, store, account bytes, touch the LRU -- in one script call.

  Input:
    KEYS[1] sequence counter  {b}:q:<session>   STRING
    KEYS[2] turns list        {b}:t:<session>   LIST
    KEYS[3] meta hash         {b}:meta          HASH   field "bytes"
    KEYS[4] lru zset          {b}:lru           ZSET   member -> sequence
    ARGV[1] payload           the turn text (bytes)
    ARGV[2] member            the session's name in the LRU

  Output: the new sequence number (integer).

  Side effects: INCR, RPUSH, HINCRBY, ZADD -- nothing else (no TTL, no bounds, no dedupe).
]]
local rcall = redis.call
local seq_key, turns_key, meta_key, lru_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local payload, member = ARGV[1], ARGV[2]

local seq = rcall('INCR', seq_key)
rcall('RPUSH', turns_key, payload)
rcall('HINCRBY', meta_key, 'bytes', #payload)
rcall('ZADD', lru_key, seq, member)
return seq
