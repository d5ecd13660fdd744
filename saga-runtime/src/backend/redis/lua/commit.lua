-- Commits a task's step: the new record, the next message (now or
-- delayed), the settling of the message handled (acknowledged, parked as
-- a dead letter, or a dead letter resolved), the retention of a task that
-- ends, and the release of the lease; all after the fence and version
-- checks (check.lua). The next message is enqueued when the writer says:
-- whether a cancellation cuts a wait short is the engine's decision (it
-- asks for the refusal below). The commit that ends a task publishes its
-- id, for waiters.
--
-- KEYS[1]: the task's fence counter
-- KEYS[2]: the task's record
-- KEYS[3]: the task's lock
-- KEYS[4]: the partition's queue
-- KEYS[5]: the partition's dead letters
-- KEYS[6]: the task's cancellation flag
-- KEYS[7]: the partition's delayed messages
-- KEYS[8]: the saga's index of the stored status
-- KEYS[9]: the saga's index of the new status
-- KEYS[10]: the partition's expiring tasks
-- KEYS[11]: the task's claimed attempts
-- KEYS[12]: the task's audit log
-- ARGV[1]: the fence of the writer's lease
-- ARGV[2]: the version the writer read
-- ARGV[3]: the new record (JSON), or its head (record.lua)
-- ARGV[4]: the next message's payload ('' = none)
-- ARGV[5]: the next message's delay (ms)
-- ARGV[6]: how to settle the message handled: 'none', 'ack', 'dead'
--   (park it as a dead letter), 'resolve' (delete dead letter ARGV[7])
-- ARGV[7]: the entry id settled
-- ARGV[8]: the consumer group
-- ARGV[9]: the dead letter's payload
-- ARGV[10]: the dead letter's reason
-- ARGV[11]: the task id
-- ARGV[12]: '1' to refuse when cancellation was requested
-- ARGV[13]: the new status (`TaskStatus::as_str`)
-- ARGV[14]: expire the task's keys after this (ms; '' = keep them)
-- ARGV[15]: when the task was created (ms)
-- ARGV[16]: the task's member of KEYS[10] under its stored status ('' =
--   none: the stored status is not terminal)
-- ARGV[17]: the task's member of KEYS[10] under its new status
-- ARGV[18]: the dead letter's payload size ('' = not cut)
-- ARGV[19]: the dead letters' cap (`MAXLEN ~`)
-- ARGV[20]: the channel to publish the task id on ('' = none)
-- ARGV[21]: how many audit entries the log keeps
-- ARGV[22]: '1' when the record is in layout 2 (record.lua: its fence,
--   claims and cancellation flag are fields of KEYS[2], and its keys to
--   expire are KEYS[2] and KEYS[12] alone)
-- ARGV[23]: how many pairs of field and value of the record follow
-- ARGV[24..]: those pairs, then the audit entries to append
-- Returns: {new version}, or a refusal: {LOCK_LOST, fence}, {MISSING},
-- {CONFLICT, stored version}, {CANCEL_REQUESTED, flag}; an error for a
-- delay or an expiry out of range.
local fence_key = KEYS[1]
local task_key = KEYS[2]
local lock_key = KEYS[3]
local queue = KEYS[4]
local dead = KEYS[5]
local cancel_key = KEYS[6]
local delayed = KEYS[7]
local index_from = KEYS[8]
local index_to = KEYS[9]
local expiring = KEYS[10]
local claims_key = KEYS[11]
local audit_key = KEYS[12]
local fence = ARGV[1]
local version = ARGV[2]
local doc = ARGV[3]
local next_payload = ARGV[4]
local next_delay = ARGV[5]
local settle_kind = ARGV[6]
local entry = ARGV[7]
local group = ARGV[8]
local dead_payload = ARGV[9]
local reason = ARGV[10]
local id = ARGV[11]
local unless_cancelled = ARGV[12]
local status = ARGV[13]
local expire_after = ARGV[14]
local created = ARGV[15]
local stored_member = ARGV[16]
local new_member = ARGV[17]
local size = ARGV[18]
local dead_cap = ARGV[19]
local channel = ARGV[20]
local audit_cap = ARGV[21]
local apart = ARGV[22] == '1'
local RECORD_FROM = 23
local AUDIT_FROM = after_record(ARGV, RECORD_FROM)

local now = server_time()
-- The flag is read only for a write that asks to be refused by it.
local flag_key = nil
if unless_cancelled == '1' then flag_key = cancel_key end
local refused, nv, flag = check_record(apart, fence_key, task_key, flag_key, fence, version, '')
if refused then return refused end
if unless_cancelled == '1' and flag then
  return {CANCEL_REQUESTED, flag}
end
local expire = tonumber(expire_after)
if expire_after ~= '' and (not expire or expire < 1 or expire > 1e13) then
  return redis.error_reply('expire-after out of range: ' .. expire_after)
end
local delay = tonumber(next_delay)
if not delay or delay < 0 or delay > 1e13 then
  return redis.error_reply('delay out of range: ' .. next_delay)
end
audit(audit_key, audit_cap, ARGV, AUDIT_FROM)
write_record(task_key, doc, nv, status, ARGV, RECORD_FROM)
if index_from ~= index_to then
  redis.call('ZREM', index_from, id)
  redis.call('ZADD', index_to, created, id)
end
if stored_member ~= '' then redis.call('ZREM', expiring, stored_member) end
local task_keys = {task_key, fence_key, cancel_key, claims_key, audit_key}
if apart then task_keys = {task_key, audit_key} end
if expire_after ~= '' then
  for _, k in ipairs(task_keys) do redis.call('PEXPIRE', k, expire) end
  redis.call('ZADD', expiring, now + expire, new_member)
elseif stored_member ~= '' then
  for _, k in ipairs(task_keys) do redis.call('PERSIST', k) end
end
if next_payload ~= '' then
  if delay == 0 then
    redis.call('XADD', queue, '*', 'payload', next_payload)
  else
    redis.call('ZADD', delayed, now + delay, '0:' .. next_payload)
  end
end
if settle_kind == 'dead' then
  local fields = {'payload', dead_payload, 'reason', reason, 'task', id, 'at', now}
  if size ~= '' then table.insert(fields, 'size') table.insert(fields, size) end
  redis.call('XADD', dead, 'MAXLEN', '~', dead_cap, '*', unpack(fields))
end
if settle_kind == 'ack' or settle_kind == 'dead' then settle(queue, group, entry) end
if settle_kind == 'resolve' then redis.call('XDEL', dead, entry) end
-- The fence matched: no lease was taken since ours (every lease takes a
-- new fence), so the lock is ours or has expired, never another's.
redis.call('DEL', lock_key)
if channel ~= '' then redis.call('PUBLISH', channel, id) end
return {nv}
