-- The members of tasks whose retention ran out by the server's time.
--
-- KEYS[1]: the partition's expiring tasks (`<id>|<status>|<saga>`, by
--   when their retention runs out)
-- ARGV[1]: at most this many
-- Returns: the members due.
local expiring = KEYS[1]
local limit = ARGV[1]

local now = server_time()
return redis.call('ZRANGEBYSCORE', expiring, '-inf', now, 'LIMIT', 0, limit)
