#!lua
--[[
  Publish one reason-code event that no other script emits: a snapshot generation was
  quarantined (or could not be moved to quarantine), snapshot permissions could not be
  verified (Windows, read-only storage), a flush left a live session out
  (snapshot_skipped), or recovery skipped one session that does not fit today's bounds
  (restore_skipped). Never content.

  Input:
    KEYS[1] meta       meta hash      T:meta (clock)
    KEYS[2] events     events stream  T:events
    ARGV[1] reason          "quarantined" | "permissions_not_verified" | "snapshot_skipped"
                            | "restore_skipped"
    ARGV[2] member          "<avatar-uuid>:<channel>" or "" (not about one key)
    ARGV[3] session_id      or ""
    ARGV[4] detail          short text (a file name and a reason word), never content
    ARGV[5] max_events      MAXLEN of the event stream
    ARGV[6] clock_override  "" = server TIME (production); ms = test clock

  Output:
    the event's stream id (string)

  Side effects: one stream entry (MAXLEN-bounded).
]]
--- @include "memory_common"

local meta_key, events_key = KEYS[1], KEYS[2]
local reason, member, session_id, detail = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local max_events = tonumber(ARGV[5])
local allowed = { quarantined = true, permissions_not_verified = true,
  snapshot_skipped = true, restore_skipped = true }
if not max_events or not allowed[reason] or string.len(detail) > 512 then
  return redis.error_reply('memtier: emit_event: malformed ARGV')
end
local now, wall = memtier_clock(meta_key, ARGV[6], false)
memtier_emit(events_key, max_events, reason, member, session_id, now, wall, detail)
return rcall('XREVRANGE', events_key, '+', '-', 'COUNT', 1)[1][1]
