-- Extends a task's lease and resets its message's idle time, while the
-- lease is the caller's; reads the cancellation flag either way.
--
-- KEYS[1]: the task's lock
-- KEYS[2]: the partition's queue
-- KEYS[3]: the task's cancellation flag (record layout 1)
-- KEYS[4]: the task's record (layout 2 keeps the flag in it)
-- ARGV[1]: the lease token
-- ARGV[2]: the lease's new time to live (ms)
-- ARGV[3]: the consumer group
-- ARGV[4]: the consumer
-- ARGV[5]: the message's entry id
-- Returns: {1 if the lease is held else 0, cancellation flag}.
local lock_key = KEYS[1]
local queue = KEYS[2]
local cancel_key = KEYS[3]
local task_key = KEYS[4]
local token = ARGV[1]
local ttl = ARGV[2]
local group = ARGV[3]
local consumer = ARGV[4]
local entry = ARGV[5]

local held = 0
if redis.call('GET', lock_key) == token then
  redis.call('PEXPIRE', lock_key, ttl)
  -- Keep the message only while the lease is ours: a worker that lost
  -- its lease must not take the message back from the one that took over.
  pcall(redis.call, 'XCLAIM', queue, group, consumer, 0, entry, 'JUSTID')
  held = 1
end
-- The flag: a key of its own (record layout 1) or a field of the record.
local flag = redis.call('GET', cancel_key)
if not flag then flag = redis.call('HGET', task_key, 'cancel') end
return {held, flag}
