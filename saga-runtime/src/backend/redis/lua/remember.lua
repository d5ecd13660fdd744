-- Adds members to a set that expires (a tombstone: the message ids a
-- deleted instance handled).
--
-- KEYS[1]: the set
-- ARGV[1]: its time to live (ms)
-- ARGV[2..]: the members
-- Returns: 1, or 0 when there was no member to add.
local set = KEYS[1]
local ttl = ARGV[1]
local MEMBERS_FROM = 2

if #ARGV < MEMBERS_FROM then return 0 end
redis.call('SADD', set, unpack(ARGV, MEMBERS_FROM))
redis.call('PEXPIRE', set, ttl)
return 1
