#!lua flags=no-writes
--[[
  Live sessions and stored bytes of one partition (for metrics and operators).

  Input:
    KEYS[1] lru_public lru zset   T:lru:public
    KEYS[2] lru_im     lru zset   T:lru:im
    KEYS[3] meta       meta hash  T:meta
    KEYS[4] index      index hash T:ix

  Output:
    { sessions, bytes, indexed }  indexed = entries in the index hash (equals sessions
        unless a sweep is pending)

  Side effects: none.
]]
local rcall = redis.call
return { rcall('ZCARD', KEYS[1]) + rcall('ZCARD', KEYS[2]),
  tonumber(rcall('HGET', KEYS[3], 'bytes') or '0'), rcall('HLEN', KEYS[4]) }
