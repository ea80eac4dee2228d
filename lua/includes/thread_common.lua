--[[
  Shared helpers of the conversation-thread scripts (inlined by the loader).

  Every key a thread script touches carries the owner's hash tag
  "{<ns>:o:<tenant>:<user>}" (memtier/keys.py), so each script runs in one
  Redis Cluster slot and can only ever see the caller's own threads.

  Status convention (mirrored by memtier.threads.status.ThreadStatus): every script
  answers { status, ... }.  Negative: refused, nothing written.  Zero: done as asked.
  Positive: a documented variant of a successful answer.  Each script's header lists
  every status it returns.
     0 OK
     1 EXISTED (already so: same create, a branch ref already, archived, a batch replayed)
     2 ENDED_CANCELLED (run_cancel: the run already ended cancelled)
     3 DONE (this request already completed: run_claim, run_commit, run_cancel, delete)
     4 HELD (delete: a legal hold blocks it; nothing removed)
    -1 NOT_FOUND           -2 METADATA_CONFLICT   -3 THREAD_ARCHIVED
    -4 BRANCH_LIMIT        -5 UNKNOWN_LEAF        -6 LIMIT_EXCEEDED
    -7 THREAD_BUSY         -8 REQUEST_IN_PROGRESS -9 REQUEST_CONFLICT
   -10 LEASE_LOST         -11 CANCELLED (the run's caller cancelled it)

  Cancellation: run_cancel marks a running turn by rewriting its lease value to
  "<token>:cancel" (same expiry).  The run's own scripts recognise the mark
  (thread_lease_state) and report CANCELLED; every other request still sees the thread
  held, so turns stay serialized until the cancelled run has closed its ledger.
]]
local rcall = redis.call

-- True when the thread hash exists and carries this service's marker.
local function thread_live(thread_key, marker)
  return rcall('HGET', thread_key, 'marker') == marker
end

-- True when the thread hash exists, carries the marker and is stored for (tenant, user).
-- Every script that writes a thread checks this before it writes anything: a row whose
-- stored owner differs (corruption, a hand-written row) is not-found, never modified.
local function thread_owned(thread_key, marker, tenant, user)
  local f = rcall('HMGET', thread_key, 'marker', 'tenant', 'user')
  return f[1] == marker and f[2] == tenant and f[3] == user
end

-- { status, field1, value1, ... } : the status followed by the thread hash.
local function thread_reply(status, thread_key)
  local reply = rcall('HGETALL', thread_key)
  table.insert(reply, 1, status)
  return reply
end

-- Events key -> the ms part of its newest row, once this call has read or written one
-- (false: the stream is empty).  A script runs alone, so after its first XADD the newest
-- row is the one it wrote: later rows of the same call need no look at the stream.  A
-- local of the script body: every call starts with none.
local thread_newest_ms = {}

-- Append one redacted ledger row.  Stream ids are "<ms>-<seq>" with
-- ms = max(now_ms, ms of the newest row): ids, hence (timestamp, id) order, never go
-- backwards even when hosts' clocks disagree.  Returns the new id.
-- The first row of a call is tried at "<now_ms>-*" without reading the stream: Redis
-- refuses that id only when the stream's top id is past now_ms (a clock behind the
-- newest row's), and only then is the newest row read (XREVRANGE) and its ms used --
-- the same id as reading first, without the read on the common path.
local function thread_xadd(events_key, now_ms, etype, data, run)
  local ms = now_ms
  local newest_ms = thread_newest_ms[events_key]
  if newest_ms == nil then
    local id = redis.pcall('XADD', events_key, ms .. '-*', 'type', etype, 'data', data,
      'run', run, 'r', '1')
    if type(id) == 'string' then
      thread_newest_ms[events_key] = ms
      return id
    end
    local newest = rcall('XREVRANGE', events_key, '+', '-', 'COUNT', 1)
    newest_ms = newest[1] and string.match(newest[1][1], '^(%d+)-') or false
  end
  if newest_ms and tonumber(newest_ms) > tonumber(ms) then
    ms = newest_ms
  end
  local id = rcall('XADD', events_key, ms .. '-*', 'type', etype, 'data', data, 'run', run, 'r', '1')
  thread_newest_ms[events_key] = ms
  return id
end

-- The lease as seen by the run holding ``token``: 'held', 'cancelled' (run_cancel marked
-- it) or 'lost' (expired, or another run's).
local function thread_lease_state(lease_key, token)
  local holder = rcall('GET', lease_key)
  if holder == token then
    return 'held'
  end
  if holder == token .. ':cancel' then
    return 'cancelled'
  end
  return 'lost'
end

-- Shared run-limit counters live in the thread hash as "use.<meter>" (integers).
-- Add the consumption JSON {"<meter>": n, ...} of one turn (written by the client, already
-- capped to the turn's allowance).  Returns nothing.
local function thread_charge(thread_key, usage_json)
  if usage_json == nil or usage_json == '' then
    return
  end
  local ok, usage = pcall(cjson.decode, usage_json)
  if not ok or type(usage) ~= 'table' then
    return
  end
  for meter, amount in pairs(usage) do
    local n = tonumber(amount)
    if type(meter) == 'string' and n and n > 0 then
      rcall('HINCRBY', thread_key, 'use.' .. meter, string.format('%d', n))
    end
  end
end

-- Decode a run record (JSON written by the client); nil when absent or unreadable.
local function thread_run_record(runs_key, request_id)
  local raw = rcall('HGET', runs_key, request_id)
  if not raw then
    return nil
  end
  local ok, rec = pcall(cjson.decode, raw)
  if not ok or type(rec) ~= 'table' then
    return nil
  end
  return rec
end

-- ARGV check: the non-negative integer in value, or nil (the caller then replies
-- redis.error_reply('memtier: ...'): a bug in memtier, never an expected outcome).
local function thread_int(value)
  local n = tonumber(value)
  if n and n >= 0 and n == math.floor(n) then
    return n
  end
  return nil
end

-- The parents hash caches the path root -> one leaf as "id id ... leaf" under this field
-- (not an entry id: ids match [A-Za-z0-9_.-]), so that a turn on that leaf reads its
-- history without walking one HGET per entry.  An entry's parent never changes, so a
-- cached path is the path of the id it ends with for as long as the thread exists.
local THREAD_PATH_FIELD = '~path'

-- The position in the cached path ``cached`` where the whole id ``id`` starts, or nil
-- (a plain find: "e1" also occurs inside "e12", so a hit must start the text or follow a
-- space, and end it or precede one).  Bounded: each try moves past the last hit.
local function thread_path_find(cached, id)
  local from, n = 1, #id
  while true do
    local at = string.find(cached, id, from, true)
    if not at then
      return nil
    end
    local after = string.sub(cached, at + n, at + n)
    if (at == 1 or string.sub(cached, at - 1, at - 1) == ' ') and (after == '' or after == ' ') then
      return at
    end
    from = at + 1
  end
end

-- True when the whole id ``id`` ends at byte ``at_end`` of the cached path ``cached``
-- ("e1 e2 ..."): the text there is ``id``, it starts the text or follows a space, and it
-- ends the text or precedes one ("e2" must not match the end of "e12").
local function thread_path_has_at(cached, id, at_end)
  local from = at_end - #id + 1
  return #id > 0 and from >= 1 and at_end <= #cached
    and string.sub(cached, from, at_end) == id
    and (from == 1 or string.byte(cached, from - 1) == 32)
    and (at_end == #cached or string.byte(cached, at_end + 1) == 32)
end

-- True when the cached path ``cached`` ends at entry ``leaf``.
local function thread_path_ends_at(cached, leaf)
  local n = #leaf
  return #cached >= n and string.sub(cached, -n) == leaf
    and (#cached == n or string.sub(cached, -n - 1, -n - 1) == ' ')
end

-- The walk back from ``leaf`` along the parents hash (one HGET per entry), at most
-- ``limit`` ids: the ids walked (``leaf`` first), the byte where the entry it stopped at
-- ends in the cached path ``stored`` (nil: it stopped elsewhere), and whether the path is
-- whole (it reached the root, or an entry ``stored`` holds).  ``stored`` is the true
-- path of its last entry, so its text up to an entry it holds is that entry's path
-- (entries never change parent).  The first few entries are looked up in the text (a
-- plain find, ~10 us over a path of 1,700 ids); past them, in a set of its ids split
-- once (~0.2 us an id: ~250 us at 1,400 ids): a walk back from a turn on another branch
-- is usually short, and a long one must not cost a find per step.
local THREAD_WALK_FINDS = 4
local function thread_walk_back(parents_key, leaf, limit, stored)
  local walked, cursor, upto, held = {}, leaf, nil, nil
  while cursor and cursor ~= '' and #walked < limit do
    if stored then
      if #walked < THREAD_WALK_FINDS then
        local at = thread_path_find(stored, cursor)
        if at then
          upto = at + #cursor - 1
          break
        end
      else
        if not held then
          held = {}
          local ends = 0
          for id in string.gmatch(stored, '[^ ]+') do
            ends = ends + #id + (ends > 0 and 1 or 0)
            held[id] = ends
          end
        end
        if held[cursor] then
          upto = held[cursor]
          break
        end
      end
    end
    walked[#walked + 1] = cursor
    cursor = rcall('HGET', parents_key, cursor)
  end
  return walked, upto, (upto ~= nil or cursor == '')
end

-- The path a walk found, as a list of ids: those of ``stored`` up to byte ``upto``
-- (where :func:`thread_walk_back` stopped; nil: none), then the ones it ``walked``.
local function thread_path_of(stored, upto, walked)
  local path = {}
  if upto then
    for id in string.gmatch(string.sub(stored, 1, upto), '[^ ]+') do
      path[#path + 1] = id
    end
  end
  for i = #walked, 1, -1 do
    path[#path + 1] = walked[i]
  end
  return path
end

-- The path root -> ``leaf``, as a list of ids, and whether it is whole.
local function thread_walk_path(parents_key, leaf, limit, stored)
  local walked, upto, whole = thread_walk_back(parents_key, leaf, limit, stored)
  return thread_path_of(stored, upto, walked), whole
end
