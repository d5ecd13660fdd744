-- Appends the audit entries `argv[first..last]` (`last`: by default the
-- last argument) to list `key`, keeping the last
-- `cap`: in chunks, since Lua cannot unpack many thousands of values at
-- once (a record written before the log had its own list may carry that
-- many). Scripts call it right after their checks, before their other
-- writes: a refusal then leaves nothing half-written.
local function audit(key, cap, argv, first, last)
  last = last or #argv
  local len = 0
  for i = first, last, 500 do
    len = redis.call('RPUSH', key, unpack(argv, i, math.min(i + 499, last)))
  end
  if len > tonumber(cap) then redis.call('LTRIM', key, -tonumber(cap), -1) end
end
