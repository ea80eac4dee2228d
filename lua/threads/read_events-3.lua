#!lua flags=no-writes
--[[
  Read one page of a thread's ledger (replay and export), plus what the caller needs to tell
  whether more may come: whether a turn holds the thread's lease (it is still writing), and
  the type of the newest row (a terminal row ends a turn).  Read-only.

  Input:
    KEYS[1] thread   thread hash T:t:<thread_id>
    KEYS[2] events   events stream T:v:<thread_id>
    KEYS[3] lease    lease string T:l:<thread_id>
    ARGV[1] marker   thread marker
    ARGV[2] start    "-" for the beginning, or "(<id>" to start after a served row
    ARGV[3] count    rows to read, 1..1001 (page size + 1: the caller learns whether more exist)
    ARGV[4] tenant   owner tenant id (a row stored for another owner is not-found)
    ARGV[5] user     owner user id

  Output:
    { -1 }   NOT_FOUND (missing, or stored for another owner)
    { 0, running, newest_type, id, type, data, run, redacted, ... }
             OK:
             running = 1 while a turn holds the lease, else 0;
             newest_type = type of the newest row if written through the redactor, else "";
             then 5 strings per row, ordered by id (= by (timestamp, id));
             redacted is "1" for rows written through the service's redactor, "" otherwise.

  Side effects: none.
]]
--- @include "thread_common"

local thread_key, events_key, lease_key = KEYS[1], KEYS[2], KEYS[3]
local marker, start = ARGV[1], ARGV[2]
local count = thread_int(ARGV[3])
local tenant, user = ARGV[4], ARGV[5]
if not count or count == 0 or count > 1001 then
  return redis.error_reply('memtier: read_events: malformed ARGV')
end
if not thread_owned(thread_key, marker, tenant, user) then
  return { -1 }
end
local function field(row, name)
  local flat = row[2]
  for i = 1, #flat, 2 do
    if flat[i] == name then
      return flat[i + 1]
    end
  end
  return ''
end
local reply = { 0, rcall('EXISTS', lease_key), '' }
local newest = rcall('XREVRANGE', events_key, '+', '-', 'COUNT', 1)
if newest[1] and field(newest[1], 'r') == '1' then
  reply[3] = field(newest[1], 'type')
end
local rows = rcall('XRANGE', events_key, start, '+', 'COUNT', count)
for _, row in ipairs(rows) do
  reply[#reply + 1] = row[1]
  reply[#reply + 1] = field(row, 'type')
  reply[#reply + 1] = field(row, 'data')
  reply[#reply + 1] = field(row, 'run')
  reply[#reply + 1] = field(row, 'r')
end
return reply
