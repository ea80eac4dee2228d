#!lua flags=no-writes
--[[
  Read everything one LangGraph thread stores, at one point in time (copy_thread).
  Read-only.

  Input:
    KEYS[1] state        G:s    state hash: tid, bytes, checkpoints, writes
    KEYS[2] index        G:z    checkpoint index, ZSET, lex
    KEYS[3] checkpoints  G:ck   checkpoints HASH
    KEYS[4] versions     G:v    versions HASH
    KEYS[5] blobs        G:b    blobs HASH
    KEYS[6] writes       G:w    writes HASH
    KEYS[7] write_index  G:wz   write index, ZSET, lex
    KEYS[8] runs         G:rz   run index, ZSET, lex
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
