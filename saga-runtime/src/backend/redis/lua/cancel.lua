-- Records a cancellation request (`<ms>|<token>`), announces it, and
-- enqueues a wake-up message so that a task waiting for a delayed retry is
-- cancelled now. The flag expires with the task; nothing is written for a
-- task that does not exist.
--
-- KEYS[1]: the task's cancellation flag
-- KEYS[2]: the task's record
-- KEYS[3]: the partition's queue
-- ARGV[1]: the time of the request (ms)
-- ARGV[2]: the request's token
-- ARGV[3]: the channel cancellations are announced on
-- ARGV[4]: the task id
-- ARGV[5]: the wake-up message's payload
-- Returns: nil for a new request (or the same token's earlier one, or a
-- task that does not exist), else the earlier request's time.
local cancel_key = KEYS[1]
local task_key = KEYS[2]
local queue = KEYS[3]
local at = ARGV[1]
local token = ARGV[2]
local channel = ARGV[3]
local id = ARGV[4]
local wake = ARGV[5]

local prev = redis.call('GET', cancel_key)
if prev then
  local sep = string.find(prev, '|', 1, true)
  if sep and string.sub(prev, sep + 1) == token then return false end
  if sep then return string.sub(prev, 1, sep - 1) end
  return prev
end
local ttl = redis.call('PTTL', task_key)
if ttl == -2 then return false end
if ttl > 0 then
  redis.call('SET', cancel_key, at .. '|' .. token, 'PX', ttl)
else
  redis.call('SET', cancel_key, at .. '|' .. token)
end
redis.call('PUBLISH', channel, id)
redis.call('XADD', queue, '*', 'payload', wake)
return false
