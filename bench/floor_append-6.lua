--[[
  Benchmark floor only (never used by memtier): the Redis commands an append with memtier's
  semantics cannot do without, on the success path of an append to a live session, with no
  Lua logic around them (no argument checks, no bounds arithmetic, no sweep, no events).
  Run from redis-benchmark (a C client), it is the floor of the server cost of an append.

  Input:
    KEYS[1] session    session hash  {f}:s:<session>  fields last, turns, bytes, r:<turn id>
    KEYS[2] turns      turns list    {f}:t:<session>
    KEYS[3] turn_ids   turn-id zset  {f}:i:<session>  turn id -> sequence
    KEYS[4] lru        lru zset      {f}:lru          member -> last activity
    KEYS[5] index      index hash    {f}:ix           member -> session bytes
    KEYS[6] meta       meta hash     {f}:meta         clock, bytes
    ARGV[1] turn_id    idempotency key
    ARGV[2] payload    the stored record (bytes)
    ARGV[3] member     the session's name in the LRU and the index

  Output: the new sequence number (integer), or the first one for a duplicate turn id.

  Side effects: TIME (expiry clock), HMGET meta (clock, aggregate bytes: the ceiling),
  HMGET session (existence, expiry, counters and the idempotency receipt in one read),
  RPUSH, ZADD turn_ids, HSET session, HSET meta, HSET index, ZADD lru.  Left out because
  memtier amortises them: PEXPIRE (refreshed every ttl_refresh_ms), the id-window trim, the
  sweep, events and compaction jobs (only when something happens).
]]
local rcall = redis.call
local s_key, t_key, i_key, lru_key, ix_key, meta_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local turn_id, payload, member = ARGV[1], ARGV[2], ARGV[3]

local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local m = rcall('HMGET', meta_key, 'clock', 'bytes')
local h = rcall('HMGET', s_key, 'last', 'turns', 'bytes', 'r:' .. turn_id)
if h[4] then return tonumber(h[4]) end
local seq = tonumber(h[2] or '0') + 1
local bytes = tonumber(h[3] or '0') + #payload
rcall('RPUSH', t_key, payload)
rcall('ZADD', i_key, seq, turn_id)
rcall('HSET', s_key, 'last', now, 'turns', seq, 'bytes', bytes, 'r:' .. turn_id, seq)
rcall('HSET', meta_key, 'clock', now, 'bytes', tonumber(m[2] or '0') + #payload)
rcall('HSET', ix_key, member, bytes)
rcall('ZADD', lru_key, now, member)
return seq
