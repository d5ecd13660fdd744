-- Records an engine in the runner set of each process manager it runs
-- until its TTL runs out (or removes it), dropping expired members; a set
-- outlives its longest-lived member by a little, then expires.
--
-- KEYS[1..]: the runner sets (by when each member's announcement runs out)
-- ARGV[1]: the member
-- ARGV[2]: its time to live (ms; '' = leaving)
-- Returns: 1.
local member = ARGV[1]
local ttl_arg = ARGV[2]

local now = server_time()
for _, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if ttl_arg == '' then
    redis.call('ZREM', key, member)
  else
    local ttl = tonumber(ttl_arg)
    redis.call('ZADD', key, now + ttl, member)
  end
  -- The set outlives its longest-lived member (not the last announcer's
  -- TTL: a shorter one would cut the others' announcements).
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last == 2 then
    redis.call('PEXPIREAT', key, tonumber(last[2]) + (tonumber(ttl_arg) or 0) + 1000)
  end
end
return 1
