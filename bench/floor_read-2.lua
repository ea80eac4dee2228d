--[[
  Benchmark floor only (never used by memtier): the Redis commands a context(limit=20) read
  with memtier's semantics cannot do without -- the expiry check atomic with the read --
  and no Lua logic around them.  Run from redis-benchmark (a C client), it is the floor of
  the server cost of a read (the turns pass through Lua here, as they do in memtier's
  read_context; a MULTI/EXEC of the same commands would avoid that copy).

  Input:
    KEYS[1] session    session hash  {f}:s:<session>  fields id, last (ms)
    KEYS[2] turns      turns list    {f}:r:<session>
    ARGV[1] ttl_ms     inactivity TTL, ms
    ARGV[2] limit      newest turns to return

  Output: the newest ARGV[2] turns, oldest first (array of bulk strings); an empty array
  when the session is absent or expired.

  Side effects: none (TIME, HMGET session, LRANGE).
]]
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = rcall('HMGET', KEYS[1], 'id', 'last')
if not h[1] or now >= tonumber(h[2]) + tonumber(ARGV[1]) then return {} end
return rcall('LRANGE', KEYS[2], -tonumber(ARGV[2]), -1)
