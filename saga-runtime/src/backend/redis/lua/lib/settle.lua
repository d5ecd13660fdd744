-- Acknowledges and deletes entry `e` of stream `q` for group `g`; returns
-- 1 if it was pending. With `pcall`: acknowledging a message whose
-- consumer group is gone (Redis restarted empty, failed over) must not
-- fail the write it settles; with no group there is nothing pending.
local function settle(q, g, e)
  local ok, n = pcall(redis.call, 'XACK', q, g, e)
  redis.call('XDEL', q, e)
  if ok then return n end
  return 0
end
