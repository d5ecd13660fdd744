-- Takes a task's lease: `SET NX PX` with a random token, and a new fence
-- (each acquisition increments the task's fence counter; a write must
-- carry the latest). Nothing is written for a task that does not exist: a
-- stray message must not leave a fence behind.
--
-- KEYS[1]: the task's lock
-- KEYS[2]: the task's fence counter
-- KEYS[3]: the task's record
-- KEYS[4]: the task's cancellation flag
-- ARGV[1]: the lease token
-- ARGV[2]: the lease's time to live (ms)
-- Returns: nil when the lease is held by another, {0} when the task does
-- not exist, else {fence, record, version, cancellation flag, apart}
-- (the record whole, as read_record reads it).
local lock_key = KEYS[1]
local fence_key = KEYS[2]
local task_key = KEYS[3]
local cancel_key = KEYS[4]
local token = ARGV[1]
local ttl = ARGV[2]

if redis.call('EXISTS', task_key) == 0 then return {0} end
if not redis.call('SET', lock_key, token, 'NX', 'PX', ttl) then return false end
local fence = redis.call('INCR', fence_key)
local doc, version, apart = read_record(task_key)
return {fence, doc, version, redis.call('GET', cancel_key), apart}
