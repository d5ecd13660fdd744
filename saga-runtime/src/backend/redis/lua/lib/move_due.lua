-- Moves the entries of delayed set `d` (`<unanswered>:<payload>`) due by
-- `now` onto stream `q`, at most `limit`; returns how many.
local function move_due(d, q, limit, now)
  local due = redis.call('ZRANGEBYSCORE', d, '-inf', now, 'LIMIT', 0, limit)
  for _, m in ipairs(due) do
    redis.call('ZREM', d, m)
    local sep = string.find(m, ':', 1, true)
    local n = tonumber(string.sub(m, 1, sep - 1)) or 0
    local payload = string.sub(m, sep + 1)
    if n > 0 then
      redis.call('XADD', q, '*', 'payload', payload, 'unanswered', n)
    else
      redis.call('XADD', q, '*', 'payload', payload)
    end
  end
  return #due
end
