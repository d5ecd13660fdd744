-- Effect `renew` of a task write (apply.lua): the lease extended and the
-- message held kept from being delivered again, as a heartbeat does.
--
-- Keys: the task's lock, the partition's queue. Arguments: the lease's
-- token, its new time to live (ms), the consumer group, the consumer, the
-- message's entry. Parsed at key `k` and argument `a`; returns what runs
-- it and the next key and argument.
local function effect_renew(keys, k, argv, a)
  local lock_key, queue = keys[k], keys[k + 1]
  local token, ttl, group, consumer, entry = argv[a], argv[a + 1], argv[a + 2], argv[a + 3], argv[a + 4]
  local run = function()
    redis.call('SET', lock_key, token, 'PX', ttl)
    pcall(redis.call, 'XCLAIM', queue, group, consumer, 0, entry, 'JUSTID')
  end
  return run, k + 2, a + 5
end
