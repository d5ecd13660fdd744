-- Counts the engines that run a process manager and announced themselves
-- within their TTL (announce.lua).
--
-- KEYS[1]: the process manager's runner set
-- Returns: how many.
local runners = KEYS[1]

local now = server_time()
return redis.call('ZCOUNT', runners, '(' .. now, '+inf')
