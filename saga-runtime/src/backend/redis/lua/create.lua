-- Creates a task: its record, its index entries, its first message and the
-- start of its audit log. Nothing is written for a task that exists.
--
-- KEYS[1]: the task's record (a hash: doc, version, status; see record.lua)
-- KEYS[2]: the partition's index of the saga's tasks (all of them)
-- KEYS[3]: the partition's index of the saga's Pending tasks
-- KEYS[4]: the partition's queue
-- KEYS[5]: the task's audit log
-- ARGV[1]: the record (JSON, without the audit log), or its head
-- ARGV[2]: the task id
-- ARGV[3]: the first message's payload
-- ARGV[4]: when the task was created (ms): its score in the indexes
-- ARGV[5]: how many audit entries the log keeps
-- ARGV[6]: how many pairs of field and value follow (record.lua)
-- ARGV[7..]: those pairs, then the audit entries to append
-- Returns: the stored record {doc, version, apart} (read_record) when the
-- task exists already (nothing written), else nil.
local task_key = KEYS[1]
local index_all = KEYS[2]
local index_pending = KEYS[3]
local queue = KEYS[4]
local audit_key = KEYS[5]
local doc = ARGV[1]
local id = ARGV[2]
local payload = ARGV[3]
local created = ARGV[4]
local audit_cap = ARGV[5]
local RECORD_FROM = 6
local AUDIT_FROM = after_record(ARGV, RECORD_FROM)

local existing, stored_version, apart = read_record(task_key)
if existing then return {existing, stored_version, apart} end
-- `TaskStatus::Pending.as_str()` (a test checks that they agree).
write_record(task_key, doc, 1, 'Pending', ARGV, RECORD_FROM)
redis.call('ZADD', index_all, created, id)
redis.call('ZADD', index_pending, created, id)
redis.call('XADD', queue, '*', 'payload', payload)
audit(audit_key, audit_cap, ARGV, AUDIT_FROM)
return false
