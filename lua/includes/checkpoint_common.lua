--[[
  Shared helpers of the LangGraph checkpoint scripts (inlined by the loader).
]]
local rcall = redis.call

-- Split on "\1", keeping empty parts: G:v values are "<run id>\1<blob field>\1...".
local function cp_split(s)
  local parts = {}
  local start = 1
  while true do
    local i = string.find(s, '\1', start, true)
    if not i then
      parts[#parts + 1] = string.sub(s, start)
      return parts
    end
    parts[#parts + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end

-- The blob fields a G:v value references (all parts after the run id).
local function cp_blob_fields(v)
  local parts = cp_split(v)
  local fields = {}
  for j = 2, #parts do
    if parts[j] ~= '' then fields[#fields + 1] = parts[j] end
  end
  return fields, parts[1]
end
