-- Moves due process-manager timeouts onto their partitions' queues (the
-- shared one for an entry that does not decode, or while no engine reads
-- partitions: pm_queue.lua), each exactly once (ZREM and XADD in one
-- script). In the spread layout each partition has a schedule of its own,
-- whose timeouts are all for its instances: the second key is then the
-- partition's queue, and they all go there.
--
-- KEYS[1]: the schedule (by due time)
-- KEYS[2]: the shared process-manager queue (spread: the partition's)
-- KEYS[3]: the partition members (compact layout only)
-- ARGV[1]: now (ms): what is due
-- ARGV[2]: at most this many
-- ARGV[3]: the process-manager key prefix
-- ARGV[4]: how many partitions
-- Returns: how many moved.
local schedule = KEYS[1]
local queue = KEYS[2]
local members = KEYS[3]
local due_by = ARGV[1]
local limit = ARGV[2]
local pm_prefix = ARGV[3]
local partitions = ARGV[4]

local now = server_time()
local compact = members ~= nil
local parts = partitioned(members, now)
local due = redis.call('ZRANGEBYSCORE', schedule, '-inf', due_by, 'LIMIT', 0, limit)
for _, m in ipairs(due) do
  redis.call('ZREM', schedule, m)
  local ok, decoded = pcall(cjson.decode, m)
  local to = queue
  if compact and parts and ok and type(decoded) == 'table' then
    to = route(pm_prefix, tonumber(partitions), decoded)
  end
  redis.call('XADD', to, '*', 'payload', m)
end
return #due
