-- Effects `unlock` and `announce` of a task write (apply.lua).
--
-- `unlock`: the lease released. Keys: the task's lock. The fence guard
-- held, so no lease was taken since the writer's (every lease takes a new
-- fence): the lock is the writer's or has expired, never another's.
-- `announce`: the task's end told to its waiters. Arguments: the channel
-- its id is published on.
-- Parsed at key `k` and argument `a`; returns what runs it and the next
-- key and argument.
local function effect_unlock(keys, k, argv, a)
  local lock_key = keys[k]
  return function() redis.call('DEL', lock_key) end, k + 1, a
end
local function effect_announce(keys, k, argv, a)
  local channel = argv[a]
  return function(w) redis.call('PUBLISH', channel, w.id) end, k, a + 1
end
