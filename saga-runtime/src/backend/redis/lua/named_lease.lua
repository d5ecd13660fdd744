-- Takes or renews a named lease (the janitor's, the timer poller's).
--
-- KEYS[1]: the lease
-- ARGV[1]: the lease token
-- ARGV[2]: the lease's time to live (ms)
-- Returns: 1 if the token holds the lease now, else 0.
local lease = KEYS[1]
local token = ARGV[1]
local ttl = ARGV[2]

local holder = redis.call('GET', lease)
if (not holder) or holder == token then
  redis.call('SET', lease, token, 'PX', ttl)
  return 1
end
return 0
