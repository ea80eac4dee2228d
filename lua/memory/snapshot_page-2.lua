#!lua flags=no-writes
--[[
  Read a page of named sessions of one partition for a snapshot flush. Each session is a
  consistent point-in-time copy (the whole page is, being one script). The caller bounds
  the page (members and their indexed bytes); the script also stops after the session that
  takes it past MAX_ELEMENTS copied fields and records (many small turns cost per record,
  not per byte), so one call never blocks the shard for long. After such a stop the
  members after the last session returned were not read: the caller sends them again.
  Session keys are derived from the partition prefix (same slot; see memtier/keys.py).

  Input:
    KEYS[1] index      index hash  T:ix   (member -> bytes)
    KEYS[2] meta       meta hash   T:meta (clock high-water mark)
    ARGV[1] prefix          "T:"
    ARGV[2] public_ttl_ms
    ARGV[3] im_ttl_ms
    ARGV[4] clock_override  "" = server TIME (production); ms = test clock
    ARGV[5..] members       at most 256 "<avatar-uuid>:<channel>"

  Output:
    { clock_ms, wall_ms, n, (member, n_fields, field, value, ..., n_records, record, ...) * n }
        only live sessions (indexed, hash present, deadline not passed); the others are
        left for the sweeper. When the work bound stopped the page early, the members
        after the last session returned were not read.

  Side effects: none.
]]
--- @include "memory_common"
--- @include "memory_session"

local index_key, meta_key = KEYS[1], KEYS[2]
local prefix = ARGV[1]
local public_ttl, im_ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local clock_override = ARGV[4]
local MAX_MEMBERS = 256 -- bounds the script's run time and reply size
-- ~2 ms of Redis time on a quiet server; one session at the turn ceiling (2000 turns plus
-- its receipts) still goes alone. Measured by tests/faults/test_script_time.py.
local MAX_ELEMENTS = 4096
if not (public_ttl and im_ttl) or prefix == '' or #ARGV - 4 > MAX_MEMBERS then
  return redis.error_reply('memtier: snapshot_page: malformed ARGV')
end

local now, wall = memtier_clock(meta_key, clock_override, false)
local out = { now, wall, 0 }
local n, copied = 0, 0
for i = 5, #ARGV do
  local member = ARGV[i]
  local s_key, t_key = memtier_session_keys(prefix, member)
  if rcall('HEXISTS', index_key, member) == 1 then
    -- live (hash present, deadline not passed) is checked on the session's one HGETALL
    local added = memtier_read_live_session(
      s_key, t_key, member, memtier_ttl_of(member, public_ttl, im_ttl), now, out)
    if added then
      copied = copied + added
      n = n + 1
      if copied >= MAX_ELEMENTS then break end
    end
  end
end
out[3] = n
return out
