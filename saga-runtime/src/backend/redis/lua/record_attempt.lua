-- Records that an attempt starts: the task's new record (its status moved
-- between the indexes if it changed) and the attempt's claim, after the
-- fence and version checks (check.lua).
--
-- KEYS[1]: the task's fence counter
-- KEYS[2]: the task's record
-- KEYS[3]: the task's claimed attempts (a hash)
-- KEYS[4]: the saga's index of the stored status
-- KEYS[5]: the saga's index of the new status
-- KEYS[6]: the task's audit log
-- ARGV[1]: the fence of the writer's lease
-- ARGV[2]: the version the writer read
-- ARGV[3]: the new record (JSON), or its head (record.lua)
-- ARGV[4]: the attempt's claim (a field of KEYS[3])
-- ARGV[5]: the new status (`TaskStatus::as_str`)
-- ARGV[6]: the task id
-- ARGV[7]: when the task was created (ms)
-- ARGV[8]: how many audit entries the log keeps
-- ARGV[9]: '1' when the record is in layout 2 (record.lua: its fence
--   and claims are fields of KEYS[2], not KEYS[1] and KEYS[3])
-- ARGV[10]: how many pairs of field and value of the record follow
-- ARGV[11..]: those pairs, then the audit entries to append
-- Returns: {new version, 1 if the claim is new else 0}, or a refusal:
-- {LOCK_LOST, fence}, {MISSING}, {CONFLICT, stored version}.
local fence_key = KEYS[1]
local task_key = KEYS[2]
local claims_key = KEYS[3]
local index_from = KEYS[4]
local index_to = KEYS[5]
local audit_key = KEYS[6]
local fence = ARGV[1]
local version = ARGV[2]
local doc = ARGV[3]
local claim = ARGV[4]
local status = ARGV[5]
local id = ARGV[6]
local created = ARGV[7]
local audit_cap = ARGV[8]
local apart = ARGV[9] == '1'
local RECORD_FROM = 10
local AUDIT_FROM = after_record(ARGV, RECORD_FROM)

local refused, nv, _, claimed =
  check_record(apart, fence_key, task_key, nil, fence, version, claim)
if refused then return refused end
audit(audit_key, audit_cap, ARGV, AUDIT_FROM)
write_record(task_key, doc, nv, status, ARGV, RECORD_FROM, claim_fields(apart, claim, claimed))
if index_from ~= index_to then
  redis.call('ZREM', index_from, id)
  redis.call('ZADD', index_to, created, id)
end
return {nv, claim_attempt(apart, claims_key, claim, claimed)}
