#!lua
--[[
  Claim one continue turn on a thread: the per-request run record (idempotency) and the
  per-thread lease (serialization) in one step, the turn's opening ledger rows, and what
  the runner needs (the thread hash and its history along the chosen branch), so that a
  successful continue costs one call here and one run_commit (plus the runner's emits).

  Input:
    KEYS[1] thread    thread hash T:t:<thread_id>
    KEYS[2] runs      runs hash T:r:<thread_id>: request id -> run record JSON
    KEYS[3] lease     lease string T:l:<thread_id>: token of the run holding the thread
    KEYS[4] parents   parents hash T:p:<thread_id>: entry id -> parent entry id ("" = root)
    KEYS[5] events    events stream T:v:<thread_id>
    KEYS[6] entries   entries hash T:e:<thread_id>: entry id -> entry JSON
    ARGV[1]  marker           thread marker
    ARGV[2]  request_id       idempotency key of this continue
    ARGV[3]  token            random token of this attempt (CSPRNG)
    ARGV[4]  fingerprint      sha256 of (message, leaf id, options): an exact retry has
                              the same one
    ARGV[5]  lease_ms         lease duration, ms (renewed by the runner's heartbeat)
    ARGV[6]  leaf_id          "" = continue from the head; else a recorded branch ref
    ARGV[7]  max_entries      entries one thread may hold
    ARGV[8]  turn_entries     entries one turn adds
    ARGV[9]  max_events       ledger rows one thread may hold
    ARGV[10] turn_events      ledger rows one turn may add (reserved up front)
    ARGV[11] max_bytes        stored bytes one thread may hold
    ARGV[12] turn_bytes       bytes one turn may add at most (reserved up front)
    ARGV[13] record           run record JSON {"s":"running","tok":token,"fp":...,"at":ms}
    ARGV[14] tenant           owner tenant id (checked against the row before any write)
    ARGV[15] user             owner user id
    ARGV[16] now_ms           wall clock, ms (ids of the opening rows: see thread_xadd)
    ARGV[17] started_head     agent_started row data JSON (redacted) up to its leafId value
    ARGV[18] started_tail     ... and after it: data = head .. (base as JSON) .. tail
    ARGV[19] message_head     user_message row data JSON (redacted) up to its entryId value
    ARGV[20] message_tail     ... and after it: data = head .. "e<first>" .. tail
    ARGV[21] inline_bytes     history entries sent inline up to this many bytes (the rest
                              by id, for the caller's HMGET): bounds this call's reply
    ARGV[22] known_inc        the thread incarnation ("inc") the caller's history cache is
                              of ("" = it holds none)
    ARGV[23] known_n          how many path entries, root first, the caller holds (0 = none)
    ARGV[24] known_last       the id of the last of them
    ARGV[25] known_end        where known_last ends in the path's text (its ids joined by
                              single spaces): the byte length of the caller's ids so joined
    ARGV[26] n_meters         shared run limits with a per-thread cap (0 = none)
    then n_meters pairs       meter name, per-thread cap: the turn is refused when the
                              thread's counter "use.<meter>" already reached the cap

  Output (checked in this order):
    { -1 }                     NOT_FOUND (missing, or stored for another owner)
    { -9 }                     REQUEST_CONFLICT: request_id was used with another fingerprint
    { 3, record_json }         DONE: this request already completed; record carries the result
    { -8 }                     REQUEST_IN_PROGRESS: its first attempt still holds the lease
                               (also while a cancelled first attempt is closing its ledger)
    { -3 }                     THREAD_ARCHIVED
    { -5 }                     UNKNOWN_LEAF: leaf_id is not a recorded branch ref
    { -6, what }               LIMIT_EXCEEDED: "entries" | "events" | "bytes" would pass a cap,
                               or "run:<meter>": the thread's shared run limit is used up
    { -7 }                     THREAD_BUSY: another request's run holds the lease
    { 0, base, count, first, n_fields, field, value, ..., n_path, n_known, id..., entry... }
                               OK: claimed; base = entry the turn hangs off ("" = none);
                               count = entries so far; first = the number of the turn's first
                               entry id ("e<first>", then "e<first+1>"): allocated from the
                               thread's entry-id sequence, never reused even when a turn fails;
                               then the thread hash after the claim (n_fields strings, HGETALL;
                               its "inc" names this incarnation of the thread);
                               then the path root -> base: n_path ids in all (bounded by count),
                               of which the first n_known are the ones the caller holds and are
                               not sent (in the incarnation known_inc: n_known = known_n when
                               the path's entry number known_n is known_last, ending at byte
                               known_end of the path's text; when known_last is on another
                               branch, the number of the entries both paths share, the
                               caller's first n_known; else 0), then the
                               ids after them; then the JSON of the path entries after them,
                               root first, while they fit in inline_bytes (a missing entry: nil)
    A record whose token no longer holds the lease (its process died; the lease expired)
    is abandoned and claimed again.  A "cancelled" record is a finished cancellation: the
    same request id runs again as a new run (any message).  A replay of our own claim (same
    token, still holding the lease: the first attempt's reply was lost) answers the same
    turn (same first) and writes nothing again.

  Side effects: lease SET PX lease_ms; run record; the two opening rows agent_started and
  user_message (emit batch 1: eseq = 1; bytes counter); eidseq advanced by turn_entries;
  the parents hash's path cache (field "~path", not an entry id) set to the path root ->
  base when it did not end at base (run_commit extends it; see thread_path_ends_at); the
  thread's incarnation "inc" set to token when the hash has none (a thread deleted and
  created again under the same id starts without one: entry ids restart, so a cache of
  the old entries must not match).  Entries never change, nor does a path prefix within
  one incarnation, so the caller's known_n entries are exactly the path's first ones.
]]
--- @include "thread_common"

local thread_key, runs_key, lease_key, parents_key, events_key, entries_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local marker, request_id, token, fingerprint = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lease_ms = thread_int(ARGV[5])
local leaf_id = ARGV[6]
local max_entries, turn_entries = thread_int(ARGV[7]), thread_int(ARGV[8])
local max_events, turn_events = thread_int(ARGV[9]), thread_int(ARGV[10])
local max_bytes, turn_bytes = thread_int(ARGV[11]), thread_int(ARGV[12])
local record = ARGV[13]
local tenant, user = ARGV[14], ARGV[15]
local now_ms = ARGV[16]
local started_head, started_tail = ARGV[17], ARGV[18]
local message_head, message_tail = ARGV[19], ARGV[20]
local inline_bytes = thread_int(ARGV[21])
local known_inc, known_n, known_last = ARGV[22], thread_int(ARGV[23]), ARGV[24]
local known_end = thread_int(ARGV[25])
local n_meters = thread_int(ARGV[26])
if not n_meters or #ARGV ~= 26 + 2 * n_meters then
  return redis.error_reply('memtier: run_claim: malformed ARGV (meters)')
end
if not (lease_ms and max_entries and turn_entries and max_events and turn_events
        and max_bytes and turn_bytes and inline_bytes and known_n and known_end
        and thread_int(now_ms))
    or lease_ms == 0 or request_id == '' or token == '' then
  return redis.error_reply('memtier: run_claim: malformed ARGV')
end

-- One read of the thread hash for every check and counter below (a script runs alone:
-- nothing changes it before this script's own writes).
local fields = rcall('HMGET', thread_key, 'marker', 'tenant', 'user', 'state', 'branches',
  'head', 'entries', 'bytes', 'inc', 'eidseq')
if not (fields[1] == marker and fields[2] == tenant and fields[3] == user) then
  return { -1 }  -- missing, or stored for another owner (as thread_owned)
end
local holder = rcall('GET', lease_key)
local rec = thread_run_record(runs_key, request_id)
local own_replay = false
if rec and rec.s == 'cancelled' then
  rec = nil  -- a retry after a cancellation is a new run
end
if rec then
  if rec.fp ~= fingerprint then
    return { -9 }
  end
  if rec.s == 'done' then
    return { 3, rcall('HGET', runs_key, request_id) }
  end
  if rec.tok == token then
    own_replay = true
  elseif holder and (holder == rec.tok or holder == rec.tok .. ':cancel') then
    return { -8 }
  end
  -- otherwise: abandoned (its lease expired); claim it again below
end

local state, head = fields[4], fields[6]
local count, bytes = tonumber(fields[7]), tonumber(fields[8])
if state ~= 'active' and not own_replay then
  return { -3 }
end
local base = head
if leaf_id ~= '' then
  local known = false
  for _, ref in ipairs(cjson.decode(fields[5])) do
    if ref.leafId == leaf_id then
      known = true
      break
    end
  end
  if not known then
    return { -5 }
  end
  base = leaf_id
end
if count + turn_entries > max_entries then
  return { -6, 'entries' }
end
if rcall('XLEN', events_key) + turn_events > max_events then
  return { -6, 'events' }
end
if bytes + turn_bytes > max_bytes then
  return { -6, 'bytes' }
end
for i = 0, n_meters - 1 do
  local meter, cap = ARGV[27 + 2 * i], tonumber(ARGV[28 + 2 * i])
  local used = tonumber(rcall('HGET', thread_key, 'use.' .. meter)) or 0
  if used >= cap then
    return { -6, 'run:' .. meter }
  end
end
if holder and holder ~= token then
  return { -7 }
end

-- Our own claim replayed while it still holds the lease: the first attempt ran in full
-- (this script is atomic), so its opening rows already name the turn's entry ids.
local reclaimed = own_replay and holder == token
rcall('SET', lease_key, token, 'PX', lease_ms)
rcall('HSET', runs_key, request_id, record)
local inc = fields[9]
local new_inc = not inc
if new_inc then
  inc = token
end

-- Entry ids come from a sequence that only grows ("eidseq"; threads written before it
-- existed start from their entry count): an aborted or denied turn's ids stay unused.
local first
if reclaimed then
  first = tonumber(fields[10]) - turn_entries + 1
  if new_inc then
    rcall('HSET', thread_key, 'inc', inc)
  end
else
  first = (tonumber(fields[10]) or count) + 1
  -- The opening rows (emit batch 1), as events_append writes them.  Entry ids match
  -- [A-Za-z0-9_.-]: quoted as they are, they are JSON strings.
  local leaf_json = 'null'
  if base and base ~= '' then
    leaf_json = '"' .. base .. '"'
  end
  local started = started_head .. leaf_json .. started_tail
  local message = message_head .. '"e' .. first .. '"' .. message_tail
  thread_xadd(events_key, now_ms, 'agent_started', started, request_id)
  thread_xadd(events_key, now_ms, 'user_message', message, request_id)
  -- (bytes: the counter as read plus the two rows, what HINCRBY would store.)
  local grown = bytes + 13 + #started + 12 + #message
  if new_inc then
    rcall('HSET', thread_key, 'inc', inc, 'eidseq', first + turn_entries - 1, 'eseq', 1,
      'bytes', grown)
  else
    rcall('HSET', thread_key, 'eidseq', first + turn_entries - 1, 'eseq', 1, 'bytes', grown)
  end
end

local reply = { 0, base, count, first }
local hash = rcall('HGETALL', thread_key)
reply[#reply + 1] = #hash
for i = 1, #hash do
  reply[#reply + 1] = hash[i]
end
-- The path root -> base.  The parents hash caches the path of one leaf (the last turn's,
-- usually the head) under PATH_FIELD as "id id ... leaf": entries never change parent,
-- so the cache is base's path exactly when it ends at base.  Otherwise walk the parents
-- (one HGET per entry) back to an entry the cache holds -- the cached text up to it is
-- that entry's path -- or to the root, and cache the path for the commit to extend: a
-- turn on another branch walks back to where the branches part, not to the root.
local path = {}
-- The usual turn: the caller holds the path up to its last turn, and the cached path
-- (base's) holds that path and then the entries after it.  Ids are unique along a path
-- and the ids before one are its ancestors, root first, so the cached text up to
-- known_last is the caller's path when it ends where the caller's ids joined end
-- (known_end; both are the path of known_last, one text): only the ids after it are
-- split (path then holds nils for the known part, never read below).  Checked at that
-- one place, not found by a search and its ids counted: that took ~40 ns an entry, on
-- every claim, ~75 us on a thread of 2,000 entries.
-- A turn on another leaf (a regenerate, an edit, a branch switch) when the walk back from
-- base stopped in the cached path ``stored`` (at byte ``upto``) and the caller holds a
-- prefix of that same text (its known_n ids end at byte known_end): base's path and the
-- caller's share the text up to the nearer of the two ends, so what the caller holds and
-- what it is sent are counted between those two bytes only.  A regenerate then costs what
-- lies between the fork and the caller's last entry, not the whole path split and
-- indexed (~0.2 us an id) and the caller's side walked back to the fork (one HGET an
-- entry).  Returns the path (ids after skip only, path.n = all of them), skip and the
-- path's text; nil when the counts do not fit the thread (the general route decides).
local function fork_path(stored, upto, walked, known_n, known_end, count)
  local path, n, skip = {}, known_n, known_n
  if known_end <= upto then  -- the caller holds a prefix of base's path
    for id in string.gmatch(string.sub(stored, known_end + 2, upto), '[^ ]+') do
      n = n + 1
      path[n] = id
    end
  else  -- base's path up to upto is a prefix of the caller's
    for _ in string.gmatch(string.sub(stored, upto + 2, known_end), '[^ ]+') do
      n = n - 1
    end
    skip = n
  end
  local from = n + 1
  for j = #walked, 1, -1 do
    n = n + 1
    path[n] = walked[j]
  end
  if skip < 1 or n > count then
    return nil, 0, nil
  end
  path.n = n
  local text = string.sub(stored, 1, upto)
  if n >= from then
    text = text .. ' ' .. table.concat(path, ' ', from, n)
  end
  return path, skip, text
end
local skip = 0
local stored, cached = nil, nil  -- the cached path (of whichever leaf); the same when base's
if base and base ~= '' then
  stored = rcall('HGET', parents_key, THREAD_PATH_FIELD)
  if stored and thread_path_ends_at(stored, base) then
    cached = stored
  end
end
if cached and known_n > 0 and known_inc == inc and known_last ~= '' then
  if thread_path_has_at(cached, known_last, known_end) then
    local n = known_n
    for id in string.gmatch(string.sub(cached, known_end + 2), '[^ ]+') do
      n = n + 1
      path[n] = id
    end
    if n <= count then
      skip = known_n
      path.n = n
    else
      path = {}
    end
  end
end
if base and base ~= '' and skip == 0 then
  if cached then
    for id in string.gmatch(cached, '[^ ]+') do
      path[#path + 1] = id
    end
  end
  if #path == 0 or #path > count then  -- a miss (or a cache longer than any path): walk
    local walked, upto, whole = thread_walk_back(parents_key, base, count, stored)
    local text
    if upto and known_n > 0 and known_inc == inc and known_last ~= ''
        and thread_path_has_at(stored, known_last, known_end) then
      path, skip, text = fork_path(stored, upto, walked, known_n, known_end, count)
    end
    if not text then
      path, skip = thread_path_of(stored, upto, walked), 0
      if #path > count then  -- the cache is longer than any path: not a true one, walk alone
        path, whole = thread_walk_path(parents_key, base, count, nil)
      end
      if whole then  -- a whole path, worth caching
        text = table.concat(path, ' ')
      end
    end
    if text then
      rcall('HSET', parents_key, THREAD_PATH_FIELD, text)
    end
  end
end
-- What the caller holds is not sent again: its entries and their ids.  When neither the
-- check at known_end nor fork_path placed the caller (no cache of this path, or the
-- caller holds a branch the cached text does not), walk the caller's path back from
-- known_last (one HGET per entry, at most known_n) to an entry of this path: the
-- caller's first entries up to it are this path's first (the path of that entry), when
-- it sits at the same place in both (else the caller's count is not its path's: send
-- all).  A turn on the branch the caller did not hold last gets what follows the fork,
-- not the whole history again.  O(path) to index this path's ids, only on such a switch.
local n_path = path.n or #path
if skip == 0 and known_n > 0 and known_inc == inc and known_last ~= '' and n_path > 0 then
  local place = {}
  for k = 1, n_path do
    place[path[k]] = k
  end
  local cursor, steps = known_last, 0
  while cursor and cursor ~= '' and steps < known_n do
    local k = place[cursor]
    if k then
      if k == known_n - steps then
        skip = k
      end
      break
    end
    cursor = rcall('HGET', parents_key, cursor)
    steps = steps + 1
  end
end
reply[#reply + 1] = n_path
reply[#reply + 1] = skip
for i = skip + 1, n_path do
  reply[#reply + 1] = path[i]
end
-- The history after them inline, root first, while it fits (HMGET in chunks: bounded
-- arguments).
local sent, i = 0, skip + 1
while i <= n_path and sent < inline_bytes do
  local chunk = {}
  for j = i, math.min(n_path, i + 499) do
    chunk[#chunk + 1] = path[j]
  end
  local values = rcall('HMGET', entries_key, unpack(chunk))
  for j = 1, #chunk do
    local value = values[j]
    if value then
      if sent + #value > inline_bytes then
        return reply
      end
      sent = sent + #value
    end
    reply[#reply + 1] = value
  end
  i = i + #chunk
end
return reply
