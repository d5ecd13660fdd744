-- Creates a task: its record, its index entries, its first message and the
-- start of its audit log. Nothing is written for a task that exists.
--
-- KEYS[1]: the task's record (a hash: doc, version, status)
-- KEYS[2]: the partition's index of the saga's tasks (all of them)
-- KEYS[3]: the partition's index of the saga's Pending tasks
-- KEYS[4]: the partition's queue
-- KEYS[5]: the task's audit log
-- ARGV[1]: the record (JSON, without the audit log)
-- ARGV[2]: the task id
-- ARGV[3]: the first message's payload
-- ARGV[4]: when the task was created (ms): its score in the indexes
-- ARGV[5]: how many audit entries the log keeps
-- ARGV[6..]: the audit entries to append
-- Returns: the stored record when the task exists already (nothing
-- written), else nil.
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
local AUDIT_FROM = 6

local existing = redis.call('HGET', task_key, 'doc')
if existing then return existing end
-- `TaskStatus::Pending.as_str()` (a test checks that they agree).
redis.call('HSET', task_key, 'doc', doc, 'version', 1, 'status', 'Pending')
redis.call('ZADD', index_all, created, id)
redis.call('ZADD', index_pending, created, id)
redis.call('XADD', queue, '*', 'payload', payload)
audit(audit_key, audit_cap, ARGV, AUDIT_FROM)
return false
