-- Releases a lease (a task's, or a named one) if the token still holds
-- it: compare-and-delete.
--
-- KEYS[1]: the lock
-- ARGV[1]: the lease token
-- Returns: 1 if released, else 0.
local lock_key = KEYS[1]
local token = ARGV[1]

if redis.call('GET', lock_key) == token then return redis.call('DEL', lock_key) end
return 0
