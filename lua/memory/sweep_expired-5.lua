#!lua
--[[
  Sweep expired sessions of one partition (both channels) and publish an `expired` event
  for each; run by workers on a timer and by the store on demand. Bounded per call.

  Input:
    KEYS[1] lru_public lru zset       T:lru:public
    KEYS[2] lru_im     lru zset       T:lru:im
    KEYS[3] index      index hash     T:ix
    KEYS[4] meta       meta hash      T:meta
    KEYS[5] events     events stream  T:events
    ARGV[1] prefix          "T:"
    ARGV[2] public_ttl_ms
    ARGV[3] im_ttl_ms
    ARGV[4] max_n           sessions swept at most, per channel
    ARGV[5] max_events      MAXLEN of the event stream
    ARGV[6] clock_override  "" = server TIME; ms = test clock

  Output:
    { swept, more }  more = 1 when expired sessions remain (call again)

  Side effects: expired sessions removed; events; partition byte total lowered exactly.
]]
--- @include "memory_common"

local pub_key, im_key, index_key, meta_key, events_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix = ARGV[1]
local pub_ttl, im_ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local max_n, max_events = tonumber(ARGV[4]), tonumber(ARGV[5])
local clock_override = ARGV[6]
if not (pub_ttl and im_ttl and max_n and max_events) then
  return redis.error_reply('memtier: sweep_expired: malformed ARGV')
end
local now, wall = memtier_clock(meta_key, clock_override, true)
local swept = memtier_sweep_channel(prefix, pub_key, pub_ttl, index_key, meta_key, events_key,
  max_events, now, wall, max_n, '')
swept = swept + memtier_sweep_channel(prefix, im_key, im_ttl, index_key, meta_key, events_key,
  max_events, now, wall, max_n, '')
local more = 0
if #rcall('ZRANGE', pub_key, '-inf', now - pub_ttl, 'BYSCORE', 'LIMIT', 0, 1) > 0
    or #rcall('ZRANGE', im_key, '-inf', now - im_ttl, 'BYSCORE', 'LIMIT', 0, 1) > 0 then
  more = 1
end
return { swept, more }
