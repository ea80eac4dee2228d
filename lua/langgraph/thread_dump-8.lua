#!lua flags=no-writes
--[[
  Read everything one LangGraph thread stores, at one point in time (copy_thread).
  Read-only.

  Input:
    KEYS[1..8] the thread's keys, as in checkpoint_write-8.lua
    (no ARGV)

  Output:
    { HGETALL G:ck, HGETALL G:v, HGETALL G:b, HGETALL G:w, ZRANGE G:wz, ZRANGE G:rz }
    each a flat array (field, value, ... for hashes; members for the zsets)
]]
local rcall = redis.call
return {
  rcall('HGETALL', KEYS[3]),
  rcall('HGETALL', KEYS[4]),
  rcall('HGETALL', KEYS[5]),
  rcall('HGETALL', KEYS[6]),
  rcall('ZRANGE', KEYS[7], 0, -1),
  rcall('ZRANGE', KEYS[8], 0, -1),
}
