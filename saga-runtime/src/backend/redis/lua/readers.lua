-- Renews (or removes) a backend among the saga readers of a cluster and
-- drops the expired ones: each reader watches the saga partitions `p`
-- with `p % n == rank` (see `watch.rs`).
--
-- KEYS[1]: the saga readers (by when each membership runs out)
-- ARGV[1]: the member
-- ARGV[2]: its time to live (ms; '' = leaving)
-- Returns: {its rank by name, how many readers there are} ({0, n} when
-- leaving).
local readers = KEYS[1]
local member = ARGV[1]
local ttl = ARGV[2]

local now = server_time()
redis.call('ZREMRANGEBYSCORE', readers, '-inf', now)
if ttl == '' then
  redis.call('ZREM', readers, member)
  return {0, redis.call('ZCARD', readers)}
end
redis.call('ZADD', readers, now + tonumber(ttl), member)
local members = redis.call('ZRANGE', readers, 0, -1)
table.sort(members)
local rank = 0
for i, m in ipairs(members) do if m == member then rank = i - 1 end end
local last = redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', readers, tonumber(last[2]) + 1000)
return {rank, #members}
