-- Takes a task's lease: `SET NX PX` with a random token, and a new fence
-- (each acquisition increments the task's fence counter; a write must
-- carry the latest). Nothing is written for a task that does not exist: a
-- stray message must not leave a fence behind.
--
-- KEYS[1]: the task's lock
-- KEYS[2]: the task's fence counter (layout 1; see record.lua)
-- KEYS[3]: the task's record
-- KEYS[4]: the task's cancellation flag (layout 1)
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

local doc, version, apart, cancel = read_record(task_key)
if not doc then return {0} end
if not redis.call('SET', lock_key, token, 'NX', 'PX', ttl) then return false end
local fence = next_fence(task_key, fence_key, apart)
if not apart then cancel = redis.call('GET', cancel_key) end
return {fence, doc, version, cancel, apart}
