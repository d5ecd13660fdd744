-- `record_attempt.lua` for a worker that goes on with the task it holds:
-- the last attempt's outcome and the next attempt, under the same lease
-- (renewed if asked; set again if it just expired, which the fence check
-- proves nobody else noticed) and the same message (kept alive if asked).
-- Refused with {CANCEL_REQUESTED, flag} when asked to and cancellation was
-- requested.
--
-- KEYS[1]: the task's fence counter
-- KEYS[2]: the task's record
-- KEYS[3]: the task's claimed attempts (a hash)
-- KEYS[4]: the saga's index of the stored status
-- KEYS[5]: the saga's index of the new status
-- KEYS[6]: the task's lock
-- KEYS[7]: the partition's queue
-- KEYS[8]: the task's cancellation flag
-- KEYS[9]: the task's audit log
-- ARGV[1]: the fence of the writer's lease
-- ARGV[2]: the version the writer read
-- ARGV[3]: the new record (JSON), or its head (record.lua)
-- ARGV[4]: the next attempt's claim (a field of KEYS[3])
-- ARGV[5]: the new status (`TaskStatus::as_str`)
-- ARGV[6]: the task id
-- ARGV[7]: when the task was created (ms)
-- ARGV[8]: the lease token
-- ARGV[9]: the lease's new time to live (ms; '' = no renewal)
-- ARGV[10]: the consumer group
-- ARGV[11]: the consumer
-- ARGV[12]: the message's entry id
-- ARGV[13]: '1' to refuse when cancellation was requested
-- ARGV[14]: how many audit entries the log keeps
-- ARGV[15]: '1' when the record is in layout 2 (record.lua: its fence,
--   claims and cancellation flag are fields of KEYS[2])
-- ARGV[16]: how many pairs of field and value of the record follow
-- ARGV[17..]: those pairs, then the audit entries to append
-- Returns: {new version, 1 if the claim is new else 0}, or a refusal:
-- {LOCK_LOST, fence}, {MISSING}, {CONFLICT, stored version},
-- {CANCEL_REQUESTED, flag}.
local fence_key = KEYS[1]
local task_key = KEYS[2]
local claims_key = KEYS[3]
local index_from = KEYS[4]
local index_to = KEYS[5]
local lock_key = KEYS[6]
local queue = KEYS[7]
local cancel_key = KEYS[8]
local audit_key = KEYS[9]
local fence = ARGV[1]
local version = ARGV[2]
local doc = ARGV[3]
local claim = ARGV[4]
local status = ARGV[5]
local id = ARGV[6]
local created = ARGV[7]
local token = ARGV[8]
local ttl = ARGV[9]
local group = ARGV[10]
local consumer = ARGV[11]
local entry = ARGV[12]
local unless_cancelled = ARGV[13]
local audit_cap = ARGV[14]
local apart = ARGV[15] == '1'
local RECORD_FROM = 16
local AUDIT_FROM = after_record(ARGV, RECORD_FROM)

local flag_key = nil
if unless_cancelled == '1' then flag_key = cancel_key end
local refused, nv, flag, claimed =
  check_record(apart, fence_key, task_key, flag_key, fence, version, claim)
if refused then return refused end
if unless_cancelled == '1' and flag then return {CANCEL_REQUESTED, flag} end
audit(audit_key, audit_cap, ARGV, AUDIT_FROM)
write_record(task_key, doc, nv, status, ARGV, RECORD_FROM, claim_fields(apart, claim, claimed))
if index_from ~= index_to then
  redis.call('ZREM', index_from, id)
  redis.call('ZADD', index_to, created, id)
end
if ttl ~= '' then
  redis.call('SET', lock_key, token, 'PX', ttl)
  pcall(redis.call, 'XCLAIM', queue, group, consumer, 0, entry, 'JUSTID')
end
return {nv, claim_attempt(apart, claims_key, claim, claimed)}
