-- Records a cancellation request (`<ms>|<token>`), announces it, and
-- enqueues a wake-up message so that a task waiting for a delayed retry is
-- cancelled now. With an audit entry (who asked, and why), appends it to
-- the task's audit log in the same write: the task may be leased to a
-- worker, and its writes only append to that list. The flag (and a log
-- this creates) expires with the task; nothing is written for a task that
-- does not exist.
--
-- KEYS[1]: the task's cancellation flag (record layout 1; layout 2 keeps it in KEYS[2])
-- KEYS[2]: the task's record
-- KEYS[3]: the partition's queue
-- KEYS[4]: the task's audit log
-- ARGV[1]: the time of the request (ms)
-- ARGV[2]: the request's token
-- ARGV[3]: the channel cancellations are announced on
-- ARGV[4]: the task id
-- ARGV[5]: the wake-up message's payload
-- ARGV[6]: how many audit entries the log keeps
-- ARGV[7..]: the audit entries to append (none: record only the request)
-- Returns: nil for a new request (or the same token's earlier one, or a
-- task that does not exist), else the earlier request's time.
local cancel_key = KEYS[1]
local task_key = KEYS[2]
local queue = KEYS[3]
local audit_key = KEYS[4]
local at = ARGV[1]
local token = ARGV[2]
local channel = ARGV[3]
local id = ARGV[4]
local wake = ARGV[5]
local audit_cap = ARGV[6]
local AUDIT_FROM = 7

-- Record layout 2 (record.lua) keeps the flag in the record itself.
local apart = redis.call('HEXISTS', task_key, 'n') == 1
local prev
if apart then
  prev = redis.call('HGET', task_key, 'cancel')
else
  prev = redis.call('GET', cancel_key)
end
if prev then
  local sep = string.find(prev, '|', 1, true)
  if sep and string.sub(prev, sep + 1) == token then return false end
  if sep then return string.sub(prev, 1, sep - 1) end
  return prev
end
local ttl = redis.call('PTTL', task_key)
if ttl == -2 then return false end
if apart then
  redis.call('HSET', task_key, 'cancel', at .. '|' .. token)
elseif ttl > 0 then
  redis.call('SET', cancel_key, at .. '|' .. token, 'PX', ttl)
else
  redis.call('SET', cancel_key, at .. '|' .. token)
end
if #ARGV >= AUDIT_FROM then
  audit(audit_key, audit_cap, ARGV, AUDIT_FROM)
  if ttl > 0 then redis.call('PEXPIRE', audit_key, ttl) end
end
redis.call('PUBLISH', channel, id)
redis.call('XADD', queue, '*', 'payload', wake)
return false
