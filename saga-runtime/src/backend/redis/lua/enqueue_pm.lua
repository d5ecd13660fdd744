-- Enqueues process-manager messages on their partitions, or on the shared
-- stream while no engine reads partitions (pm_queue.lua).
--
-- KEYS[1..n]: the queue (a partition's) of each message
-- KEYS[n + 1]: the partition members (compact layout only)
-- ARGV[1..n]: the messages
-- Returns: how many were enqueued.
local n = #ARGV
local members = KEYS[n + 1]

local now = server_time()
local parts = partitioned(members, now)
for i = 1, n do
  redis.call('XADD', pm_queue(KEYS[i], parts), '*', 'payload', ARGV[i])
end
return n
