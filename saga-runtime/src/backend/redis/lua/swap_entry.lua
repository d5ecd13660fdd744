-- Compare-and-set of a correlation entry's owner.
--
-- KEYS[1]: the correlation entry
-- ARGV[1]: the owner it must have
-- ARGV[2]: the new owner ('' = delete the entry)
-- Returns: 1 if done, else 0.
local entry = KEYS[1]
local expected = ARGV[1]
local owner = ARGV[2]

if redis.call('GET', entry) ~= expected then return 0 end
if owner == '' then redis.call('DEL', entry) else redis.call('SET', entry, owner) end
return 1
